#!/usr/bin/env python3
"""Fits fo_jax's GEMM choice (fo_jax/_gemm_choice.py) on a sweep of one GPU model and writes its
table, fo_jax/_gemm_tables/<model>.py (fo_jax uses it on that model; fo_jax/_gemm_tables says
which table a model without one uses).

Input: JSON Lines of `benchmarks/bench_gemm_sweep.py --configs all` (rows "fo_jax.gemm" with a
"config", "xla.dot", "fo_jax.matmul"; one or more files, one device).

Timing drift: the sweep times every method of a shape in the same traces, so a kernel timed early
in a trace can run at a higher clock than one timed late (docs/gemm_performance.md, 'The choice').
The sweep times fo_jax.matmul's configuration twice (as "fo_jax.matmul" and as its
"fo_jax.gemm" row); where the two readings differ by more than DRIFT, the shape's rows are not
comparable across methods: such shapes are left out of the fit and of XLA_POINTS (and reported).

Fit: for each dtype with per-config rows and each configuration, the coefficients
(a, b, b_avg, g) >= 0 of _gemm_choice.features are fitted by least squares on the relative error
(every subset of non-negative coefficients is solved and the best feasible one kept: 16 tiny
solves). XLA_POINTS: per shape, the measured ratio ms(xla.dot) / ms(the configuration the fitted
model picks), what fo_jax.matmul runs there; float16 without per-config rows takes bfloat16's
choice, its time scaled by the float16 / bfloat16 ratio of the default configuration.

Report: per shape and in geomean the old default, the fitted choice, the best measured
configuration (oracle) and fo_jax.matmul once prefer_xla_dot hands shapes to XLA's dot; the same
with the shape held out of the fit and of XLA_POINTS (leave one shape out, one layer (N, K) out,
one M out: how well the model predicts shapes it has not seen), the predicate's sensitivity to
_gemm_choice.RADIUS and the threshold; the shapes still under 0.95x where fo_jax must run its own
kernel (the overlap's producer); the configurations never chosen (rows of
csrc/kernels/gemm_configs.py that only cost build time).

Re-measured points (--recheck PLAIN.jsonl ...): sweeps without per-config rows
(`bench_gemm_sweep.py` without --configs, best with --own: xla.dot, fo_jax.matmul and
fo_jax.own per shape, so each trace holds few methods and the drift above cannot build up), run
with a table fitted on the same config sweep. Where such a sweep timed the GEMM fo_jax.matmul
runs under this fit (its configuration and split: the fo_jax.own row, or fo_jax.matmul where it
did not hand the shape to XLA), ms(xla.dot) / ms(that GEMM) is a direct reading of it against
XLA's dot; the geometric mean of a shape's readings replaces its XLA_POINTS entry, and the
report lists every replaced point.

fp8 points (--fp8 FP8.jsonl ...): sweeps of `bench_gemm_sweep.py --dtype float8_e4m3fn`. One
XLA_POINTS entry per accumulation (fp8_points): fo_jax's fp32-promoting kernel against XLA's fp8
dot at precision HIGHEST, and its fast-accumulating kernel against XLA's default fp8 dot
(_gemm_choice.points_key), so that a handover keeps the accumulation the call asked for. The
same sweeps' unsplit per-config rows (--configs all) fit an fp8 tile model per accumulation
(fp8_models: MODEL entries under the points' keys, over the rows fo_jax may pick for that
accumulation), with MODEL_MIN_M the smallest M fitted: below it the kernel library's rules pick.

Re-measured fp32-promoting kernels (--fp8-fresh FRESH.jsonl ...): sweeps with --own and --configs
naming every promoting row fo_jax may pick, taken after a change to those kernels. At each shape
they timed, the promotion's tile-model trace comes from them alone (the --fp8 sweeps timed older
kernels there), and its XLA_POINTS entry is ms(XLA at HIGHEST) / ms(the row the fitted model picks)
in that trace. A row named by --fp8-fresh-stale was timed there in a form no longer built: its time
at the shape is that of the newest other sweep of the shape that timed it in the form built, scaled
by the two traces' times of XLA at HIGHEST (its ratio to XLA stays the one measured in one trace).
ROW is stale in every fresh sweep, ROW@COMMIT only in the fresh sweeps of that commit (a later
fresh sweep timed the row again in its current form). Elsewhere the --fp8 sweeps' readings stay;
for fast accumulation the fresh sweeps are more readings, like --fp8's.

Usage: python3 dev/fit_gemm_table.py SWEEP.jsonl [...] [--recheck PLAIN.jsonl ...]
         [--fp8 FP8.jsonl ...] [--fp8-fresh FRESH.jsonl ... [--fp8-fresh-stale ROW ...]]
         [--out fo_jax/_gemm_tables/<model>.py] [--report REPORT.md] [--xla-threshold 0.98]
         [--sms 132]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from typing import Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "csrc", "kernels"))
import gemm_configs  # noqa: E402  (the kernel table: a script there, importable)

from fo_jax import _gemm_choice, _gemm_tables  # noqa: E402


def compiled_configs(fp8: bool = False) -> list:
    """The rows of csrc/kernels/gemm_configs.py as dicts (the module's gemm_configs() shape): the
    16-bit rows, or with fp8 the fp8 rows (fast_accum: the fast-accumulation rows; measure_only:
    rows kept to be measured, which no choice picks)."""
    measure_only = {c.name for c in gemm_configs.MEASURE_ONLY_CONFIGS}
    return [dict(name=c.name, tile_m=c.tile_m, tile_n=c.tile_n, tile_k=c.tile_k,
                 cluster_m=c.cluster_m, cluster_n=c.cluster_n, pingpong=c.pingpong,
                 takes_addends=c.name in gemm_configs.SOURCE_CONFIGS, fast_accum=c.fast_accum,
                 measure_only=c.name in measure_only)
            for c in gemm_configs.TABLE if (c.name in gemm_configs.FP8_NAMES) == fp8]


def load(paths: list) -> list:
    rows = []
    for p in paths:
        with open(p) as fh:
            rows += [json.loads(line) for line in fh if line.strip()]
    rows = [r for r in rows if r.get("suite") == "gemm_sweep" and r.get("ms")]
    devices = {r["device"] for r in rows}
    if len(devices) != 1:
        sys.exit(f"fit_gemm_table.py: need rows of one device, got {sorted(devices)}")
    return rows


def nnls_relative(x: np.ndarray, t: np.ndarray) -> tuple:
    """argmin over coef >= 0 of sum(((x @ coef) - t) / t)^2, exactly (every support tried);
    (coef, rms relative error)."""
    a = x / t[:, None]
    ones = np.ones_like(t)
    best, best_err = np.zeros(x.shape[1]), math.inf
    for size in range(1, x.shape[1] + 1):
        for support in itertools.combinations(range(x.shape[1]), size):
            cols = list(support)
            sol, *_ = np.linalg.lstsq(a[:, cols], ones, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(x.shape[1])
            coef[cols] = sol
            err = float(np.sqrt(np.mean((a @ coef - 1.0) ** 2)))
            if err < best_err:
                best, best_err = coef, err
    return best, best_err


DRIFT = 0.02  # the two readings of one kernel may differ by this much (relative) and count as one
FLOOR = 0.95  # the issue's "no shape below" line
# Held-out schemes of the cross-validation: (name, what one held-out group is, its key).
CV_SCHEMES = (
    ("shape", "one shape", lambda s: s),
    ("layer", "the 5-6 shapes of one (N, K)", lambda s: s[1:]),
    ("M", "the 11 shapes of one M", lambda s: s[0]),
)


def shapes_of(rows: list, dtype: str) -> dict:
    """{(M, N, K): {"xla": ms, "default": (config, ms), "configs": {name: ms}}}."""
    out: dict = {}
    for r in rows:
        if r["dtype"] != dtype:
            continue
        d = out.setdefault((r["M"], r["N"], r["K"]), {"configs": {}})
        if r["method"] == "xla.dot":
            d["xla"] = r["ms"]
        elif r["method"] == "fo_jax.matmul":
            d["default"] = (r.get("config"), r["ms"])
        elif r["method"] == "fo_jax.gemm":
            d["configs"][r["config"]] = r["ms"]
    return out


def drift(d: dict) -> Optional[float]:
    """ms(fo_jax.gemm row) / ms(fo_jax.matmul row) of the configuration fo_jax.matmul ran: one
    kernel timed twice in the same traces; None without both rows."""
    name, ms = d.get("default") or (None, None)
    return d["configs"][name] / ms if name in d["configs"] and ms else None


def drifted(shapes: dict) -> dict:
    """{shape: drift} of the shapes whose two readings of one kernel differ by more than DRIFT."""
    out = {}
    for s, d in shapes.items():
        r = drift(d)
        if r is not None and abs(r - 1.0) > DRIFT:
            out[s] = r
    return out


def fit_dtype(shapes: dict, configs: list, sms: int) -> tuple:
    """({config: coefficients}, {config: rms relative error}) for one dtype's per-config rows
    (keys: shapes (M, N, K), or traces (M, N, K, file index): one point each)."""
    params, errors = {}, {}
    for cfg in configs:
        pts = [(s, d["configs"][cfg["name"]]) for s, d in shapes.items()
               if cfg["name"] in d["configs"]]
        if len(pts) < 8:  # too few shapes to fit four coefficients
            continue
        x = np.array([_gemm_choice.features(cfg, *s[:3], 1, sms) for s, _ in pts])
        t = np.array([ms * 1e3 for _, ms in pts])
        coef, err = nnls_relative(x, t)
        params[cfg["name"]] = tuple(float(f"{c:.6g}") for c in coef)
        errors[cfg["name"]] = err
    return params, errors


def geomean(values: list) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def table(header: list, lines: list) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in ln) + " |" for ln in lines]) + "\n"


def chosen_ms(d: dict, name: Optional[str], bf16: Optional[dict]) -> Optional[float]:
    """Measured ms of configuration `name` at a shape (d: shapes_of's entry); a dtype without
    per-config rows (bf16: bfloat16's entry of the shape) scales bfloat16's time by this dtype's
    / bfloat16's time of the default configuration (its "fo_jax.gemm" row where there is one: it
    sits at the same point of the traces as the other configurations' rows)."""
    if name is None:
        return None
    ms = d["configs"].get(name)
    if ms is None and bf16 is not None and "default" in d and name in bf16["configs"]:
        ref = bf16["configs"].get(d["default"][0]) or (bf16.get("default") or (None, None))[1]
        if ref:
            ms = bf16["configs"][name] * d["default"][1] / ref
    return ms


def choice(configs: list, params: dict, shape: tuple, sms: int) -> Optional[str]:
    idx = _gemm_choice.choose(configs, params, *shape, 1, sms)
    return configs[idx]["name"] if idx is not None else None


def xla_points(shapes: dict, configs: list, params: dict, sms: int, bf16: Optional[dict],
               skip) -> list:
    """[(M, N, K, ms(xla.dot) / ms(fitted choice))] of the shapes not in `skip`."""
    points = []
    for s, d in sorted(shapes.items()):
        if s in skip or not d.get("xla"):
            continue
        ms = chosen_ms(d, choice(configs, params, s, sms), (bf16 or {}).get(s))
        if ms:
            points.append((*s, round(d["xla"] / ms, 4)))
    return points


def own_choice(configs: list, params: dict, shape: tuple, sms: int) -> Optional[str]:
    """The name fo_jax.matmul's own GEMM runs under this fit (choose_split: NAME, or
    NAME/kS when split along K), as the sweep's "config" field writes it."""
    picked = _gemm_choice.choose_split(configs, params, *shape, sms)
    if picked is None:
        return None
    index, splits = picked
    return configs[index]["name"] + (f"/k{splits}" if splits > 1 else "")


def recheck_points(points: list, rows: list, dt: str, configs: list, params: dict,
                   sms: int, threshold: float) -> tuple:
    """(points with the re-measured ratios, markdown) for dtype `dt`: `rows` are plain sweeps'
    (module docstring, "Re-measured points"). A reading is ms(xla.dot) / ms(fo_jax's own GEMM)
    from one trace: its "fo_jax.own" row, and its "fo_jax.matmul" row where that ran its own
    GEMM, each only if the GEMM is the one this fit chooses (NAME/kS included); a shape's point
    is the geometric mean of its readings over the files and both rows."""
    traces = {}
    for r in rows:
        if r["dtype"] == dt and r.get("ms"):
            key = (r["M"], r["N"], r["K"], r.get("commit"), r.get("date"))
            traces.setdefault(key, {})[r["method"]] = r
    readings = {}
    for key, d in traces.items():
        xla = d.get("xla.dot")
        if not xla:
            continue
        s = key[:3]
        want = own_choice(configs, params, s, sms)
        for method in ("fo_jax.own", "fo_jax.matmul"):
            mine = d.get(method)
            if mine and mine.get("config") == want:
                readings.setdefault(s, []).append((xla["ms"] / mine["ms"], mine["config"]))
    current = {p[:3]: p[3] for p in points}
    lines = []
    for s, got in sorted(readings.items()):
        ratio = round(geomean([r for r, _ in got]), 4)
        old = current.get(s)
        current[s] = ratio
        lines.append([f"{s[0]}x{s[1]}x{s[2]}", got[0][1], str(len(got)),
                      f"{old:.3f}" if old is not None else "-", f"{ratio:.3f}"])
    if not lines:
        return points, ""
    new = [(*s, r) for s, r in sorted(current.items())]
    # What fo_jax.matmul gets on the re-measured shapes with the new points: XLA's dot (ratio 1)
    # where they hand the shape over, else the readings of its own GEMM.
    after = []
    for s, got in readings.items():
        est = _gemm_choice.estimate_from(new, *s)
        after.append(1.0 if est is not None and est < threshold
                     else geomean([r for r, _ in got]))
    text = (f"\n### {dt}: re-measured points\n\n{len(lines)} shapes where a plain sweep timed "
            f"this fit's choice (fo_jax.own, or fo_jax.matmul running it); their XLA_POINTS "
            f"ratio is the geometric mean of those readings:\n\n"
            + table(["M x N x K", "config", "readings", "config sweep", "plain sweeps"], lines)
            + "\nWith them, predicted on those shapes (ratio 1 where fo_jax.matmul hands the "
            "shape to XLA's dot):\n\n"
            + summary("fo_jax.matmul", after))
    return new, text


# The fp8 accumulations (--fp8: XLA_POINTS and tile models under these keys): {key: (whether
# fast, fo_jax's methods that run its kernel, preferred first; XLA's fp8 dot of the same
# accumulation)}. fo_jax.own* (--own) never hand the shape to XLA.
FP8_POINTS = {
    _gemm_choice.points_key("float8_e4m3fn"):
        (False, ("fo_jax.own", "fo_jax.matmul"), "xla.dot_fp32acc"),
    _gemm_choice.points_key("float8_e4m3fn", fast=True):
        (True, ("fo_jax.own_fast", "fo_jax.matmul_fast"), "xla.dot"),
}


PROMOTION = _gemm_choice.points_key("float8_e4m3fn")


def fp8_candidates(configs: list, fast: bool) -> list:
    """The fp8 rows (compiled_configs(fp8=True)) a choice may pick for the accumulation: its
    own, but the measure-only ones."""
    return [c for c in configs if c["fast_accum"] == fast and not c["measure_only"]]


def fp8_points(paths: list, threshold: float, replaced: Optional[dict] = None) -> tuple:
    """({key: ((M, N, K, ratio), ...)}, markdown) from fp8 sweeps (`bench_gemm_sweep.py --dtype
    float8_e4m3fn`, module docstring "fp8"): per shape and accumulation, ms(XLA's fp8 dot of that
    accumulation) / ms(fo_jax's fp8 kernel of that accumulation) from one trace: its fo_jax.own
    row (--own), else fo_jax.matmul's where that ran fo_jax's kernel (its config is not
    "xla.dot"); a shape's point is the geometric mean over the files. The points read the tiles
    the sweeps ran (the kernel library's rules where the sweep predates the fp8 models).
    `replaced`: {key: {(M, N, K): (ratio, config)}}, readings that stand alone for their shapes
    (fresh_promotion)."""
    traces = {}
    for i, path in enumerate(paths):
        for r in load([path]):
            if r["dtype"] == "float8_e4m3fn":
                traces.setdefault((r["M"], r["N"], r["K"], i), {})[r["method"]] = r
    readings: dict = {key: {} for key in FP8_POINTS}
    for (m, n, k, _), d in traces.items():
        for key, (_, methods, xla) in FP8_POINTS.items():
            kernel = [d[f] for f in methods if f in d and d[f].get("config") != "xla.dot"]
            if kernel and d.get(xla):
                a = kernel[0]
                readings[key].setdefault((m, n, k), []).append((d[xla]["ms"] / a["ms"],
                                                                a["config"]))
    for key, got in (replaced or {}).items():
        readings[key].update({s: [reading] for s, reading in got.items()})
    points = {key: tuple((*s, round(geomean([r for r, _ in got]), 4))
                         for s, got in sorted(got_all.items()))
              for key, got_all in readings.items() if got_all}
    lines, after = [], {key: [] for key in points}
    for s in sorted({s for got in readings.values() for s in got}):
        cells = [f"{s[0]}x{s[1]}x{s[2]}"]
        for key in FP8_POINTS:
            got = readings[key].get(s)
            if not got:
                cells += ["-", "-", "-", "-"]
                continue
            ratio = geomean([r for r, _ in got])
            est = _gemm_choice.estimate_from(points[key], *s)
            to_xla = est is not None and est < threshold
            # The shape's own point left out: how the neighbours decide a shape never measured.
            held = _gemm_choice.estimate_from([p for p in points[key] if p[:3] != s], *s)
            held_xla = held is not None and held < threshold
            after[key].append((s[0], 1.0 if to_xla else ratio, ratio,
                               1.0 if held_xla else ratio))
            cells += [got[0][1], f"{ratio:.3f}", "XLA" if to_xla else "fo_jax",
                      "XLA" if held_xla else "fo_jax"]
        lines.append(cells)
    if not lines:
        return {}, ""
    text = ("\n## float8_e4m3fn: XLA_POINTS per accumulation\n\n"
            "Ratios are ms(XLA's fp8 dot) / ms(fo_jax's fp8 kernel) of the same accumulation "
            "(fp32 promotion: fo_jax.matmul against XLA at precision HIGHEST; fast: "
            "fo_jax.matmul_fast against XLA's default), from "
            + ", ".join(os.path.basename(p) for p in paths) + "; \"runs\": what fo_jax.matmul "
            f"runs with a weight stored [N, K] once the points are in the table (XLA where the "
            f"estimate is below {threshold}; \"held out\": the same with the shape's own point "
            "left out, as for a shape never measured).\n\n"
            + table(["M x N x K", "config", "promotion", "runs", "held out", "fast config", "fast",
                     "runs", "held out"], lines) + "\n")
    for key, values in after.items():
        for label, keep in (("", lambda m: True), (", M >= 4096", lambda m: m >= 4096)):
            text += summary(f"{key}{label}: fo_jax's kernel",
                            [r for m, _, r, _ in values if keep(m)])
            text += summary(f"{key}{label}: fo_jax.matmul with the points (1 where XLA takes "
                            "the shape)", [a for m, a, _, _ in values if keep(m)])
            text += summary(f"{key}{label}: the same, each shape's own point held out",
                            [h for m, _, _, h in values if keep(m)])
    return points, text


def fp8_traces(paths: list) -> dict:
    """{(M, N, K, file index): {"configs": {unsplit config: ms}, method: (config, ms)}} of the fp8
    sweeps' traces ("configs" empty where the sweep ran without --configs)."""
    traces: dict = {}
    for i, path in enumerate(paths):
        for r in load([path]):
            if r["dtype"] != "float8_e4m3fn":
                continue
            d = traces.setdefault((r["M"], r["N"], r["K"], i), {"configs": {}})
            if r["method"] == "fo_jax.gemm" and "/k" not in r["config"]:
                d["configs"][r["config"]] = r["ms"]
            elif r["method"] != "fo_jax.gemm":
                d[r["method"]] = (r.get("config"), r["ms"])
    return traces


def held_out_choices(traces: dict, configs: list, sms: int, key) -> dict:
    """{trace: the pick of the model fitted without the trace's group (the traces whose shapes
    share its `key`)}: one fit per group."""
    groups: dict = {}
    for t in traces:
        groups.setdefault(key(t[:3]), []).append(t)
    out = {}
    for held in groups.values():
        params = fit_dtype({u: d for u, d in traces.items() if u not in held}, configs, sms)[0]
        out.update({t: choice(configs, params, t[:3], sms) for t in held})
    return out


def fresh_promotion(traces: dict, fresh: set, stale: dict) -> dict:
    """The promotion's traces (fp8_traces of the --fp8 and --fp8-fresh sweeps; `fresh`: the
    file indices of the latter): at a shape a fresh sweep timed, its traces alone. `stale`:
    {file index: rows timed there in a form no longer built}; each is taken from the newest
    other trace of the shape that timed it, in the form built, beside XLA at HIGHEST (or left
    out), scaled by the two traces' XLA times: a row's ratio to XLA is read within one trace,
    as everywhere here, and two runs differ by a few percent at one shape."""
    _, _, xla = FP8_POINTS[PROMOTION]
    fresh_shapes = {t[:3] for t in traces if t[3] in fresh}
    out = {t: d for t, d in traces.items() if t[:3] not in fresh_shapes}
    for t, d in traces.items():
        if t[3] not in fresh:
            continue
        gone = stale.get(t[3], set())
        rows = {c: ms for c, ms in d["configs"].items() if c not in gone}
        for c in gone:
            other = [u for u in traces if u[:3] == t[:3] and u != t
                     and c not in stale.get(u[3], set())
                     and c in traces[u]["configs"] and traces[u].get(xla)]
            if other and d.get(xla):
                u = traces[max(other, key=lambda u: u[3])]
                rows[c] = u["configs"][c] * d[xla][1] / u[xla][1]
        out[t] = {**d, "configs": rows}
    return out


def stale_rows(entries: list, paths: list, fresh: set, names: set) -> dict:
    """--fp8-fresh-stale's ROW and ROW@COMMIT as {fresh file index: stale rows}."""
    commit_of = {i: {str(r.get("commit")) for r in load([paths[i]])} for i in fresh}
    out: dict = {}
    for entry in entries:
        row, _, commit = entry.partition("@")
        if row not in names:
            sys.exit(f"fit_gemm_table.py: --fp8-fresh-stale names no fp8 row: {row}")
        files = {i for i in fresh if not commit or commit in commit_of[i]}
        if not files:
            sys.exit(f"fit_gemm_table.py: --fp8-fresh-stale {entry}: no --fp8-fresh sweep of "
                     f"commit {commit}")
        for i in files:
            out.setdefault(i, set()).add(row)
    return out


def fp8_fresh_traces(fp8: list, fresh: list, stale_entries: list, configs: list) -> tuple:
    """(the --fp8 and --fp8-fresh paths in that order, the indices of the fresh ones, {PROMOTION:
    the promotion's traces (fresh_promotion)}, empty without fresh sweeps), as main() reads
    them; `stale_entries`: --fp8-fresh-stale's ROW and ROW@COMMIT, `configs`: the fp8 rows."""
    paths = list(fp8) + list(fresh)
    indices = set(range(len(fp8), len(paths)))
    if not fresh:
        return paths, indices, {}
    stale = stale_rows(stale_entries, paths, indices, {c["name"] for c in configs})
    return paths, indices, {PROMOTION: fresh_promotion(fp8_traces(paths), indices, stale)}


def fresh_points(traces: dict, fresh: set, configs: list, params: dict, sms: int) -> dict:
    """{(M, N, K): (ms(XLA at HIGHEST) / ms(the fitted pick), pick)} of the fresh traces of the
    promotion (fresh_promotion) that timed the pick: what fo_jax's kernel runs there now."""
    _, _, xla = FP8_POINTS[PROMOTION]
    candidates = fp8_candidates(configs, fast=False)
    out = {}
    for t, d in sorted(traces.items()):
        if t[3] not in fresh or not d.get(xla):
            continue
        pick = choice(candidates, params, t[:3], sms)
        if pick in d["configs"]:
            out[t[:3]] = (d[xla][1] / d["configs"][pick], pick)
    return out


def fp8_models(paths: list, configs: list, sms: int,
               traces_of: Optional[dict] = None) -> tuple:
    """({key: {config: coefficients}}, {key: smallest M fitted}, markdown): per accumulation, the
    tile model of its rows (the fast-accumulation rows, or the fp32-promoting rows but the
    measure-only ones) fitted on the unsplit per-config rows of fp8 sweeps with --configs all. The
    smallest M is the model's floor: below it the sweeps timed no per-config rows, and the kernel
    library's rules pick (_gemm_choice.select_fp8_config). Report: per shape the rule's pick (its
    fo_jax.own row in any sweep that ran --own), the fitted pick and the
    best row, each as ms(XLA's fp8 dot of the accumulation) / ms(row) from the same trace; the
    fitted pick again with each shape (its layer, its M) held out of the fit. `traces_of`:
    {key: traces} in place of the sweeps' own for that accumulation (fresh_promotion)."""
    all_traces = fp8_traces(paths)
    models, floors, text = {}, {}, ""
    for key, (fast, (own, _), xla) in FP8_POINTS.items():
        traces = (traces_of or {}).get(key, all_traces)
        # The rule's pick per shape, as any --own trace recorded it (one pick, or none).
        picks: dict = {}
        for t, d in traces.items():
            if own in d:
                picks.setdefault(t[:3], set()).add(d[own][0])
        rules = {s: next(iter(p)) for s, p in picks.items() if len(p) == 1}
        candidates = fp8_candidates(configs, fast)
        mine = {t: d for t, d in traces.items() if d.get(xla) and d["configs"]
                and all(c["name"] in d["configs"] for c in candidates)}
        params = fit_dtype(mine, candidates, sms)[0]
        if not params:
            continue
        models[key], floors[key] = params, min(t[0] for t in mine)

        lines, cols = [], {"fitted": [], "best": []}
        paired = {"rule": [], "fitted": [], "best": []}  # the shapes with the rule's pick known
        held = {name: [] for name, _, _ in CV_SCHEMES}
        held_picks = {name: held_out_choices(mine, candidates, sms, group)
                      for name, _, group in CV_SCHEMES}
        for t, d in sorted(mine.items()):
            x = d[xla][1]
            rule = rules.get(t[:3])
            rule_ratio = x / d["configs"][rule] if rule in d["configs"] else None
            fitted = choice(candidates, params, t[:3], sms)
            best = min(d["configs"], key=lambda c: d["configs"][c] if c in params else math.inf)
            cols["fitted"].append(x / d["configs"][fitted])
            cols["best"].append(x / d["configs"][best])
            if rule_ratio:
                paired["rule"].append(rule_ratio)
                paired["fitted"].append(cols["fitted"][-1])
                paired["best"].append(cols["best"][-1])
            for name in held:
                held[name].append(x / d["configs"][held_picks[name][t]])
            lines.append([f"{t[0]}x{t[1]}x{t[2]}", rule or "-",
                          f"{rule_ratio:.3f}" if rule_ratio else "-", fitted,
                          f"{x / d['configs'][fitted]:.3f}", best, f"{x / d['configs'][best]:.3f}"])
        text += (f"\n## {key}: the tile model of fo_jax's own fp8 kernels\n\n"
                 f"Fitted on the unsplit per-config rows of {len(mine)} traces (M >= "
                 f"{floors[key]}: below it the kernel library's rule keeps picking) over "
                 f"{', '.join(sorted(params))}. Ratios: ms({xla}) / ms(the row) in the same trace; "
                 f"\"rule\": the row the library's rule picks (the shape's {own} row in any "
                 "of the sweeps).\n\n"
                 + table(["M x N x K", "rule", "ratio", "fitted", "ratio", "best row", "ratio"],
                         lines) + "\n"
                 + "".join(summary(f"{key}, the shapes whose rule pick is known: {what}",
                                   paired[col]) for col, what in (
                     ("rule", "the library's rule"), ("fitted", "the fitted model"),
                     ("best", "the best row per shape")))
                 + summary(f"{key}: the fitted model", cols["fitted"])
                 + summary(f"{key}: the best row per shape", cols["best"])
                 + "".join(summary(f"{key}: the fitted model, {what} held out", held[name])
                           for name, what, _ in CV_SCHEMES))
    return models, floors, text


def after_xla(ratio: float, estimate: Optional[float], threshold: float) -> float:
    """fo_jax.matmul's ratio once prefer_xla_dot is on: 1 where it hands the shape to XLA (the
    same dot), else fo_jax's measured ratio."""
    return 1.0 if estimate is not None and estimate < threshold else ratio


def cross_validate(shapes: dict, configs: list, sms: int, bf16: Optional[dict], skip,
                   key, fit_shapes: Optional[dict] = None) -> dict:
    """Each group of shapes (same `key`) held out in turn: the model fitted and XLA_POINTS built
    without it (and without `skip`), then applied to it. {shape: {"choice", "ratio", "points",
    "errors": [predicted / measured - 1 per configuration], "regret": ms(choice) / ms(best)}};
    fit_shapes: the per-config rows to fit on (default `shapes`; float16 borrows bfloat16's)."""
    fit_shapes = shapes if fit_shapes is None else fit_shapes
    groups: dict = {}
    for s in shapes:
        if s not in skip and shapes[s].get("xla"):
            groups.setdefault(key(s), []).append(s)
    out = {}
    for held in groups.values():
        train = {s: d for s, d in fit_shapes.items() if s not in held and s not in skip}
        params, _ = fit_dtype(train, configs, sms)
        points = xla_points(shapes, configs, params, sms, bf16, set(skip) | set(held))
        for s in held:
            d = shapes[s]
            name = choice(configs, params, s, sms)
            ms = chosen_ms(d, name, (bf16 or {}).get(s))
            if not ms:
                continue
            own = fit_shapes.get(s, {"configs": {}})["configs"]
            errors = [_gemm_choice.predicted_us(c, params[c["name"]], *s, 1, sms)
                      / (own[c["name"]] * 1e3) - 1.0
                      for c in configs if c["name"] in params and c["name"] in own]
            best = min(own.values()) if own else None
            out[s] = {"choice": name, "ratio": d["xla"] / ms, "points": points,
                      "errors": errors, "regret": own[name] / best if best and name in own
                      else None}
    return out


def stats(values: list) -> str:
    values = [v for v in values if v]
    if not values:
        return "-"
    return (f"{geomean(values):.3f}x, min {min(values):.3f}x, "
            f"{sum(v < FLOOR for v in values)} under {FLOOR}x")


def summary(what: str, values: list) -> str:
    values = [v for v in values if v]
    if not values:
        return f"- {what}: -\n"
    return f"- {what}: geomean {stats(values)} (of {len(values)})\n"


def fmt(name: Optional[str], ratio: Optional[float]) -> str:
    return f"{name} {ratio:.3f}" if name and ratio else "-"


def report_dtype(dt: str, shapes: dict, configs: list, params: dict, fit_err: dict, sms: int,
                 bf16: Optional[dict], skip: dict, threshold: float,
                 fit_shapes: Optional[dict]) -> tuple:
    """(XLA_POINTS entries, markdown) of one dtype."""
    points = xla_points(shapes, configs, params, sms, bf16, skip)
    est = {p[:3]: _gemm_choice.estimate_from(points, *p[:3]) for p in points}
    loo = cross_validate(shapes, configs, sms, bf16, skip, CV_SCHEMES[0][2], fit_shapes)
    lines, rec = [], {}
    for s, d in sorted(shapes.items()):
        if not d.get("xla"):
            continue
        xla = d["xla"]
        old = d.get("default")
        name = choice(configs, params, s, sms)
        ms = chosen_ms(d, name, (bf16 or {}).get(s))
        best = min(d["configs"], key=d["configs"].get) if d["configs"] else None
        e = _gemm_choice.estimate_from(points, *s) if s in skip else est.get(s)
        r = {"old": xla / old[1] if old else None, "fitted": xla / ms if ms else None,
             "best": xla / d["configs"][best] if best else None, "choice": name}
        r["after"] = after_xla(r["fitted"], e, threshold) if r["fitted"] else None
        held = loo.get(s)
        if held:
            e_held = _gemm_choice.estimate_from(held["points"], *s)
            held["after"] = after_xla(held["ratio"], e_held, threshold)
        rec[s] = r
        mark = " (drift)" if s in skip else ""
        lines.append([f"{s[0]}x{s[1]}x{s[2]}{mark}", fmt(old[0] if old else None, r["old"]),
                      fmt(name, r["fitted"]), fmt(best, r["best"]),
                      "XLA" if r["after"] == 1.0 else f"{r['after']:.3f}" if r["after"] else "-",
                      fmt(held["choice"], held["ratio"]) if held else "-",
                      ("XLA" if held["after"] == 1.0 else f"{held['after']:.3f}") if held
                      else "-"])
    out = [f"\n## {dt}\n\n"]
    if skip:
        out.append(
            f"Timing drift: at {len(skip)} shape{'s' * (len(skip) != 1)} the two readings of "
            f"fo_jax.matmul's configuration (its fo_jax.gemm row / its fo_jax.matmul row) "
            f"differ by more than "
            f"{DRIFT:.0%}: " + ", ".join(f"{s[0]}x{s[1]}x{s[2]} {r:.3f}"
                                         for s, r in sorted(skip.items()))
            + ". Their rows are not comparable across methods: marked (drift) below, left out "
            "of the fit, of XLA_POINTS, of the cross-validation and of the clean summaries.\n\n")
    if fit_err:
        out.append("Fit (rms relative error of the predicted time on the shapes it was fitted "
                   "on): " + ", ".join(f"{n} {e:.1%}" for n, e in fit_err.items()) + "\n\n")
    out.append(
        "Ratios are ms(xla.dot) / ms(fo_jax): above 1, fo_jax is faster. \"matmul after fit\": "
        "what fo_jax.matmul gets with the table (XLA: prefer_xla_dot hands the shape to XLA's "
        "dot, ratio 1); \"held out\": the same with the shape left out of the fit and of "
        "XLA_POINTS.\n\n")
    out.append(table(["M x N x K", "old default", "fitted choice", "best measured config",
                      "matmul after fit", "held out: choice", "held out: matmul after fit"],
                     lines))
    clean = [s for s in rec if s not in skip]
    for label, group in (("clean shapes", clean), ("all shapes, drift included", list(rec))):
        if label != "clean shapes" and not skip:
            continue
        out.append(f"\nIn geomean over the {label} (ratio to xla.dot):\n\n")
        out.append(summary("old default", [rec[s]["old"] for s in group])
                   + summary("fitted choice (fo_jax's own kernel: the overlap's producer)",
                             [rec[s]["fitted"] for s in group])
                   + summary("best measured configuration (oracle)",
                             [rec[s]["best"] for s in group])
                   + summary("better of the fitted choice and XLA's dot per shape (the bound "
                             "of a perfect predicate)",
                             [max(rec[s]["fitted"], 1.0) for s in group if rec[s]["fitted"]])
                   + summary(f"fo_jax.matmul after the fit (prefer_xla_dot below {threshold})",
                             [rec[s]["after"] for s in group]))
    if loo:
        out.append(summary("held out one at a time: fitted choice",
                           [v["ratio"] for v in loo.values()])
                   + summary("held out one at a time: fo_jax.matmul after the fit",
                             [v["after"] for v in loo.values()]))
    below = [s for s in clean if rec[s]["fitted"] and rec[s]["fitted"] < FLOOR]
    out.append(f"\nUnder {FLOOR}x on fo_jax's own kernel (the overlap's producer, fitted choice, "
               f"clean shapes): {len(below)}: " + ", ".join(
                   f"{s[0]}x{s[1]}x{s[2]} {rec[s]['fitted']:.3f}" for s in below) + "\n")
    if fit_shapes is None:  # per-config rows of this dtype: the model itself is validated
        out.append(cv_section(shapes, configs, sms, bf16, skip, threshold, fit_shapes, rec))
    picked = {r["choice"] for r in rec.values()}
    unused = [c["name"] for c in configs if c["name"] not in picked]
    out.append(f"\nNever chosen on these shapes: {', '.join(unused) or 'none'}.\n")
    return points, "".join(out)


def cv_section(shapes, configs, sms, bf16, skip, threshold, fit_shapes, rec) -> str:
    """Cross-validation: held-out groups of each scheme, and the predicate's sensitivity."""
    out = [f"\n### Cross-validation\n\nEach group held out in turn: the model refitted and "
           f"XLA_POINTS rebuilt without it, then applied to it (clean shapes only; RADIUS "
           f"{_gemm_choice.RADIUS}, threshold {threshold}). Regret: ms(choice) / ms(best "
           f"measured config). Prediction error: predicted / measured time - 1 over every "
           f"configuration at the held-out shapes.\n\n"]
    lines, runs = [], {}
    for name, what, key in CV_SCHEMES:
        cv = cross_validate(shapes, configs, sms, bf16, skip, key, fit_shapes)
        runs[name] = cv
        errs = [e for v in cv.values() for e in v["errors"]]
        rms = math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else float("nan")
        regret = [v["regret"] for v in cv.values() if v["regret"]]
        same = sum(v["choice"] == rec[s]["choice"] for s, v in cv.items())
        none = sum(_gemm_choice.estimate_from(v["points"], *s) is None for s, v in cv.items())
        after = [after_xla(v["ratio"], _gemm_choice.estimate_from(v["points"], *s), threshold)
                 for s, v in cv.items()]
        lines.append([f"{name}: {what}", stats([v["ratio"] for v in cv.values()]),
                      f"{geomean(regret):.3f}, max {max(regret):.3f}" if regret else "-",
                      f"{rms:.1%}", f"{same} of {len(cv)}", f"{none}", stats(after)])
    out.append(table(["held out", "fitted choice", "regret", "prediction error (rms)",
                      "same choice as the full fit", "no measured neighbour",
                      "fo_jax.matmul after the fit"], lines))
    out.append("\nThe predicate's sensitivity (fo_jax.matmul after the fit, held out as above, "
               "by RADIUS and threshold):\n\n")
    lines = []
    for radius in (1.0, 1.5, 2.0, 3.0):
        for th in (0.95, threshold, 1.0) if threshold not in (0.95, 1.0) else (0.95, 1.0):
            cells = []
            for name, _, _ in CV_SCHEMES:
                cv = runs[name]
                cells.append(stats([after_xla(v["ratio"], _gemm_choice.estimate_from(
                    v["points"], *s, radius=radius), th) for s, v in cv.items()]))
            lines.append([f"{radius}", f"{th}", *cells])
    out.append(table(["RADIUS", "threshold", *[f"held out: {n}" for n, _, _ in CV_SCHEMES]],
                     lines))
    return "".join(out)


def _source_parts(source: str) -> list:
    """`source` ("a, b, c") as pieces that concatenate back to it, one file each (short lines)."""
    files = source.split(", ")
    return [f + (", " if i < len(files) - 1 else "") for i, f in enumerate(files)]


def write_table(path: str, device: str, source: str, model: dict, points: dict,
                threshold: float, floors: Optional[dict] = None) -> None:
    lines = [
        '"""GEMM choice table (fo_jax/_gemm_choice.py), fitted on the GPU.',
        "",
        "Written by dev/fit_gemm_table.py; do not edit (rerun the script on a new sweep).",
        '"""',
        "",
        f"DEVICE = {device!r}",
        "SOURCE = (" + "".join(f"\n    {part!r}" for part in _source_parts(source)) + "\n)",
        "# {dtype: {config name: (a, b, b_avg, g)}}, us: coefficients of "
        "fo_jax/_gemm_choice.features.",
        "MODEL: dict = {",
    ]
    for dt, params in model.items():
        lines.append(f"    {dt!r}: {{")
        lines += [f"        {name!r}: {tuple(coef)!r}," for name, coef in params.items()]
        lines.append("    },")
    lines.append("}")
    if floors:
        lines += ["# {MODEL key: the smallest M it was fitted at}: below it the kernel library's "
                  "rule picks.",
                  "MODEL_MIN_M: dict = {" + ", ".join(f"{k!r}: {v!r}" for k, v in floors.items())
                  + "}"]
    lines += ["# {dtype: ((M, N, K, ms(xla.dot) / ms(fo_jax's chosen config)), ...)}, as measured.",
              "XLA_POINTS: dict = {"]
    for dt, pts in points.items():
        lines.append(f"    {dt!r}: (")
        lines += [f"        {p!r}," for p in pts]
        lines.append("    ),")
    lines += ["}",
              f"XLA_THRESHOLD = {threshold!r}  # prefer XLA's dot where the estimated ratio "
              "is below this", ""]
    with open(path, "w") as fh:
        fh.write("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="bench_gemm_sweep.py JSON Lines")
    ap.add_argument("--out", default=None,
                    help="the table to write (default: fo_jax/_gemm_tables/<model of the rows>.py)")
    ap.add_argument("--report", default=None, help="also write the report (markdown) here")
    ap.add_argument("--recheck", nargs="*", default=[],
                    help="plain sweeps (no --configs) whose ratios replace XLA_POINTS entries")
    ap.add_argument("--fp8", nargs="*", default=[],
                    help="fp8 sweeps (--dtype float8_e4m3fn) whose ratios become fp8 XLA_POINTS")
    ap.add_argument("--fp8-fresh", nargs="*", default=[],
                    help="fp8 sweeps (--own, --configs naming every promoting row) of changed "
                    "fp32-promoting kernels: at their shapes the promotion reads them alone")
    ap.add_argument("--fp8-fresh-stale", nargs="*", default=[],
                    help="ROW or ROW@COMMIT: promoting rows whose --fp8-fresh times (all, or "
                    "the sweeps of COMMIT) are of a form no longer built: those come from the "
                    "newest other sweep of the shape that timed the form built")
    ap.add_argument("--xla-threshold", type=float, default=0.98)
    ap.add_argument("--sms", type=int, default=None,
                    help="SMs of the swept GPU (default: the rows' 'sms', else 132)")
    args = ap.parse_args()

    rows = load(args.sweeps)
    configs = compiled_configs()
    device = rows[0]["device"]
    out = args.out or os.path.join(ROOT, "fo_jax", "_gemm_tables",
                                   _gemm_tables.module_name(device) + ".py")
    sms = args.sms or next((r["sms"] for r in rows if r.get("sms")), _gemm_choice.DEFAULT_SMS)
    dtypes = sorted({r["dtype"] for r in rows})
    by_dtype = {dt: shapes_of(rows, dt) for dt in dtypes}
    skip_of = {dt: drifted(by_dtype[dt]) for dt in dtypes}
    model, fit_err = {}, {}
    for dt in dtypes:
        clean = {s: d for s, d in by_dtype[dt].items() if s not in skip_of[dt]}
        params, errors = fit_dtype(clean, configs, sms)
        if params:
            model[dt], fit_err[dt] = params, errors
    if not model:
        sys.exit("fit_gemm_table.py: no per-config rows (run the sweep with --configs all)")
    commits = sorted({str(r.get("commit")) for r in rows})
    report = [f"# GEMM choice fitted on {device} ({sms} SMs)\n\n"
              f"Written by `dev/fit_gemm_table.py` (its docstring says how) from "
              + ", ".join(os.path.basename(p) for p in args.sweeps)
              + f" (commit {', '.join(commits)})"
              + (", XLA_POINTS re-measured from " + ", ".join(
                  os.path.basename(p) for p in args.recheck) if args.recheck else "")
              + f"; the table it wrote: {os.path.relpath(out, ROOT)}.\n"]
    points_all = {}
    for dt in dtypes:
        borrowed = dt not in model
        params = model.get(dt) or model.get("bfloat16", {})
        bf16 = by_dtype.get("bfloat16") if borrowed else None
        # A dtype without per-config rows takes bfloat16's drift flags too: its times are
        # bfloat16's, scaled.
        skip = {**skip_of[dt], **(skip_of.get("bfloat16", {}) if borrowed else {})}
        points, text = report_dtype(dt, by_dtype[dt], configs, params, fit_err.get(dt, {}),
                                    sms, bf16, skip, args.xla_threshold,
                                    by_dtype.get("bfloat16") if borrowed else None)
        if args.recheck:
            points, rechecked = recheck_points(points, load(args.recheck), dt, configs, params,
                                               sms, args.xla_threshold)
            text += rechecked
        if points:
            points_all[dt] = tuple(points)
            report.append(text)
    if args.fp8_fresh and not args.fp8:
        sys.exit("fit_gemm_table.py: --fp8-fresh re-measures shapes of the --fp8 sweeps: name both")
    if args.fp8:
        fp8_paths = args.fp8 + args.fp8_fresh
        if {r["device"] for r in load(fp8_paths)} != {device}:
            sys.exit(f"fit_gemm_table.py: the --fp8 sweeps are not of {device}")
        fp8_configs = compiled_configs(fp8=True)
        _, fresh, traces_of = fp8_fresh_traces(args.fp8, args.fp8_fresh, args.fp8_fresh_stale,
                                               fp8_configs)
        replaced = {}
        fp8_model, floors, model_text = fp8_models(fp8_paths, fp8_configs, sms, traces_of)
        if args.fp8_fresh and PROMOTION in fp8_model:
            replaced[PROMOTION] = fresh_points(traces_of[PROMOTION], fresh, fp8_configs,
                                               fp8_model[PROMOTION], sms)
        fp8, text = fp8_points(fp8_paths, args.xla_threshold, replaced)
        if args.fp8_fresh:
            text += (f"\nAt the {len(replaced.get(PROMOTION, {}))} shapes of "
                     + ", ".join(os.path.basename(p) for p in args.fp8_fresh)
                     + f", {PROMOTION}'s point and tile-model trace read those sweeps alone (the "
                     "point: XLA at HIGHEST over the row the fitted model picks, in the newest of "
                     "them that timed it)"
                     + (", with " + ", ".join(args.fp8_fresh_stale) + " from the newest other "
                        "sweep of the shape that timed it in the form built, scaled by the two "
                        "traces' times of XLA at HIGHEST"
                        if args.fp8_fresh_stale else "") + ".\n")
        points_all.update(fp8)
        report.append(text)
        model.update(fp8_model)
        report.append(model_text)
    source = ", ".join(os.path.relpath(p, ROOT) if os.path.abspath(p).startswith(ROOT)
                       else os.path.basename(p)
                       for p in args.sweeps + args.recheck + args.fp8 + args.fp8_fresh)
    write_table(out, device, source, model, points_all, args.xla_threshold,
                floors if args.fp8 else None)
    text = "".join(report)
    print(text)
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(text)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
