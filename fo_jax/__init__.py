"""fo_jax: overlap tensor-parallel GEMMs with their collectives inside jax.shard_map.

    y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter")

returns exactly psum_scatter(x @ w, "tp", scatter_dimension=0, tiled=True) (psum for
collective="all_reduce", all_gather(x) @ w for collective="all_gather"). README.md says what runs
where; docs/ how it works.
"""

# First: CUDA reads CUDA_DEVICE_MAX_CONNECTIONS when JAX creates its GPU contexts (_hw_queues.py).
from fo_jax import _hw_queues

_hw_queues.request_at_import()

from fo_jax.config import OverlapConfig  # noqa: E402
from fo_jax.overlap import (  # noqa: E402
    PathChoice, all_gather_matmul, describe, matmul, overlapped_matmul)
from fo_jax import reference  # noqa: E402
from fo_jax.fp8 import quantize_fp8  # noqa: E402
from fo_jax._version import __version__, build_info  # noqa: E402,F401

__all__ = [
    "OverlapConfig",
    "PathChoice",
    "all_gather_matmul",
    "build_info",
    "describe",
    "matmul",
    "overlapped_matmul",
    "quantize_fp8",
    "reference",
    "cuda_module_available",
]


def cuda_module_available() -> bool:
    """Whether the compiled CUDA extension (FFI handlers) can be loaded in this process."""
    from fo_jax import _cuda

    return _cuda.module_available()
