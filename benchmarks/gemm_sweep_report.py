"""Report of benchmarks/bench_gemm_sweep.py: markdown tables and a plot from its result rows.

Ratio = ms(xla.dot) / ms(fo_jax method) per (dtype, shape): above 1, fo_jax is faster. fp8 rows
also compare like with like: XLA's fp8 dot at HIGHEST against fo_jax's default (both promote
partial sums to fp32) and XLA's default against fo_jax with fast accumulation. Also a script:
`python3 benchmarks/gemm_sweep_report.py RESULTS.jsonl` rewrites RESULTS.md (and .png).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fo_jax.bench.core import markdown_table  # noqa: E402

FLOOR = 0.95  # the "no shape below" line
FP8_FROM_M = 4096  # fp8's floor holds from this many rows on
# Below this share of an XLA row's time in its main kernel, the report flags the row: XLA's
# scaled fp8 dot in a form it folds is one GEMM kernel.
MAIN_KERNEL_SHARE = 0.9


def file_stem(base: dict) -> str:
    """gemm_sweep_<gpu>_<date>_<commit>, e.g. gemm_sweep_h100_2026-11-25_0123abcd."""
    kind = str(base.get("device", "gpu")).lower()
    hit = re.search(r"\b([a-z]\d{2,3}[a-z]?)\b", kind)
    gpu = hit.group(1) if hit else re.sub(r"[^a-z0-9]+", "-", kind).strip("-")
    return f"gemm_sweep_{gpu}_{base.get('date', 'undated')}_{str(base.get('commit', ''))[:8]}"


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _shape(r: dict) -> tuple:
    return r["M"], r["N"], r["K"]


def by_shape(rows: Sequence[dict], dtype: str) -> dict:
    """{(M, N, K): {"label", "xla.dot", "fo_jax.matmul", "config", "fo_jax.own", "own_config",
    "xla.dot_fp32acc", "fo_jax.matmul_fast", "fast_config", "gemm": {config: ms}}}."""
    out: dict = {}
    for r in rows:
        if r.get("dtype") != dtype or r.get("ms") is None:
            continue
        d = out.setdefault(_shape(r), {"label": r.get("layer", ""), "gemm": {}})
        if r["method"] == "fo_jax.gemm":
            d["gemm"][r["config"]] = r["ms"]
        elif r["method"] in ("xla.dot", "fo_jax.matmul"):
            d[r["method"]] = r["ms"]
            if r["method"] == "fo_jax.matmul":
                d["config"] = r.get("config")
        elif r["method"] == "fo_jax.own":
            d["fo_jax.own"] = r["ms"]
            d["own_config"] = r.get("config")
        elif r["method"] == "xla.dot_fp32acc":
            d["xla.dot_fp32acc"] = r["ms"]
        elif r["method"] == "fo_jax.matmul_fast":
            d["fo_jax.matmul_fast"] = r["ms"]
            d["fast_config"] = r.get("config")
        elif r["method"] == "fo_jax.own_fast":
            d["fo_jax.own_fast"] = r["ms"]
            d["own_fast_config"] = r.get("config")
    return out


def ratios(rows: Sequence[dict], dtype: str, xla: str = "xla.dot",
           fo: str = "fo_jax.matmul") -> list:
    """[(M, N, K, xla / fo)] of the shapes where both methods were timed."""
    return [(*s, d[xla] / d[fo]) for s, d in by_shape(rows, dtype).items()
            if d.get(xla) and d.get(fo)]


# fp8's three readings: (what, XLA's method, fo_jax's method).
FP8_PAIRS = [
    ("fo_jax.matmul (fp32 promotion) against XLA's default fp8 dot (fast accumulation)",
     "xla.dot", "fo_jax.matmul"),
    ("Like with like, fp32 promotion: fo_jax.matmul against XLA's fp8 dot at HIGHEST",
     "xla.dot_fp32acc", "fo_jax.matmul"),
    ("Like with like, fast accumulation: fo_jax.matmul_fast against XLA's default fp8 dot",
     "xla.dot", "fo_jax.matmul_fast"),
]
# With --own: fo_jax's own fp8 kernels (never XLA's fp8 dot), like with like.
FP8_OWN_PAIRS = [
    ("fo_jax's own fp32-promotion kernel (fo_jax.own) against XLA's fp8 dot at HIGHEST",
     "xla.dot_fp32acc", "fo_jax.own"),
    ("fo_jax's own fast-accumulation kernel (fo_jax.own_fast) against XLA's default fp8 dot",
     "xla.dot", "fo_jax.own_fast"),
]


def is_fast_row(config: str) -> bool:
    """Whether a compiled fp8 row (csrc/kernels/gemm_configs.py) accumulates fast: the
    FP8_FAST_CONFIGS rows are named fp8fast_*."""
    return config.startswith("fp8fast")


def _fp8_floor(pts: list, what: str) -> str:
    """The fp8 target's reading: the lowest ratio from FP8_FROM_M rows on, and the shapes
    under FLOOR there."""
    big = [p for p in pts if p[0] >= FP8_FROM_M]
    if not big:
        return ""
    low = min(big, key=lambda p: p[3])
    under = [f"{m}x{n}x{k} ({r:.3f}x)" for m, n, k, r in sorted(big) if r < FLOOR]
    return (f"{what}, M >= {FP8_FROM_M} ({len(big)} shapes): min {low[3]:.3f}x at "
            f"{low[0]}x{low[1]}x{low[2]}; under {FLOOR:.2f}x: "
            f"{', '.join(under) if under else 'none'}.\n")


def _summary(values: Sequence[float], what: str) -> str:
    if not values:
        return f"{what}: no shape timed.\n"
    return (f"{what}: geomean **{geomean(values):.3f}x** over {len(values)} shapes, min "
            f"{min(values):.3f}x, {sum(v < FLOOR for v in values)} under {FLOOR:.2f}x, "
            f"{sum(v >= 1.0 for v in values)} at or above 1.00x.\n")


def _xla_not_one_kernel(rows: Sequence[dict], dtype: str) -> str:
    """XLA's rows whose main kernel took under MAIN_KERNEL_SHARE of their time: in fp8 the
    baseline's scaling is written around XLA's dot, and a form XLA does not fold into its GEMM
    runs as a second kernel, which slows the baseline (rows without kernel_share predate it)."""
    low = [r for r in rows if r["dtype"] == dtype and r["method"].startswith("xla.")
           and r.get("kernel_share") is not None and r["kernel_share"] < MAIN_KERNEL_SHARE]
    if not low:
        return ""
    shown = ", ".join(f"{r['M']}x{r['N']}x{r['K']} {r['method']} ({r['kernel_share']:.2f})"
                      for r in sorted(low, key=_shape))
    return (f"\n**XLA's time is not its GEMM alone** (main kernel under "
            f"{MAIN_KERNEL_SHARE:.0%} of the time) at {len(low)} rows: {shown}. Check the "
            "baseline's form before reading the ratios (fo_jax/_xla_fp8.py).\n")


def markdown(rows: Sequence[dict]) -> str:
    """Per dtype: xla.dot against fo_jax.matmul per shape; with per-config rows also the best
    measured configuration per shape (what a perfect choice would give)."""
    if not rows:
        return "No rows.\n"
    base = rows[0]
    out = [f"GEMM sweep: {base.get('device')}, {base.get('date')}, commit {base.get('commit')}. "
           "GPU kernel time per call (JAX profiler, median of interleaved rounds); ratio = "
           "xla.dot / fo_jax (above 1: fo_jax faster).\n"]
    for dtype in sorted({r["dtype"] for r in rows}):
        shapes = by_shape(rows, dtype)
        table, best_vals, main_vals, own_vals, unsplit_vals, split_vals = [], [], [], [], [], []
        has_gemm = any(d["gemm"] for d in shapes.values())
        has_own = any(d.get("fo_jax.own") for d in shapes.values())
        has_split = any("/k" in c for d in shapes.values() for c in d["gemm"])
        has_fp8 = any(d.get("fo_jax.matmul_fast") or d.get("xla.dot_fp32acc")
                      for d in shapes.values())
        fp8_best: dict = {False: [], True: []}
        for (m, n, k), d in sorted(shapes.items()):
            xla, fo = d.get("xla.dot"), d.get("fo_jax.matmul")
            ratio = xla / fo if xla and fo else None
            if ratio:
                main_vals.append(ratio)
            line = [f"{m}x{n}x{k}", d["label"], d.get("config") or "-",
                    f"{xla:.4f}" if xla else "-", f"{fo:.4f}" if fo else "-",
                    f"{ratio:.3f}" if ratio else "-"]
            if has_own:
                own = d.get("fo_jax.own")
                ref = d.get("xla.dot_fp32acc") if has_fp8 else xla  # the same accumulation
                if own and ref:
                    own_vals.append(ref / own)
                line += [d.get("own_config") or "-", f"{ref / own:.3f}" if own and ref else "-"]
                if has_fp8:
                    own_fast = d.get("fo_jax.own_fast")
                    line += [d.get("own_fast_config") or "-",
                             f"{xla / own_fast:.3f}" if own_fast and xla else "-"]
            if has_split and xla and not has_fp8:
                unsplit = [v for c, v in d["gemm"].items() if "/k" not in c]
                if unsplit and d["gemm"]:
                    unsplit_vals.append(xla / min(unsplit))
                    split_vals.append(xla / min(d["gemm"].values()))
            if has_fp8:
                acc, fast = d.get("xla.dot_fp32acc"), d.get("fo_jax.matmul_fast")
                line += [d.get("fast_config") or "-", f"{acc:.4f}" if acc else "-",
                         f"{fast:.4f}" if fast else "-",
                         f"{acc / fo:.3f}" if acc and fo else "-",
                         f"{xla / fast:.3f}" if xla and fast else "-"]
            if has_gemm and has_fp8:  # the best row of each accumulation against XLA's
                for fast_rows, ref, vals in ((False, d.get("xla.dot_fp32acc"), fp8_best[False]),
                                             (True, xla, fp8_best[True])):
                    mine = {c: v for c, v in d["gemm"].items() if is_fast_row(c) == fast_rows}
                    if mine and ref:
                        name = min(mine, key=mine.get)
                        vals.append(ref / mine[name])
                        line += [name, f"{ref / mine[name]:.3f}"]
                    else:
                        line += ["-", "-"]
            elif has_gemm:
                if d["gemm"] and xla:
                    name = min(d["gemm"], key=d["gemm"].get)
                    best = xla / d["gemm"][name]
                    best_vals.append(max(best, 1.0))
                    line += [name, f"{best:.3f}"]
                else:
                    line += ["-", "-"]
            table.append(line)
        header = ["M x N x K", "layer", "config", "xla.dot ms", "fo_jax.matmul ms",
                  "xla / fo_jax"]
        if has_own and has_fp8:
            header += ["own config", "HIGHEST / own", "own fast config", "xla / own fast"]
        elif has_own:
            header += ["own config", "xla / own"]
        if has_fp8:
            header += ["fast config", "xla.dot_fp32acc ms", "fo_jax.matmul_fast ms",
                       "HIGHEST / fo_jax", "xla / fast"]
        if has_gemm and has_fp8:
            header += ["best fp32-promotion config", "HIGHEST / best", "best fast config",
                       "xla / best fast"]
        elif has_gemm:
            header += ["best measured config", "xla / best"]
        out.append(f"\n## {dtype}\n\n" + markdown_table(header, table))
        if has_fp8:
            out.append("\n")
            for what, xla_m, fo_m in FP8_PAIRS:
                pts = ratios(rows, dtype, xla_m, fo_m)
                out.append(_summary([p[3] for p in pts], what))
            out.append("\n")
            own_pairs = FP8_OWN_PAIRS if has_own else []
            for what, xla_m, fo_m in own_pairs:
                out.append(_summary([p[3] for p in ratios(rows, dtype, xla_m, fo_m)], what))
            out.append("\n")
            for what, xla_m, fo_m in FP8_PAIRS + own_pairs:
                out.append(_fp8_floor(ratios(rows, dtype, xla_m, fo_m), what))
            out.append(_xla_not_one_kernel(rows, dtype))
            if has_gemm:
                out.append("\n" + _summary(fp8_best[False], "Best measured fp32-promotion "
                                            "configuration per shape against XLA at HIGHEST"))
                out.append(_summary(fp8_best[True], "Best measured fast-accumulation "
                                    "configuration per shape against XLA's default"))
        else:
            out.append("\n" + _summary(main_vals, "fo_jax.matmul"))
        if has_own and not has_fp8:
            out.append(_summary(own_vals, "fo_jax's own kernel (fo_jax.own: its choice of "
                                "configuration and split, never XLA's dot)"))
        if has_split and not has_fp8:
            out.append(_summary(unsplit_vals, "Best measured configuration without a split"))
            out.append(_summary(split_vals, "Best measured configuration, splits included"))
        if has_gemm and not has_fp8:
            out.append(_summary(best_vals, "Best measured config per shape, XLA's dot where it "
                                "is faster (the bound of a perfect choice)"))
            wins: dict = {}
            for d in shapes.values():
                if d["gemm"]:
                    name = min(d["gemm"], key=d["gemm"].get)
                    wins[name] = wins.get(name, 0) + 1
            out.append("Fastest config per shape (count): " + ", ".join(
                f"{n} {c}" for n, c in sorted(wins.items(), key=lambda x: -x[1])) + ".\n")
    errors = [r for r in rows if r.get("error")]
    if errors:
        out.append("\n## Errors\n\n" + markdown_table(
            ["dtype", "M x N x K", "method", "config", "error"],
            [[r["dtype"], "x".join(str(v) for v in _shape(r)), r["method"], r.get("config"),
              r["error"][:160].replace("|", "/")] for r in errors]))
    return "".join(out)


def plot(rows: Sequence[dict], path: str) -> Optional[str]:
    """Ratio xla.dot / fo_jax.matmul against M (log scale), one series per dtype (fp8: also
    fo_jax.matmul_fast); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for dtype, marker in zip(sorted({r["dtype"] for r in rows}), "os^"):
        pts = ratios(rows, dtype)
        if not pts:
            continue
        ax.scatter([p[0] for p in pts], [p[3] for p in pts], marker=marker, alpha=0.7,
                   label=f"{dtype} (geomean {geomean([p[3] for p in pts]):.3f}x)")
        fast = ratios(rows, dtype, "xla.dot", "fo_jax.matmul_fast")
        if fast:  # fp8: the like-with-like reading beside the default's
            ax.scatter([p[0] for p in fast], [p[3] for p in fast], marker="x", alpha=0.7,
                       label=f"{dtype} fast accumulation "
                             f"(geomean {geomean([p[3] for p in fast]):.3f}x)")
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(FLOOR, color="r", lw=0.8, ls="--")
    ax.set_xlabel("M (rows of x per GPU)")
    ax.set_ylabel("xla.dot time / fo_jax.matmul time")
    base = rows[0]
    ax.set_title(f"fo_jax.matmul vs XLA's dot, {base.get('device')}, {base.get('commit')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    path = sys.argv[1]
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    stem = path[:-len(".jsonl")] if path.endswith(".jsonl") else path
    with open(stem + ".md", "w") as fh:
        fh.write(markdown(rows))
    plot(rows, stem + ".png")
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()
