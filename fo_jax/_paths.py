"""Which path an fo_jax call takes on the platform it runs on, and why: the choices behind
`fo_jax.describe`, the DEBUG log and the ops in fo_jax/overlap.py (whose docstring lists the
paths). Pure functions of the call's dtype, shape, config, platform and axis size; nothing here
traces or lowers."""

from __future__ import annotations

import dataclasses
from typing import Optional

from fo_jax import _checks, _cuda, _env, _gemm_choice, _plan, _transport, fp8
from fo_jax.config import OverlapConfig


@dataclasses.dataclass(frozen=True)
class PathChoice:
    """Which implementation a call takes on the platform it runs on, and why (`describe`)."""

    op: str
    path: str  # "reference", "xla" (plain XLA ops, where fo_jax's kernels would not gain) or "cuda"
    reason: str
    collective: Optional[str] = None
    axis_size: Optional[int] = None
    transport: Optional[str] = None  # overlapped_matmul on the "cuda" path: "copy_engine" | "nccl"
    platform: Optional[str] = None  # the platform the choice is for


CUDA_PLATFORMS = ("gpu", "cuda")


def _force_reference(config: Optional[OverlapConfig]) -> bool:
    return _env.force_reference() or bool(config is not None and config.force_reference)


def _cuda_blocker(dtype, m: int, n: int, k: int) -> Optional[str]:
    """Why the CUDA kernels cannot take this GEMM (m rows, per rank for reduce_scatter), or None."""
    if dtype not in _checks.CUDA_DTYPES:
        return f"{dtype} runs on the reference path (the CUDA kernels take bfloat16/float16)"
    if m == 0 or n == 0 or k == 0:
        return f"an empty GEMM (M={m}, N={n}, K={k}) runs on the reference path"
    if m % 8 or n % 8 or k % 8:
        return (f"the CUDA kernels need M (per rank for reduce_scatter), N and K multiples of 8; "
                f"got M={m}, N={n}, K={k}")
    if not _cuda.module_available():
        return _cuda.unavailable_reason()
    return None


def _xla_dot_reason(dtype, config, m: int, n: int, k: int, fast: bool = False) -> Optional[str]:
    """Why a plain GEMM x[m, k] @ w[k, n] runs as XLA's dot on CUDA devices, or None: where the
    measured table says XLA's dot is faster, unless the config names a tile configuration or
    forbids the fallback. fast: fp8 with fast accumulation."""
    if config is not None and (config.gemm_config is not None or not config.allow_fallback):
        return None
    return _gemm_choice.xla_dot_reason(m, n, k, dtype, fast)


def _off_cuda(op: str, config, platform: str, extra: dict) -> Optional[PathChoice]:
    """The reference path where fo_jax's kernels cannot run at all (forced, or not a CUDA
    platform), else None: the first question of every chooser."""
    if _force_reference(config):
        why = "forced (FO_JAX_FORCE_REFERENCE=1 or config.force_reference)"
        return PathChoice(op, "reference", why, **extra)
    if platform not in CUDA_PLATFORMS:
        return PathChoice(op, "reference", f"platform {platform!r}: the CUDA path runs only on "
                          "CUDA devices", **extra)
    return None


def overlap_gemm_seconds(dtype, config, collective: str, m: int, n: int, k: int) -> float:
    """The estimated GEMM time that decides whether an overlapped reduce-scatter or all-reduce
    on x[m, k] @ w[k, n] pays: _plan's bf16 estimate, divided by the fp8 kernel's speedup
    over bf16 (for the accumulation `config` asks for) when the operands are fp8."""
    t_gemm = _plan.estimate_seconds(collective, m, n, k)[0]
    return t_gemm / fp8.gemm_speedup_over_bf16(config) if fp8.is_fp8(dtype) else t_gemm


def _too_small(config, t_gemm: float, transport: Optional[str]) -> Optional[float]:
    """The GEMM-time floor an estimated GEMM of t_gemm seconds falls under (the overlap would not
    pay: _plan.MIN_GEMM_SECONDS*), or None; never with allow_fallback=False."""
    floor = (_plan.MIN_GEMM_SECONDS_COPY_ENGINE if transport == "copy_engine"
             else _plan.MIN_GEMM_SECONDS)
    if (config is None or config.allow_fallback) and t_gemm < floor:
        return floor
    return None


def _choose_gemm(op: str, dtype, config, m: int, n: int, k: int, platform: str,
                 plain: bool = False, **extra) -> PathChoice:
    """The path of fo_jax's GEMM on x[m, k] @ w[k, n]. plain: nothing needs fo_jax's kernel
    itself (fo_jax.matmul, an overlapped call over one device), so XLA's dot may take the GEMM;
    the overlap's producer must be fo_jax's kernel (it signals its tiles)."""
    extra = dict(extra, platform=platform)
    off = _off_cuda(op, config, platform, extra)
    if off is not None:
        return off
    blocker = _cuda_blocker(dtype, m, n, k)
    if blocker is not None:
        return PathChoice(op, "reference", blocker, **extra)
    why = _xla_dot_reason(dtype, config, m, n, k) if plain else None
    if why is not None:
        return PathChoice(op, "xla", why, **extra)
    return PathChoice(op, "cuda", "fo_jax's GEMM on CUDA devices", **extra)


def _choose_overlapped(dtype, config, m: int, n: int, k: int, platform: str, collective: str,
                       size: int) -> PathChoice:
    """The path of an overlapped call on x[m, k] and w[k, n] (m: rows of this rank's x; the GEMM
    has m / size rows for reduce_scatter, m * size for all_gather)."""
    op = "overlapped_matmul"
    extra = dict(collective=collective, axis_size=size)
    if size == 1:
        c = _choose_gemm(op, dtype, config, m, n, k, platform, plain=True, **extra)
        return dataclasses.replace(c, reason=f"axis of size 1, the collective is the identity: "
                                   f"{c.reason}")
    rows = m // size if collective == "reduce_scatter" else m * size if \
        collective == "all_gather" else m
    c = _choose_gemm(op, dtype, config, rows, n, k, platform, **extra)
    if c.path != "cuda":
        return c
    if collective == "all_gather":
        return _choose_all_gather(dtype, config, m, n, k, platform, size)
    transport, how = _transport.choose("fo_jax.overlapped_matmul", collective, size, dtype, m, n,
                                       k, config)
    t_gemm = overlap_gemm_seconds(dtype, config, collective, m, n, k)
    floor = _too_small(config, t_gemm, transport)
    if floor is not None:
        return PathChoice(op, "xla", (
            f"too small to gain from overlap (estimated GEMM {t_gemm * 1e6:.0f} us < "
            f"{floor * 1e6:.0f} us): plain XLA dot + collective"), transport=transport,
            platform=platform, **extra)
    return PathChoice(op, "cuda", f"fo_jax CUDA kernels on CUDA devices; {how}",
                      transport=transport, platform=platform, **extra)


def choose_fp8(op: str, config, m: int, n: int, k: int, platform: str,
               plain_nk: bool = False, **extra) -> PathChoice:
    """The path of an fp8 GEMM x[m, k] @ w[k, n]: fo_jax's fp8 kernel on CUDA devices, the
    dequantizing reference elsewhere. plain_nk: a plain GEMM (fo_jax.matmul) whose weight the
    caller stores [N, K] (w_transposed=True), which XLA's fp8 dot may then take where the
    measured table says it is faster for the call's accumulation (_gemm_choice.points_key; on a
    [K, N] weight XLA's fp8 dot was measured 1.3-3.2x slower, so fo_jax keeps those)."""
    extra = dict(extra, platform=platform)
    off = _off_cuda(op, config, platform, extra)
    if off is not None:
        return off
    blocker = fp8.blocker(m, n, k)
    if blocker is not None:
        return PathChoice(op, "reference", blocker, **extra)
    fast = _plan.fast_accumulation(fp8.FP8_DTYPE, config)
    why = _xla_dot_reason(fp8.FP8_DTYPE, config, m, n, k, fast) if plain_nk else None
    if why is not None:
        return PathChoice(op, "xla", why, **extra)
    return PathChoice(op, "cuda", f"fo_jax's fp8 GEMM{' with fast accumulation' if fast else ''}"
                      " on CUDA devices", **extra)


def _choose_fp8_overlapped(config, m: int, n: int, k: int, platform: str, collective: str,
                           size: int) -> PathChoice:
    """The path of an fp8 overlapped call on x[m, k] and w[k, n] (m: rows of this rank's x):
    for an all-gather, XLA's all_gather then fo_jax's fp8 GEMM on the gathered rows; otherwise,
    over more than one device, the overlapped pipeline with fo_jax's fp8 GEMM as its producer
    (the collective moves and sums the GEMM's bfloat16 output) on the transport that
    fo_jax/_transport.py picks; where the overlap would not pay (as for 16-bit calls, with the
    GEMM estimate scaled by the fp8 kernel's speed), fo_jax's fp8 GEMM then XLA's collective
    (path "cuda" without a transport); the dequantizing reference off CUDA."""
    extra = dict(collective=collective, axis_size=size)
    rows = {"reduce_scatter": m // size, "all_gather": m * size}.get(collective, m)
    c = choose_fp8("overlapped_matmul", config, rows, n, k, platform, **extra)
    if size == 1 or c.path != "cuda":
        return c
    if collective == "all_gather":
        return _choose_fp8_all_gather(config, c, m, n, k, platform, size)
    plain = (f"{c.reason}, then XLA's {collective} on its bfloat16 output")
    transport, how = _transport.choose("fo_jax.overlapped_matmul", collective, size, fp8.FP8_DTYPE,
                                       m, n, k, config)
    t_gemm = overlap_gemm_seconds(fp8.FP8_DTYPE, config, collective, m, n, k)
    floor = _too_small(config, t_gemm, transport)
    if floor is not None:
        return dataclasses.replace(c, reason=(
            f"{plain} (too small to gain from overlap: estimated fp8 GEMM {t_gemm * 1e6:.0f} us "
            f"< {floor * 1e6:.0f} us)"))
    return dataclasses.replace(c, reason=f"fo_jax's fp8 GEMM overlapped with the {collective} of "
                               f"its bfloat16 output; {how}", transport=transport)


def _choose_fp8_all_gather(config, c: PathChoice, m: int, n: int, k: int, platform: str,
                           size: int) -> PathChoice:
    """fo_jax/_fp8_all_gather.py's path for fp8 all_gather(x[m, k]) @ w[k, n] over `size` ranks
    (c: the fp8 GEMM's choice on the gathered rows): the overlapped all-gather where the 16-bit
    one would take it (opted in, the bands fit a consumer config, not too small) and x_scale is
    provably the same on every device; otherwise XLA's all_gather of the fp8 x, then the fp8
    GEMM. The scale's sharing is known to the call, not here: the reason names both."""
    plain = (f"XLA's all_gather of the fp8 x, then {c.reason}: one GEMM where x_scale is "
             "provably the same on every device (check_vma types: fo_jax.quantize_fp8(x, "
             "axis_name=...)), else one per device's rows")
    why_not, transport, how = _all_gather_overlap(fp8.FP8_DTYPE, config, m, n, k, size)
    if why_not is not None:
        return dataclasses.replace(c, reason=f"{plain} ({why_not})")
    return dataclasses.replace(c, transport=transport, reason=(
        f"with x_scale provably the same on every device (check_vma types: "
        f"fo_jax.quantize_fp8(x, axis_name=...)), {_OVERLAPPED_ALL_GATHER}; {how}, its consumer "
        f"GEMM fo_jax's fp8 kernel; otherwise {plain}"))


_OVERLAPPED_ALL_GATHER = ("fo_jax's overlapped all-gather (opted in: tested and timed on 2 "
                          "and 4 GPUs)")


def _all_gather_overlap(dtype, config, m: int, n: int, k: int, size: int) -> tuple:
    """(why the overlapped all-gather does not take all_gather(x[m, k]) @ w[k, n] over `size`
    ranks, or None; its transport and how it was chosen): it needs the opt-in, bands that fit a
    consumer config, and a GEMM long enough to gain."""
    if config is None or config.all_gather != "overlap":
        return ("the overlapped all-gather is opt-in (OverlapConfig(all_gather='overlap')): "
                "faster than this on the copy-engine transport, not on the NCCL transport",
                None, None)
    problem = _plan.all_gather_problem(dtype, m, n, k, size, config)
    if problem is not None:
        return problem, None, None
    transport, how = _transport.choose_all_gather("fo_jax.all_gather_matmul", size, config)
    t_gemm = _plan.estimate_seconds("all_gather", m * size, n, k)[0]
    # The floors of the other collectives: on the copy engine the GEMM keeps every SM here too
    # (4096x8192x2048, an estimated 176 us, gained 1.20x at TP=2 and 1.23x at TP=4); on NCCL,
    # whose overlapped all-gather loses even above the floor, the higher one.
    floor = _too_small(config, t_gemm, transport)
    if floor is not None:
        return (f"too small to gain from overlap (estimated GEMM {t_gemm * 1e6:.0f} us < "
                f"{floor * 1e6:.0f} us)", transport, how)
    return None, transport, how


def _choose_all_gather(dtype, config, m: int, n: int, k: int, platform: str,
                       size: int) -> PathChoice:
    """The CUDA path of all_gather(x[m, k]) @ w[k, n] over `size` ranks once fo_jax's kernels
    can take its GEMM: the overlapped pipeline where the config opts in and the shape fits,
    else XLA's all_gather then its dot (the pairing with the other ops' backward holds)."""
    op = "overlapped_matmul"
    extra = dict(collective="all_gather", axis_size=size, platform=platform)
    plain = "XLA's all_gather, then its dot"
    why_not, transport, how = _all_gather_overlap(dtype, config, m, n, k, size)
    if why_not is not None:
        return PathChoice(op, "xla", f"{plain}: {why_not}", transport=transport, **extra)
    return PathChoice(op, "cuda", f"{_OVERLAPPED_ALL_GATHER}; {how}", transport=transport,
                      **extra)


def _all_gather_config(config: Optional[OverlapConfig]) -> Optional[OverlapConfig]:
    """The config of a reduce-scatter's backward all-gather: the forward's opt-in only (its
    other fields describe the forward's GEMM)."""
    if config is None or config.all_gather is None:
        return None
    return OverlapConfig(all_gather=config.all_gather)
