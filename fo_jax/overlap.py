"""The public ops: `overlapped_matmul` (GEMM + collective inside shard_map) and `matmul`.

Each call validates its input at trace time, picks a path (see `describe`), and logs the choice on
the "fo_jax" logger at DEBUG level. Paths:
  - "reference": XLA dot (fp32 accumulation) then psum / psum_scatter; exact definition.
  - "cuda": fo_jax's own kernels through XLA FFI (not built yet: see README 'Status').
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import jax

from fo_jax import _checks, reference
from fo_jax.config import OverlapConfig

log = logging.getLogger("fo_jax")


@dataclasses.dataclass(frozen=True)
class PathChoice:
    """Which implementation a call takes and why (returned by `describe`)."""

    op: str
    path: str  # "reference" or "cuda"
    reason: str
    collective: Optional[str] = None
    axis_size: Optional[int] = None


def _force_reference(config: Optional[OverlapConfig]) -> bool:
    return os.environ.get("FO_JAX_FORCE_REFERENCE", "") == "1" or bool(
        config is not None and config.force_reference)


def _choose_path(op: str, dtype, config: Optional[OverlapConfig], **extra) -> PathChoice:
    if _force_reference(config):
        why = "forced (FO_JAX_FORCE_REFERENCE=1 or config.force_reference)"
        return PathChoice(op, "reference", why, **extra)
    # The overlapped CUDA path is not implemented yet: every platform runs the reference.
    return PathChoice(op, "reference", "the CUDA overlap path is not implemented yet", **extra)


def _validate_overlapped(x, w, axis_name, collective, config) -> tuple:
    fn = "fo_jax.overlapped_matmul"
    dtype = _checks.check_operands(fn, x, w)
    _checks.check_collective(fn, collective)
    if config is not None and not isinstance(config, OverlapConfig):
        raise TypeError(f"{fn}: config must be a fo_jax.OverlapConfig or None, got {type(config)}")
    size = _checks.axis_size(fn, axis_name)
    if collective == "reduce_scatter":
        _checks.check_scatter_rows(fn, x.shape[0], size, axis_name)
    return dtype, size


def describe(x, w, *, axis_name: str, collective: str = "reduce_scatter",
             config: Optional[OverlapConfig] = None) -> PathChoice:
    """Says which path `overlapped_matmul` takes for these arguments (call it where you would
    call `overlapped_matmul`, i.e. inside shard_map; it validates the same way)."""
    dtype, size = _validate_overlapped(x, w, axis_name, collective, config)
    return _choose_path("overlapped_matmul", dtype, config, collective=collective, axis_size=size)


def overlapped_matmul(x: jax.Array, w: jax.Array, *, axis_name: str,
                      collective: str = "reduce_scatter",
                      config: Optional[OverlapConfig] = None) -> jax.Array:
    """GEMM followed by a collective over `axis_name`, for use inside `jax.shard_map`.

    Args:
      x: local shard [M, K_local] (bfloat16 or float16; float32 on the reference path).
      w: local shard [K_local, N], same dtype as x.
      axis_name: the mesh axis to reduce over (bound by an enclosing shard_map).
      collective: "reduce_scatter" returns
        `psum_scatter(x @ w, axis_name, scatter_dimension=0, tiled=True)`, shape [M / P, N];
        "all_reduce" returns `psum(x @ w, axis_name)`, shape [M, N].
      config: optional `OverlapConfig`.

    Returns:
      The reduced product in x's dtype, accumulated in float32.

    Raises:
      TypeError / ValueError at trace time for bad input (rank, shapes, dtypes, collective, an
      axis name not bound by shard_map, M not divisible by the axis size for reduce_scatter).
    """
    dtype, size = _validate_overlapped(x, w, axis_name, collective, config)
    choice = _choose_path("overlapped_matmul", dtype, config, collective=collective, axis_size=size)
    log.debug("fo_jax.overlapped_matmul x%s w%s %s over %r (size %d): path=%s (%s)",
              tuple(x.shape), tuple(w.shape), collective, axis_name, size, choice.path,
              choice.reason)
    return reference.overlapped_matmul(x, w, axis_name, collective)


def matmul(x: jax.Array, w: jax.Array, *, config: Optional[OverlapConfig] = None) -> jax.Array:
    """x @ w with float32 accumulation, in x's dtype (fo_jax's GEMM; no collective)."""
    fn = "fo_jax.matmul"
    dtype = _checks.check_operands(fn, x, w)
    choice = _choose_path("matmul", dtype, config)
    log.debug("fo_jax.matmul x%s w%s: path=%s (%s)", tuple(x.shape), tuple(w.shape), choice.path,
              choice.reason)
    return reference.matmul(x, w)
