"""fo_jax: overlap tensor-parallel GEMMs with their collectives inside jax.shard_map.

    y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter")

returns exactly psum_scatter(x @ w, "tp", scatter_dimension=0, tiled=True) (or psum for
collective="all_reduce"). See README.md for what runs where today.
"""

import os as _os

# CUDA lazy module loading (the default) makes the first launch of any kernel wait for the
# kernels already running. fo_jax loads its own kernels before its first call, but XLA's and
# the CUDA libraries' kernels load on first use too, and on 4 H200s a batch of back-to-back
# copy-engine all-reduces right after 1000 reduce-scatters deadlocked that way (every GPU waiting
# for another while its host thread waited to load a kernel); with CUDA_MODULE_LOADING=EAGER it
# ran (benchmarks/NOTES.md §11). So fo_jax asks for eager loading unless the environment says
# otherwise: it takes effect when CUDA starts after `import fo_jax` (JAX starts it on first use).
# FO_JAX_KEEP_LAZY_LOADING=1 leaves the variable alone.
_keep_lazy = _os.environ.get("FO_JAX_KEEP_LAZY_LOADING") == "1"
if not _keep_lazy and "CUDA_MODULE_LOADING" not in _os.environ:
    _os.environ["CUDA_MODULE_LOADING"] = "EAGER"
    try:  # too late if JAX has started CUDA already
        from jax._src import xla_bridge as _xb

        if "cuda" in getattr(_xb, "_backends", {}):
            import warnings as _warnings

            _warnings.warn(
                "fo_jax was imported after JAX started CUDA with lazy module loading, which can "
                "deadlock overlapped calls on 4+ GPUs; set CUDA_MODULE_LOADING=EAGER before "
                "starting Python, or import fo_jax before using JAX", RuntimeWarning, stacklevel=2)
    except ImportError:
        pass

from fo_jax.config import OverlapConfig
from fo_jax.overlap import PathChoice, describe, matmul, overlapped_matmul
from fo_jax import ops, reference

__version__ = "0.1.0"

__all__ = [
    "OverlapConfig",
    "PathChoice",
    "describe",
    "matmul",
    "ops",
    "overlapped_matmul",
    "reference",
    "cuda_module_available",
]


def cuda_module_available() -> bool:
    """Whether the compiled CUDA extension (FFI handlers) can be loaded in this process."""
    from fo_jax import _cuda

    return _cuda.module_available()
