"""fo_jax: overlap tensor-parallel GEMMs with their collectives inside jax.shard_map.

    y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter")

returns exactly psum_scatter(x @ w, "tp", scatter_dimension=0, tiled=True) (or psum for
collective="all_reduce"). See README.md for what runs where today.
"""

# First: CUDA reads CUDA_DEVICE_MAX_CONNECTIONS when JAX creates its GPU contexts (_hw_queues.py).
from fo_jax import _hw_queues

_hw_queues.request_at_import()

from fo_jax.config import OverlapConfig  # noqa: E402
from fo_jax.overlap import PathChoice, describe, matmul, overlapped_matmul  # noqa: E402
from fo_jax import ops, reference  # noqa: E402
from fo_jax._version import __version__, build_info  # noqa: E402,F401

__all__ = [
    "OverlapConfig",
    "PathChoice",
    "build_info",
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
