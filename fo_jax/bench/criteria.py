"""The pass/fail lines of the overlap benchmark's report: how far each method is from the overlap's
bound, and whether the default fo_jax meets the multi-GPU acceptance criteria.

The bound of a (collective, shape) is max(gemm_only, comm_only) measured in the same run: an
overlap can at best hide the shorter of the two parts behind the longer, so `ms / bound` is 1.0
for a perfect overlap and 2.0 or so for none. The criteria (docs/performance.md, "How to
measure") are judged on the method "fo_jax" (the default configuration) against "jax.baseline"
of the same run, on the design shapes that the run measured.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

METHOD = "fo_jax"
BASELINE = "jax.baseline"
RS_KEY_SHAPE = "8192x8192x2048"  # the reduce-scatter shape with an absolute time criterion


@dataclasses.dataclass(frozen=True)
class Criteria:
    """What "fo_jax" must meet on one collective (None: not judged)."""

    min_geomean: float
    max_ms: Optional[tuple] = None  # (shape, ms): that shape's fo_jax time at most ms
    bound_slack: Optional[float] = None  # every shape's fo_jax time <= (1 + slack) * bound


CRITERIA = {
    "reduce_scatter": Criteria(1.42, max_ms=(RS_KEY_SHAPE, 0.48)),
    "all_reduce": Criteria(1.27),
    "all_gather": Criteria(1.35, bound_slack=0.10),
}


def _shape(r: dict) -> str:
    return f"{r['M']}x{r['N']}x{r['K']}"


def times(rows: Sequence[dict]) -> dict:
    """{collective: {shape: {method: ms}}} of the rows that have a time."""
    out: dict = {}
    for r in rows:
        if r.get("ms") is not None:
            out.setdefault(r["collective"], {}).setdefault(_shape(r), {})[r["method"]] = r["ms"]
    return out


def bound(methods: dict) -> Optional[float]:
    """max(gemm_only, comm_only) of one (collective, shape), None when either is missing."""
    parts = [methods.get("gemm_only"), methods.get("comm_only")]
    return None if None in parts else max(parts)


def over_bound(ms: Optional[float], methods: dict) -> Optional[float]:
    """ms / max(gemm_only, comm_only): 1.0 is the overlap's bound."""
    b = bound(methods)
    return ms / b if ms and b else None


def summary(rows: Sequence[dict]) -> list:
    """Per collective measured: one summary line (geomean speedup of fo_jax over jax.baseline, the
    reduce-scatter key shape's time, shapes slower than jax.baseline, worst distance to the
    bound), then one "PASS"/"FAIL" line per criterion of CRITERIA. A criterion whose numbers are
    missing (a method failed, a shape not measured) is a FAIL that says what is missing."""
    lines = []
    for collective, shapes in times(rows).items():
        pairs = {s: (m.get(METHOD), m.get(BASELINE)) for s, m in shapes.items()}
        speedups = [b / f for f, b in pairs.values() if f and b]
        missing = sorted(s for s, (f, b) in pairs.items() if not (f and b))
        slower = sorted(s for s, (f, b) in pairs.items() if f and b and f > b)
        geo = math.prod(speedups) ** (1 / len(speedups)) if speedups else None
        ratios = {s: over_bound(m.get(METHOD), m) for s, m in shapes.items()}
        worst = max((r, s) for s, r in ratios.items() if r is not None) if any(
            r is not None for r in ratios.values()) else None
        head = (f"{collective}: {METHOD} geomean speedup over {BASELINE} "
                + (f"{geo:.3f}x over {len(speedups)} shapes" if geo else "- (no pairs)"))
        key = shapes.get(RS_KEY_SHAPE, {}).get(METHOD)
        if collective == "reduce_scatter":
            head += f"; {RS_KEY_SHAPE} {key:.4f} ms" if key else f"; {RS_KEY_SHAPE} -"
        head += f"; slower than {BASELINE}: {', '.join(slower) if slower else 'none'}"
        if worst:
            head += f"; worst ms / bound {worst[0]:.2f} ({worst[1]})"
        lines.append(head)
        crit = CRITERIA.get(collective)
        if crit is None:
            continue
        gaps = f" (no {METHOD} / {BASELINE} pair for {', '.join(missing)})" if missing else ""
        ok = geo is not None and geo >= crit.min_geomean and not missing
        lines.append(_verdict(ok, collective, f"geomean speedup >= {crit.min_geomean:.2f}x "
                              f"(measured {geo:.3f}x){gaps}" if geo else
                              f"geomean speedup >= {crit.min_geomean:.2f}x (no pairs)"))
        lines.append(_verdict(not slower and not missing and bool(pairs), collective,
                              f"no shape slower than {BASELINE}"
                              + (f" (slower: {', '.join(slower)})" if slower else "") + gaps))
        if crit.max_ms:
            shape, limit = crit.max_ms
            lines.append(_verdict(key is not None and key <= limit, collective,
                                  f"{shape} <= {limit} ms (measured "
                                  + (f"{key:.4f} ms)" if key else "nothing)")))
        if crit.bound_slack is not None:
            far = sorted(s for s, r in ratios.items() if r is None or r > 1 + crit.bound_slack)
            lines.append(_verdict(not far and bool(ratios), collective,
                                  f"every shape within {crit.bound_slack:.0%} of max(gemm_only, "
                                  f"comm_only)" + (f" (not: {', '.join(far)})" if far else "")))
    return lines


def _verdict(ok: bool, collective: str, what: str) -> str:
    return f"{'PASS' if ok else 'FAIL'} {collective}: {what}"


# One process per GPU against one process for all GPUs (issue 33): "fo_jax" (the copy engine) in
# N processes within this fraction of its one-process time on every shape of the run.
PROCESSES_TOLERANCE = 0.05


def processes_comparison(rows: Sequence[dict], method: str = METHOD) -> list:
    """[(collective, shape, one-process ms, N-process ms, N / one)] for every (collective, shape)
    with a `method` time in both layouts: rows carry "processes" (1 for the one-process run)."""
    by: dict = {}
    for r in rows:
        if r.get("method") == method and r.get("ms") is not None:
            one = r.get("processes", 1) == 1
            by.setdefault((r["collective"], _shape(r)), {})["one" if one else "many"] = r["ms"]
    return [(c, s, t["one"], t["many"], t["many"] / t["one"])
            for (c, s), t in by.items() if "one" in t and "many" in t]


def processes_summary(rows: Sequence[dict], processes: int, platform: str = "gpu",
                      tolerance: float = PROCESSES_TOLERANCE) -> list:
    """Per collective of the N-process rows: a "PASS"/"FAIL" line, fo_jax in `processes`
    processes within `tolerance` of one process on every shape (a shape without both times is a
    FAIL that names it). Off GPUs the times say nothing about the criterion: "NOT CHECKED"."""
    compared = processes_comparison(rows)
    lines = []
    for collective in dict.fromkeys(r["collective"] for r in rows
                                    if r.get("processes", 1) != 1):
        mine = [c for c in compared if c[0] == collective]
        shapes = dict.fromkeys(_shape(r) for r in rows if r["collective"] == collective
                               and r.get("processes", 1) != 1)
        missing = [s for s in shapes if s not in {c[1] for c in mine}]
        what = (f"{METHOD} in {processes} processes within {tolerance:.0%} of one process on "
                f"every shape")
        if mine:
            worst = max(mine, key=lambda c: abs(c[4] - 1))
            what += f" (worst {worst[4] - 1:+.1%} at {worst[1]})"
        if missing:
            what += f" (no time in both layouts: {', '.join(missing)})"
        ok = bool(mine) and not missing and all(abs(c[4] - 1) <= tolerance for c in mine)
        if platform != "gpu":
            lines.append(f"NOT CHECKED {collective}: {what}, {platform}")
        else:
            lines.append(_verdict(ok, collective, what))
    return lines
