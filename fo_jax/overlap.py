"""The public ops: `overlapped_matmul` (GEMM + collective inside shard_map) and `matmul`.

Each call validates its input at trace time, picks a path (see `describe`), and logs the choice on
the "fo_jax" logger at DEBUG level. Paths:
  - "reference": XLA dot (fp32 accumulation) then psum / psum_scatter; exact definition.
  - "xla": on CUDA, `x @ w` then the collective, as users write it (XLA's 16-bit GEMM accumulates
    in fp32 and rounds once, like the reference, without its extra conversion pass); taken by
    calls too small for the overlap to pay (see _plan.MIN_GEMM_SECONDS).
  - "cuda": fo_jax's own kernels through XLA FFI: the signaling GEMM, and for overlapped_matmul
    the counter-gated transport: copy-engine writes into the peers' memory (plus, for an
    all-reduce, SM stores of the summed bands into the peers' outputs) where possible, NCCL
    collectives otherwise (fo_jax/_transport.py). Chosen per lowering
    platform (jax.lax.platform_dependent): CUDA devices run it, other platforms run the
    reference.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Optional

import jax

from fo_jax import _checks, _cuda, _plan, _transport, reference
from fo_jax.autodiff import overlapped_matmul_vjp
from fo_jax.config import OverlapConfig

log = logging.getLogger("fo_jax")


@dataclasses.dataclass(frozen=True)
class PathChoice:
    """Which implementation a call takes and why (returned by `describe`)."""

    op: str
    path: str  # "reference", "xla" (plain XLA ops, for calls too small to gain) or "cuda"
    reason: str
    collective: Optional[str] = None
    axis_size: Optional[int] = None
    transport: Optional[str] = None  # overlapped_matmul on the "cuda" path: "copy_engine" | "nccl"


def _force_reference(config: Optional[OverlapConfig]) -> bool:
    return os.environ.get("FO_JAX_FORCE_REFERENCE", "") == "1" or bool(
        config is not None and config.force_reference)


def _cuda_blocker(dtype, m: int, n: int, k: int) -> Optional[str]:
    """Why the CUDA kernels cannot take this call (m: GEMM rows per rank), or None."""
    if dtype not in _checks.CUDA_DTYPES:
        return f"{dtype} runs on the reference path (the CUDA kernels take bfloat16/float16)"
    if m % 8 or n % 8 or k % 8:
        return (f"the CUDA kernels need M (per rank for reduce_scatter), N and K multiples of 8; "
                f"got M={m}, N={n}, K={k}")
    if not _cuda.module_available():
        return _cuda.unavailable_reason()
    return None


def _choose_path(op: str, dtype, config: Optional[OverlapConfig], m: int, n: int, k: int,
                 platform: Optional[str] = None, **extra) -> PathChoice:
    if _force_reference(config):
        why = "forced (FO_JAX_FORCE_REFERENCE=1 or config.force_reference)"
        return PathChoice(op, "reference", why, **extra)
    blocker = _cuda_blocker(dtype, m, n, k)
    if blocker is not None:
        return PathChoice(op, "reference", blocker, **extra)
    if platform is not None and platform not in ("gpu", "cuda"):
        return PathChoice(op, "reference", f"platform {platform!r}: the CUDA path runs only on "
                          "CUDA devices", **extra)
    how = ""
    if op == "overlapped_matmul":
        rows = m * extra["axis_size"] if extra["collective"] == "reduce_scatter" else m
        transport, how = _transport.choose("fo_jax.overlapped_matmul", extra["collective"],
                                           extra["axis_size"], dtype, rows, n, k, config)
        extra = dict(extra, transport=transport)
        how = f"; {how}"
        floor = (_plan.MIN_GEMM_SECONDS_COPY_ENGINE if transport == "copy_engine"
                 else _plan.MIN_GEMM_SECONDS)
        t_gemm = _plan.estimate_seconds(extra["collective"], rows, n, k)[0]
        if (config is None or config.allow_fallback) and t_gemm < floor:
            return PathChoice(op, "xla", (
                f"too small to gain from overlap (estimated GEMM {t_gemm * 1e6:.0f} us < "
                f"{floor * 1e6:.0f} us): plain XLA dot + collective on CUDA "
                "(reference elsewhere)"), **extra)
    return PathChoice(op, "cuda", "fo_jax CUDA kernels on CUDA devices (reference elsewhere)"
                      + how, **extra)


def _gemm_rows(x, collective: str, size: int) -> int:
    return x.shape[0] // size if collective == "reduce_scatter" else x.shape[0]


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
    return _choose_path("overlapped_matmul", dtype, config, _gemm_rows(x, collective, size),
                        w.shape[1], x.shape[1], platform=jax.default_backend(),
                        collective=collective, axis_size=size)


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
    fn = "fo_jax.overlapped_matmul"
    dtype, size = _validate_overlapped(x, w, axis_name, collective, config)
    m = _gemm_rows(x, collective, size)
    choice = _choose_path("overlapped_matmul", dtype, config, m, w.shape[1], x.shape[1],
                          collective=collective, axis_size=size)
    log.debug("%s x%s w%s %s over %r (size %d): path=%s (%s)", fn, tuple(x.shape),
              tuple(w.shape), collective, axis_name, size, choice.path, choice.reason)
    ref = functools.partial(reference.overlapped_matmul, axis_name=axis_name,
                            collective=collective)
    forward = ref
    if choice.path == "xla":
        plain = functools.partial(reference.plain_overlapped_matmul, axis_name=axis_name,
                                  collective=collective)

        def forward(x, w):
            return jax.lax.platform_dependent(x, w, cuda=plain, default=ref)

    if choice.path == "cuda":
        from fo_jax._cuda_ops import overlapped_matmul_cuda  # noqa: PLC0415 (needs the module)

        plan = _plan.plan_overlap(fn, collective, size, dtype, x.shape[0], w.shape[1],
                                  x.shape[1], config, choice.transport)
        log.debug("%s: plan: %s", fn, plan.describe())
        cuda = functools.partial(overlapped_matmul_cuda, axis_name=axis_name, plan=plan)

        def forward(x, w):
            return jax.lax.platform_dependent(x, w, cuda=cuda, default=ref)

    return overlapped_matmul_vjp(forward, x, w, axis_name, collective)


def matmul(x: jax.Array, w: jax.Array, *, config: Optional[OverlapConfig] = None) -> jax.Array:
    """x @ w with float32 accumulation, in x's dtype (fo_jax's GEMM; no collective)."""
    fn = "fo_jax.matmul"
    dtype = _checks.check_operands(fn, x, w)
    if config is not None and not isinstance(config, OverlapConfig):
        raise TypeError(f"{fn}: config must be a fo_jax.OverlapConfig or None, got {type(config)}")
    m, k, n = x.shape[0], x.shape[1], w.shape[1]
    choice = _choose_path("matmul", dtype, config, m, n, k)
    log.debug("%s x%s w%s: path=%s (%s)", fn, tuple(x.shape), tuple(w.shape), choice.path,
              choice.reason)
    if choice.path != "cuda":
        return reference.matmul(x, w)
    from fo_jax._cuda_ops import matmul_cuda  # noqa: PLC0415 (needs the module)

    plan = _plan.plan_matmul(fn, dtype, m, n, k, config)
    return jax.lax.platform_dependent(
        x, w, cuda=functools.partial(matmul_cuda, plan=plan), default=reference.matmul)
