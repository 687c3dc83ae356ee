"""Report of `python -m fo_jax.bench`: markdown tables and PNG plots from the result rows.

Derived numbers per (collective, shape): speedup = T(baseline) / T(method), the baseline being
jax.baseline (xla.dot for the single-GPU GEMM rows, collective "none"); overlap
efficiency = (T_serial - T) / (T_serial - max(T_gemm, T_comm)), T_serial = fo_jax.sequential,
T_gemm = gemm_only, T_comm = comm_only (1: perfect overlap, 0: none, < 0: slower than serial);
ms / bound = T / max(T_gemm, T_comm) (1: at the overlap's bound), and per collective the pass/fail
lines of fo_jax/bench/criteria.py.
matplotlib is imported only for the plots (extra "bench").
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from fo_jax.bench import criteria
from fo_jax.bench.core import markdown_table

PARTS = ("gemm_only", "comm_only", "fo_jax.sequential")
BASELINES = ("jax.baseline", "xla.dot")


def baseline_of(collective: str) -> str:
    return "xla.dot" if collective == "none" else "jax.baseline"


def _key(r: dict) -> tuple:
    return r["collective"], f"{r['M']}x{r['N']}x{r['K']}"


def derived(rows: Sequence[dict]) -> dict:
    """{(collective, shape): {method: (ms, speedup, efficiency)}} (None where undefined)."""
    by: dict = {}
    for r in rows:
        by.setdefault(_key(r), {})[r["method"]] = r.get("ms")
    out = {}
    for key, times in by.items():
        base = times.get(baseline_of(key[0]))
        ser = times.get("fo_jax.sequential")
        parts = [times.get("gemm_only"), times.get("comm_only")]
        floor = max(parts) if None not in parts else None
        out[key] = {}
        for method, ms in times.items():
            sp = base / ms if ms and base else None
            eff = None
            if ms and ser and floor is not None and ser > floor and method not in PARTS:
                eff = (ser - ms) / (ser - floor)
            out[key][method] = (ms, sp, eff)
    return out


def _fmt(v: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def markdown(rows: Sequence[dict], title: str, note: Optional[str]) -> str:
    """Header line(s), one table row per (collective, shape, method), geometric-mean speedups,
    then the summary and PASS/FAIL lines of the multi-GPU criteria (overlap rows only)."""
    d = derived(rows)
    measured = criteria.times(rows)
    errors = {(*_key(r), r["method"]): r["error"] for r in rows if r.get("error")}
    table = []
    for (collective, shape), methods in d.items():
        for method, (ms, sp, eff) in methods.items():
            cell = _fmt(ms, ".3f")
            if (collective, shape, method) in errors:
                cell = "error: " + errors[(collective, shape, method)][:120].replace("|", "/")
            ratio = criteria.over_bound(ms, measured.get(collective, {}).get(shape, {}))
            table.append([collective, shape, method, cell, _fmt(sp, ".2f", "x"),
                          _fmt(eff, ".2f"), _fmt(ratio, ".2f")])
    md = ""
    if note:
        md += f"**{note.upper()}**\n\n"
    md += title + "\n\n"
    md += markdown_table(["collective", "M x N x K", "method", "ms", "speedup vs baseline",
                          "overlap eff.", "ms / bound"], table)
    md += ("\nBaseline: jax.baseline (x @ w + the collective, inside shard_map); for the GEMM "
           "rows (collective \"none\") xla.dot. Bound: max(gemm_only, comm_only) of the same "
           "run (1.00: the overlap hides the shorter part completely).\n")
    means: dict = {}
    for (collective, _), methods in d.items():
        for method, (_, sp, _) in methods.items():
            if sp and method not in PARTS and method not in BASELINES:
                means.setdefault((collective, method), []).append(sp)
    if means:
        md += "\nGeometric-mean speedup over the baseline:\n\n"
        md += markdown_table(["collective", "method", "speedup", "shapes"], [
            [c, m, f"{math.prod(v) ** (1 / len(v)):.3f}x", len(v)]
            for (c, m), v in sorted(means.items())])
    verdicts = criteria.summary([r for r in rows  # multi-GPU rows only
                                 if r["collective"] != "none" and r.get("tp", 2) > 1])
    if verdicts:
        md += "\nCriteria (docs/performance.md, \"How to measure\"):\n\n```\n"
        md += "\n".join(verdicts) + "\n```\n"
    if note:
        md += f"\n**{note.upper()}**\n"
    return md


def plots(rows: Sequence[dict], stem: str, title: str, note: Optional[str]) -> list:
    """Writes {stem}_time.png, _speedup.png, _efficiency.png; returns their paths."""
    import matplotlib  # noqa: PLC0415 (optional: extra "bench")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    d = derived(rows)
    collectives = sorted({c for c, _ in d})
    paths = []
    for what, idx, ylabel in (("time", 0, "ms (lower is better)"),
                              ("speedup", 1, "speedup over the baseline"),
                              ("efficiency", 2, "overlap efficiency")):
        fig, axes = plt.subplots(1, len(collectives), figsize=(7 * len(collectives), 4.5),
                                 squeeze=False)
        for ax, collective in zip(axes[0], collectives):
            shapes = [s for c, s in d if c == collective]
            skip = () if what == "time" else (*PARTS, *BASELINES)  # 1 or undefined there
            methods = sorted({m for (c, s), ms in d.items() if c == collective for m in ms
                              if ms[m][idx] is not None and m not in skip})
            width = 0.8 / max(len(methods), 1)
            for j, method in enumerate(methods):
                vals = [d[(collective, s)].get(method, (None,) * 3)[idx] for s in shapes]
                xs = [i + j * width for i, v in enumerate(vals) if v is not None]
                ax.bar(xs, [v for v in vals if v is not None], width, label=method)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
            ax.set_xticklabels(shapes, rotation=20, fontsize=8)
            ax.set_title(collective)
            ax.set_ylabel(ylabel)
            if what == "speedup":
                ax.axhline(1.0, color="k", lw=0.8)
            ax.legend(fontsize=6)
        fig.suptitle(title + (f"\n{note.upper()}" if note else ""), fontsize=9,
                     color="red" if note else "black")
        fig.tight_layout()
        path = f"{stem}_{what}.png"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
