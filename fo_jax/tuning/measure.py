"""GPU measurements of the tuner: the GEMM per wave at an SM budget, NCCL's time-vs-bytes curve.

fo_jax has no standalone collective entry, so the NCCL curve is derived: T_comm(bytes) =
T(overlapped call, one group, GEMM on all SMs) - T(the same signaling GEMM alone). With one group
the collective starts only when the GEMM has ended and then has every SM, so the difference is
the collective (plus its counter wait and launch) at exactly the bytes, NCCL communicator and CTA
bound the overlapped call uses; a short GEMM (K = 256) keeps the subtraction's noise small.
The curve alone misses how much a running GEMM slows NCCL beyond taking its SMs (on H200, TP=2,
16 or 24 free SMs gave almost no overlap where 32 did), and what each extra group costs. So real
overlapped calls of a calibration shape that is no benchmark shape (CALIB_OVERLAP) fit, once per
machine: the per-group gap from 2, 4 and 8 groups (model.fit_gap_and_factor), then per (SMs
left, CTA bound) a slowdown factor of the collective while the GEMM runs (model.fit_busy_factor).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from fo_jax import _plan
from fo_jax.bench import core as bench_core
from fo_jax.config import OverlapConfig
from fo_jax.tuning.model import (Candidate, CommCurve, GemmTiming, fit_busy_factor,
                                 fit_gap_and_factor, predict_seconds)

log = logging.getLogger("fo_jax")

SMS_FOR_NCCL = (8, 16, 24, 32)  # candidate SMs left to NCCL (GEMM runs on the rest)
NCCL_CTAS = (8, 16, 32)  # candidate NCCL CTA bounds; curves measured at each
GROUPS = (1, 2, 3, 4, 6, 8, 12, 16)
CALIB_ROWS = (1024, 4096, 16384)  # per-GPU M of the NCCL calibration, N = 8192, K = 256
CALIB_N, CALIB_K = 8192, 256
CALIB_OVERLAP = (6144, 8192, 2048)  # per-GPU M, N, K of the slowdown calibration
CALIB_GROUPS = 4
GAP_GROUPS = (4, 2, 8)  # group counts of the per-group gap fit (first: CALIB_GROUPS)
FAST = dict(reps=10, trials=3, warmup=2)  # tuning timings: 30 calls each, median of 3


def num_sms(device) -> int:
    """SM count of a CUDA device (jax's `core_count`; 132, an H100/H200 SXM, if unknown)."""
    count = getattr(device, "core_count", None)
    if not count:
        log.warning("fo_jax.tune: %s reports no core_count; assuming 132 SMs", device)
        return 132
    return int(count)


def gemm_timing(device, collective: str, m: int, n: int, k: int, tp: int, dtype,
                gemm_sms: int) -> GemmTiming:
    """Times fo_jax's signaling GEMM of one rank's [m, n] product alone on `gemm_sms` SMs."""
    from fo_jax import _cuda_ops  # noqa: PLC0415 (needs the CUDA module)

    batch = tp if collective == "reduce_scatter" else 1
    plan = _plan.plan_gemm("fo_jax.tune", dtype, m // batch, n, k, batch,
                           OverlapConfig(num_groups=1, sm_budget=gemm_sms), 1, gemm_sms)
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.device_put((jax.random.normal(ka, (m, k)) / k ** 0.5).astype(dtype), device)
    b = jax.device_put(jax.random.normal(kb, (k, n)).astype(dtype), device)
    f = jax.jit(lambda a, b: _cuda_ops.signaling_gemm(a, b, plan, batch, True)[0])
    seconds = bench_core.time_ms(f, a, b, **FAST) / 1e3
    tiles = batch * -(-(m // batch) // plan.tile_m) * -(-n // plan.tile_n)
    waves = -(-tiles // gemm_sms)
    return GemmTiming(gemm_sms, seconds / waves, plan.tile_m, plan.tile_n, seconds,
                      plan.config_name)


def overlapped_ms(mesh: Mesh, collective: str, operands: tuple, num_groups: int, gemm_sms: int,
                  nccl_max_ctas: int, **timing) -> float:
    """Time of one real overlapped_matmul call (the CUDA path forced: no small-call fallback)."""
    cfg = OverlapConfig(num_groups=num_groups, sm_budget=gemm_sms, nccl_max_ctas=nccl_max_ctas,
                        allow_fallback=False)
    f = bench_core.build(mesh, collective, "fo_jax", cfg)
    return bench_core.time_ms(f, *operands, **(timing or FAST))


def comm_points(mesh: Mesh, collective: str, nccl_max_ctas: int, total_sms: int, dtype,
                gemm_seconds: dict) -> list:
    """(bytes, seconds) of one collective call at each CALIB_ROWS size (see module docstring).

    `gemm_seconds` memoizes the GEMM-alone times (by collective and M) across CTA bounds.
    """
    tp = mesh.shape["tp"]
    itemsize = jnp.dtype(dtype).itemsize
    points = []
    for m in CALIB_ROWS:
        key = (collective, m)
        if key not in gemm_seconds:
            gemm_seconds[key] = gemm_timing(mesh.devices.flat[0], collective, m, CALIB_N, CALIB_K,
                                            tp, dtype, total_sms).seconds
        ops = bench_core.random_operands(mesh, m, CALIB_N, CALIB_K, dtype)
        t_all = overlapped_ms(mesh, collective, ops, 1, total_sms, nccl_max_ctas) / 1e3
        points.append((m * CALIB_N * itemsize, max(t_all - gemm_seconds[key], 1e-7)))
    return points


def fit_curve(points: list) -> CommCurve:
    return CommCurve.fit(points)


def _calib_predict(collective: str, tp: int, dtype, curves: dict, gemm: GemmTiming):
    m, n, _ = CALIB_OVERLAP
    batch = tp if collective == "reduce_scatter" else 1
    itemsize = jnp.dtype(dtype).itemsize

    def predict(cand: Candidate, gap: float, factor: float) -> float:
        return predict_seconds(cand, gemm, curves, m // batch, n, batch, itemsize,
                               latency_s=gap, busy_factor=factor)

    return predict


def gap_and_factor(mesh: Mesh, collective: str, sms_for_nccl: int, nccl_max_ctas: int,
                   total_sms: int, dtype, curves: dict, gemm: GemmTiming,
                   operands: tuple) -> tuple:
    """(gap s, factor, measured s per GAP_GROUPS) from real overlapped calls of the
    CALIB_OVERLAP shape at each of GAP_GROUPS (`gemm`: its GEMM timed on the same SMs)."""
    cands = [Candidate(g, sms_for_nccl, nccl_max_ctas) for g in GAP_GROUPS]
    measured = [overlapped_ms(mesh, collective, operands, c.num_groups,
                              total_sms - sms_for_nccl, nccl_max_ctas) / 1e3 for c in cands]
    predict = _calib_predict(collective, mesh.shape["tp"], dtype, curves, gemm)
    gap, factor = fit_gap_and_factor(measured, lambda i, g, f: predict(cands[i], g, f))
    return gap, factor, measured


def busy_factor(mesh: Mesh, collective: str, sms_for_nccl: int, nccl_max_ctas: int,
                total_sms: int, dtype, curves: dict, gemm: GemmTiming, operands: tuple,
                gap: float) -> tuple:
    """(factor, measured s, predicted s at factor 1) for one (SMs left, CTA bound) pair, from
    one real overlapped call of the CALIB_OVERLAP shape with CALIB_GROUPS groups."""
    cand = Candidate(CALIB_GROUPS, sms_for_nccl, nccl_max_ctas)
    measured = overlapped_ms(mesh, collective, operands, CALIB_GROUPS, total_sms - sms_for_nccl,
                             nccl_max_ctas) / 1e3
    predict = _calib_predict(collective, mesh.shape["tp"], dtype, curves, gemm)
    return (fit_busy_factor(measured, lambda f: predict(cand, gap, f)), measured,
            predict(cand, gap, 1.0))
