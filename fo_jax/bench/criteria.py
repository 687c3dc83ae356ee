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
