"""The tuner: predict every candidate with the pipeline model, measure the best few, cache the
fastest.

Once per (GPU model, NCCL version, TP size, collective): NCCL curves per CTA bound, the per-group
gap and NCCL's slowdown next to a running GEMM per (SMs left, CTA bound) (see measure.py); cached.
Per shape the GEMM is timed at each candidate SM budget, all candidates are predicted, and only
the `top` predicted ones (plus the shape heuristic's choice, as a safety net) run for real. The
cache entry records predicted and measured times of every measured candidate.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import sys
from typing import Callable

import jax.numpy as jnp
from jax.sharding import Mesh

from fo_jax import _cuda, _plan
from fo_jax.bench import core as bench_core
from fo_jax.tuning import cache, measure
from fo_jax.tuning.model import Candidate, CommCurve, GemmTiming, predict_seconds


class Progress:
    """tqdm when installed, else a printed "[i/n] what" counter (on stderr)."""

    def __init__(self, total: int, desc: str = "fo_jax.tune"):
        self.total, self.n = total, 0
        try:
            from tqdm import tqdm  # noqa: PLC0415 (optional)

            self.bar = tqdm(total=total, desc=desc, file=sys.stderr)
        except ImportError:
            self.bar = None

    def step(self, what: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(what[:60])
            self.bar.update(1)
        else:
            print(f"[{self.n}/{self.total}] {what}", file=sys.stderr, flush=True)

    def skip(self, k: int) -> None:
        if k > 0:
            self.n += k
            if self.bar is not None:
                self.bar.update(k)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def steps_per_shape(top: int) -> int:
    """Progress steps of `tune_shape` (GEMM budgets, measured candidates, baseline)."""
    return len(measure.SMS_FOR_NCCL) + top + 2


def calibration_steps() -> int:
    """Progress steps of `calibrate` (curves, then one step per (SMs, CTAs) pair)."""
    return len(measure.NCCL_CTAS) * (1 + len(measure.SMS_FOR_NCCL))


def calibrate(mesh: Mesh, collective: str, total_sms: int, dtype, progress: Progress,
              recalibrate: bool = False) -> tuple:
    """({ctas: CommCurve}, {(sms_for_nccl, ctas): busy factor}, per-group gap in s) for this
    collective, from the cache or measured now (once per GPU model, NCCL version, TP size and
    collective)."""
    dev = mesh.devices.flat[0]
    nccl, tp = cache.nccl_version(), mesh.shape["tp"]
    curves, gemm_seconds = {}, {}
    for ctas in measure.NCCL_CTAS:
        key = cache.comm_key(dev.device_kind, nccl, collective, tp, ctas)
        hit = None if recalibrate else cache.get("comm", key)
        if hit is not None:
            curves[ctas] = CommCurve(float(hit["latency_s"]), float(hit["bandwidth"]))
            progress.step(f"{collective} NCCL curve c{ctas} (cached)")
            continue
        points = measure.comm_points(mesh, collective, ctas, total_sms, dtype, gemm_seconds)
        curve = measure.fit_curve(points)
        curves[ctas] = curve
        cache.update("comm", key, {"latency_s": curve.latency_s, "bandwidth": curve.bandwidth,
                                   "points": points, "date": datetime.date.today().isoformat()})
        progress.step(f"{collective} NCCL curve c{ctas}: {curve.latency_s * 1e6:.1f} us + "
                      f"{curve.bandwidth / 1e9:.0f} GB/s")
    factors, gemms, operands = {}, {}, None
    m, n, k = measure.CALIB_OVERLAP
    today = datetime.date.today().isoformat()

    def prepare(s: int) -> None:
        nonlocal operands
        if s not in gemms:
            gemms[s] = measure.gemm_timing(dev, collective, m, n, k, tp, dtype, total_sms - s)
        if operands is None:
            operands = bench_core.random_operands(mesh, m, n, k, dtype)

    # The anchor pair (most SMs and CTAs for NCCL) also fixes the per-group gap.
    s0, c0 = max(measure.SMS_FOR_NCCL), max(measure.NCCL_CTAS)
    key = cache.comm_key(dev.device_kind, nccl, collective, tp, c0) + f"|nccl_sms{s0}"
    hit = None if recalibrate else cache.get("comm", key)
    if hit is not None and "gap_s" in hit:
        gap, factors[(s0, c0)] = float(hit["gap_s"]), float(hit["busy_factor"])
        progress.step(f"{collective} per-group gap, slowdown s{s0} c{c0} (cached)")
    else:
        prepare(s0)
        gap, f, meas = measure.gap_and_factor(mesh, collective, s0, c0, total_sms, dtype, curves,
                                              gemms[s0], operands)
        factors[(s0, c0)] = f
        cache.update("comm", key, {"busy_factor": f, "gap_s": gap, "measured_s": meas,
                                   "groups": list(measure.GAP_GROUPS), "shape": [m, n, k],
                                   "date": today})
        progress.step(f"{collective} per-group gap {gap * 1e6:.1f} us, slowdown s{s0} c{c0}: "
                      f"x{f:.2f}")
    for ctas in measure.NCCL_CTAS:
        for s in measure.SMS_FOR_NCCL:
            if (s, ctas) == (s0, c0):
                continue
            key = cache.comm_key(dev.device_kind, nccl, collective, tp, ctas) + f"|nccl_sms{s}"
            hit = None if recalibrate else cache.get("comm", key)
            if hit is not None and hit.get("gap_s") == gap:
                factors[(s, ctas)] = float(hit["busy_factor"])
                progress.step(f"{collective} slowdown s{s} c{ctas} (cached)")
                continue
            prepare(s)
            f, meas, pred1 = measure.busy_factor(mesh, collective, s, ctas, total_sms, dtype,
                                                 curves, gemms[s], operands, gap)
            factors[(s, ctas)] = f
            cache.update("comm", key, {"busy_factor": f, "gap_s": gap, "measured_s": meas,
                                       "predicted_s_factor1": pred1, "shape": [m, n, k],
                                       "date": today})
            progress.step(f"{collective} slowdown s{s} c{ctas}: x{f:.2f}")
    return curves, factors, gap


def candidates(tile_rows: int) -> list:
    max_groups = int(_cuda.module().max_gemm_groups())
    groups = [g for g in measure.GROUPS if g <= min(tile_rows, max_groups)]
    return [Candidate(g, s, c) for g in groups for s in measure.SMS_FOR_NCCL
            for c in measure.NCCL_CTAS]


def rank(timings: dict, curves: dict, factors: dict, gap: float, m: int, n: int, batch: int,
         itemsize: int) -> list:
    """[(predicted seconds, Candidate)] for every candidate, fastest first."""
    any_t = next(iter(timings.values()))
    out = []
    for cand in candidates(-(-m // any_t.tile_m)):
        gemm = timings[cand.sms_for_nccl]
        f = factors.get((cand.sms_for_nccl, cand.nccl_max_ctas), 1.0)
        out.append((predict_seconds(cand, gemm, curves, m, n, batch, itemsize, latency_s=gap,
                                    busy_factor=f), cand))
    out.sort(key=lambda pc: pc[0])
    return out


def pick_top(ranked: list, top: int, per_pair: int = 2) -> list:
    """The `top` best predicted candidates, at most `per_pair` of one (SMs, CTAs) pair, so that
    a model error in that dimension cannot hide the better pair."""
    out, count = [], {}
    for _, c in ranked:
        pair = (c.sms_for_nccl, c.nccl_max_ctas)
        if count.get(pair, 0) < per_pair:
            out.append(c)
            count[pair] = count.get(pair, 0) + 1
        if len(out) == top:
            break
    return out


def _heuristic(collective: str, m: int, n: int, k: int) -> Candidate:
    # (The heuristic's all-reduce group weights are not a tuner candidate: the tuner measures
    # equal groups with the heuristic's counts and budgets.)
    d = _plan.heuristic_defaults(collective, m, n, k)
    return Candidate(d["num_groups"], d["sms_for_nccl"], d["nccl_max_ctas"])


def tune_shape(mesh: Mesh, collective: str, m: int, n: int, k: int, dtype, curves: dict,
               factors: dict, gap: float, total_sms: int, top: int, progress: Progress,
               log: Callable[[str], None] = lambda s: None) -> dict:
    """Tunes one per-GPU shape x[m, k] @ w[k, n]; stores and returns the cache entry."""
    tp = mesh.shape["tp"]
    dev = mesh.devices.flat[0]
    batch = tp if collective == "reduce_scatter" else 1
    itemsize = jnp.dtype(dtype).itemsize
    timings: dict[int, GemmTiming] = {}
    for s in measure.SMS_FOR_NCCL:
        timings[s] = measure.gemm_timing(dev, collective, m, n, k, tp, dtype, total_sms - s)
        progress.step(f"{collective} {m}x{n}x{k} GEMM on {total_sms - s} SMs: "
                      f"{timings[s].seconds * 1e3:.3f} ms")
    ranked = rank(timings, curves, factors, gap, m // batch, n, batch, itemsize)
    predicted = {c: t for t, c in ranked}
    chosen = pick_top(ranked, top)
    heur = _heuristic(collective, m, n, k)
    if heur not in predicted:  # e.g. more groups than tile-rows: the nearest grid point
        heur = min(predicted, key=lambda c: (c.sms_for_nccl != heur.sms_for_nccl,
                                             c.nccl_max_ctas != heur.nccl_max_ctas,
                                             abs(c.num_groups - heur.num_groups)))
    if heur not in chosen:
        chosen.append(heur)
    ops = bench_core.random_operands(mesh, m, n, k, dtype)
    measured = []
    for cand in chosen:
        row = {**dataclasses.asdict(cand), "predicted_ms": predicted[cand] * 1e3,
               "heuristic": cand == heur}
        try:
            row["measured_ms"] = measure.overlapped_ms(mesh, collective, ops, cand.num_groups,
                                                       total_sms - cand.sms_for_nccl,
                                                       cand.nccl_max_ctas)
            row["error"] = (row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"]
        except Exception as e:  # noqa: BLE001 (a failing candidate must not end the tuning)
            row["measured_ms"], row["error"], row["failure"] = None, None, repr(e)[:300]
        measured.append(row)
        progress.step(f"{collective} {m}x{n}x{k} {cand.label()}: "
                      f"{row['measured_ms'] or float('nan'):.3f} ms")
    progress.skip(top + 1 - len(chosen))  # keeps the bar's total exact
    baseline = bench_core.time_ms(bench_core.build(mesh, collective, "baseline"), *ops,
                                  **measure.FAST)
    progress.step(f"{collective} {m}x{n}x{k} jax.baseline: {baseline:.3f} ms")
    ok = [r for r in measured if r["measured_ms"] is not None]
    if not ok:
        raise RuntimeError(f"every candidate failed for {collective} {m}x{n}x{k}: {measured}")
    best = min(ok, key=lambda r: r["measured_ms"])
    entry = {"num_groups": best["num_groups"], "sms_for_nccl": best["sms_for_nccl"],
             "nccl_max_ctas": best["nccl_max_ctas"], "predicted_ms": best["predicted_ms"],
             "measured_ms": best["measured_ms"], "baseline_ms": baseline,
             "gemm_config": timings[best["sms_for_nccl"]].config_name,
             "candidates": measured, "date": datetime.date.today().isoformat(),
             "median_abs_error": statistics.median(abs(r["error"]) for r in ok)}
    key = cache.entry_key(dev.device_kind, cache.nccl_version(), collective, m, n, k, dtype, tp)
    cache.update("entries", key, entry)
    label = Candidate(best["num_groups"], best["sms_for_nccl"], best["nccl_max_ctas"]).label()
    log(f"{collective} {m}x{n}x{k}: chose {label}")
    return entry
