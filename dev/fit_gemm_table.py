#!/usr/bin/env python3
"""Fits fo_jax's GEMM choice (fo_jax/_gemm_choice.py) on a sweep and writes fo_jax/_gemm_table.py.

Input: JSON Lines of `benchmarks/bench_gemm_sweep.py --configs all` (rows "fo_jax.gemm" with a
"config", "xla.dot", "fo_jax.matmul"; one or more files, one device). For each dtype with
per-config rows and each configuration, the coefficients (a, b, b_avg, g) >= 0 of
_gemm_choice.features are fitted by least squares on the relative error (every subset of
non-negative coefficients is solved and the best feasible one kept: 16 tiny solves). Then, per
shape, the configuration the fitted model picks, the measured ratio ms(xla.dot) / ms(that
configuration) (XLA_POINTS: what fo_jax.matmul will run there; float16 without per-config rows
takes bfloat16's choice, its time scaled by the float16 / bfloat16 ratio of the default
configuration measured in the same run), and the report: how the fitted choice compares with the
old default, with the best measured configuration (oracle) and with XLA's dot after
prefer_xla_dot, per shape and in geomean; which configurations the choice never picks (rows of
csrc/kernels/gemm_configs.py that only cost build time).

Usage: python3 dev/fit_gemm_table.py SWEEP.jsonl [...] [--out fo_jax/_gemm_table.py]
         [--report REPORT.md] [--xla-threshold 0.98] [--sms 132]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import sys
from typing import Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fo_jax import _gemm_choice  # noqa: E402


def compiled_configs() -> list:
    """The rows of csrc/kernels/gemm_configs.py as dicts (the module's gemm_configs() shape)."""
    path = os.path.join(ROOT, "csrc", "kernels", "gemm_configs.py")
    spec = importlib.util.spec_from_file_location("gemm_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [dict(name=c.name, tile_m=c.tile_m, tile_n=c.tile_n, tile_k=c.tile_k,
                 cluster_m=c.cluster_m, cluster_n=c.cluster_n, pingpong=c.pingpong,
                 takes_addends=c.name in mod.SOURCE_CONFIGS) for c in mod.CONFIGS]


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


def fit_dtype(shapes: dict, configs: list, sms: int) -> tuple:
    """({config: coefficients}, {config: rms relative error}) for one dtype's per-config rows."""
    params, errors = {}, {}
    for cfg in configs:
        pts = [(s, d["configs"][cfg["name"]]) for s, d in shapes.items()
               if cfg["name"] in d["configs"]]
        if len(pts) < 8:  # too few shapes to fit four coefficients
            continue
        x = np.array([_gemm_choice.features(cfg, m, n, k, 1, sms) for (m, n, k), _ in pts])
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


def evaluate(dtype: str, shapes: dict, configs: list, params: dict, sms: int,
             bf16: Optional[dict]) -> tuple:
    """(XLA_POINTS entries, report lines, summary) of the fitted choice on the dtype's shapes."""
    names = [c["name"] for c in configs]
    points, lines = [], []
    ratio_old, ratio_new, ratio_oracle = [], [], []
    for (m, n, k), d in sorted(shapes.items()):
        xla = d.get("xla")
        if not xla:
            continue
        idx = _gemm_choice.choose(configs, params, m, n, k, 1, sms)
        chosen = names[idx] if idx is not None else None
        ms = d["configs"].get(chosen)
        if ms is None and bf16 is not None and chosen and "default" in d:
            # No per-config rows in this dtype: bfloat16's time of the chosen config, scaled by
            # this dtype's / bfloat16's time of the default config in the same run.
            b = bf16.get((m, n, k), {})
            if chosen in b.get("configs", {}) and "default" in b:
                ms = b["configs"][chosen] * d["default"][1] / b["default"][1]
        if ms is None:
            continue
        points.append((m, n, k, round(xla / ms, 4)))
        old = d.get("default")
        best = min(d["configs"], key=d["configs"].get) if d["configs"] else None
        ratio_old.append(xla / old[1] if old else None)
        ratio_new.append(xla / ms)
        if best:
            ratio_oracle.append(xla / d["configs"][best])
        lines.append([f"{m}x{n}x{k}", old[0] if old else "-",
                      f"{xla / old[1]:.3f}" if old else "-", chosen, f"{xla / ms:.3f}",
                      best or "-", f"{xla / d['configs'][best]:.3f}" if best else "-"])
    return points, lines, (ratio_old, ratio_new, ratio_oracle)


def with_xla(points: list, dtype: str, threshold: float) -> list:
    """Per point, the ratio fo_jax.matmul gets once prefer_xla_dot is on: 1 where it hands the
    shape to XLA (the same dot), else the measured ratio (uses the points being written)."""
    saved = (_gemm_choice._gemm_table.XLA_POINTS, _gemm_choice._gemm_table.XLA_THRESHOLD)
    _gemm_choice._gemm_table.XLA_POINTS = {dtype: tuple(points)}
    _gemm_choice._gemm_table.XLA_THRESHOLD = threshold
    try:
        return [(m, n, k, 1.0 if _gemm_choice.prefer_xla_dot(m, n, k, dtype) else r)
                for m, n, k, r in points]
    finally:
        _gemm_choice._gemm_table.XLA_POINTS, _gemm_choice._gemm_table.XLA_THRESHOLD = saved


def summary(what: str, values: list) -> str:
    values = [v for v in values if v]
    if not values:
        return f"- {what}: -\n"
    return (f"- {what}: geomean {geomean(values):.3f}x, min {min(values):.3f}x, "
            f"{sum(v < 0.95 for v in values)} of {len(values)} under 0.95x\n")


def write_table(path: str, device: str, source: str, model: dict, points: dict,
                threshold: float) -> None:
    lines = [
        '"""GEMM choice table (fo_jax/_gemm_choice.py), fitted on the GPU.',
        "",
        "Written by dev/fit_gemm_table.py; do not edit (rerun the script on a new sweep).",
        '"""',
        "",
        f"DEVICE = {device!r}",
        f"SOURCE = {source!r}",
        "# {dtype: {config name: (a, b, b_avg, g)}}, us: coefficients of "
        "fo_jax/_gemm_choice.features.",
        "MODEL: dict = {",
    ]
    for dt, params in model.items():
        lines.append(f"    {dt!r}: {{")
        lines += [f"        {name!r}: {tuple(coef)!r}," for name, coef in params.items()]
        lines.append("    },")
    lines += ["}",
              "# {dtype: ((M, N, K, ms(xla.dot) / ms(fo_jax's chosen config)), ...)}, as measured.",
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
    ap.add_argument("--out", default=os.path.join(ROOT, "fo_jax", "_gemm_table.py"))
    ap.add_argument("--report", default=None, help="also write the report (markdown) here")
    ap.add_argument("--xla-threshold", type=float, default=0.98)
    ap.add_argument("--sms", type=int, default=None,
                    help="SMs of the swept GPU (default: the rows' 'sms', else 132)")
    args = ap.parse_args()

    rows = load(args.sweeps)
    configs = compiled_configs()
    device = rows[0]["device"]
    sms = args.sms or next((r["sms"] for r in rows if r.get("sms")), _gemm_choice.DEFAULT_SMS)
    dtypes = sorted({r["dtype"] for r in rows})
    by_dtype = {dt: shapes_of(rows, dt) for dt in dtypes}
    model, fit_err = {}, {}
    for dt in dtypes:
        params, errors = fit_dtype(by_dtype[dt], configs, sms)
        if params:
            model[dt], fit_err[dt] = params, errors
    if not model:
        sys.exit("fit_gemm_table.py: no per-config rows (run the sweep with --configs all)")
    report = [f"# GEMM choice fitted on {device} ({sms} SMs)\n\nSources: "
              + ", ".join(os.path.basename(p) for p in args.sweeps) + "\n"]
    points_all = {}
    for dt in dtypes:
        params = model.get(dt) or model.get("bfloat16", {})
        bf16 = by_dtype.get("bfloat16") if dt not in model else None
        points, lines, (old, new, oracle) = evaluate(dt, by_dtype[dt], configs, params, sms,
                                                     bf16)
        if not points:
            continue
        points_all[dt] = tuple(points)
        final = [r for *_, r in with_xla(points, dt, args.xla_threshold)]
        report.append(f"\n## {dt}\n\n")
        if dt in fit_err:
            report.append("Fit (rms relative error of the predicted time): " + ", ".join(
                f"{n} {e:.1%}" for n, e in fit_err[dt].items()) + "\n\n")
        report.append(table(["M x N x K", "old default", "xla / old", "fitted choice",
                             "xla / fitted", "best measured", "xla / best"], lines))
        report.append("\n" + summary("old default", old) + summary("fitted choice", new)
                      + summary("best measured config (oracle)", oracle)
                      + summary(f"fitted choice, XLA's dot below {args.xla_threshold} "
                                "(prefer_xla_dot)", final))
        picked = {ln[3] for ln in lines}
        unused = [c["name"] for c in configs if c["name"] not in picked]
        report.append(f"- never chosen here: {', '.join(unused) or 'none'}\n")
    source = ", ".join(os.path.relpath(p, ROOT) if os.path.abspath(p).startswith(ROOT)
                       else os.path.basename(p) for p in args.sweeps)
    write_table(args.out, device, source, model, points_all, args.xla_threshold)
    text = "".join(report)
    print(text)
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
