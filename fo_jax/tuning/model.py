"""Pipeline model of one overlapped call: predicts its time from measured parts.

The tuner ranks candidates (groups, SMs left to NCCL, NCCL CTAs) with this model and measures
only the best few. Plain arithmetic (no device), so tests check it against hand-computed cases.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence

from fo_jax._plan import uniform_groups


@dataclasses.dataclass(frozen=True)
class CommCurve:
    """Time of one collective call as latency + bytes / bandwidth (bytes: its input on a rank)."""

    latency_s: float
    bandwidth: float  # bytes per second

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth

    @classmethod
    def fit(cls, points: Sequence[tuple]) -> "CommCurve":
        """Least-squares fit of (bytes, seconds) points; latency clamped to >= 0.

        Raises:
          ValueError: with no point, or when the times do not grow with the bytes.
        """
        pts = [(float(b), float(t)) for b, t in points]
        if not pts:
            raise ValueError("CommCurve.fit: no points")
        if len(pts) == 1:
            return cls(0.0, pts[0][0] / max(pts[0][1], 1e-12))
        n = len(pts)
        mb = sum(b for b, _ in pts) / n
        mt = sum(t for _, t in pts) / n
        sbb = sum((b - mb) ** 2 for b, _ in pts)
        slope = sum((b - mb) * (t - mt) for b, t in pts) / sbb if sbb > 0 else 0.0
        if slope <= 0:
            raise ValueError(f"CommCurve.fit: time does not grow with bytes: {pts}")
        latency = mt - slope * mb
        if latency < 0:  # refit through the origin: a negative latency is noise
            latency = 0.0
            slope = sum(b * t for b, t in pts) / sum(b * b for b, _ in pts)
        return cls(latency, 1.0 / slope)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One tuning point: uniform groups, SMs left to NCCL (GEMM gets the rest), NCCL CTA bound."""

    num_groups: int
    sms_for_nccl: int
    nccl_max_ctas: int

    def label(self) -> str:
        return f"g{self.num_groups},nccl_sms{self.sms_for_nccl},c{self.nccl_max_ctas}"


def group_work(bounds: Sequence[int], tile_m: int, tile_cols: int, m: int, n: int, batch: int,
               itemsize: int) -> tuple:
    """(tiles, bytes) per group for tile-row `bounds` within one batch of `m` rows.

    A group covers its tile-rows in every batch (reduce_scatter: one band per rank); its
    collective moves those rows of the [batch * m, n] local product.
    """
    tiles, nbytes = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rows = min(hi * tile_m, m) - lo * tile_m
        tiles.append(batch * (hi - lo) * tile_cols)
        nbytes.append(batch * rows * n * itemsize)
    return tuple(tiles), tuple(nbytes)


def _collective_end(start: float, nbytes: float, gemm_end: float, busy: CommCurve,
                    idle: CommCurve) -> float:
    """End of a collective that starts at `start`: at the `busy` rate while the GEMM still holds
    its SMs, at the `idle` rate after (the work left over is finished at the idle rate)."""
    d_busy, d_idle = busy.seconds(nbytes), idle.seconds(nbytes)
    if start >= gemm_end:
        return start + d_idle
    if start + d_busy <= gemm_end:
        return start + d_busy
    done = (gemm_end - start) / d_busy
    return gemm_end + (1.0 - done) * d_idle


def pipeline_seconds(group_tiles: Sequence[int], group_bytes: Sequence[float], gemm_sms: int,
                     wave_s: float, comm_busy: CommCurve, comm_idle: Optional[CommCurve] = None,
                     latency_s: float = 5e-6) -> float:
    """Predicted time of one overlapped call.

    The persistent GEMM runs tiles in group order, `gemm_sms` at a time, one wave every
    `wave_s` seconds: group g is ready when the wave holding its last tile ends. Its collective
    starts at max(ready_g, end of the previous collective) + `latency_s` (counter wait and
    launch) and lasts comm(bytes_g): `comm_busy` while the GEMM runs (NCCL has only the SMs left
    to it), `comm_idle` after. The call ends with the last collective.

    Args:
      group_tiles: output tiles per group, in GEMM order.
      group_bytes: bytes each group's collective reads on one rank.
      gemm_sms: SMs (persistent CTAs) of the GEMM.
      wave_s: seconds per wave of `gemm_sms` tiles.
      comm_busy: collective time while the GEMM runs.
      comm_idle: collective time once the GEMM has ended (default: `comm_busy`).
      latency_s: per-group gap between readiness and the collective's start.

    Returns:
      Seconds from the GEMM's start to the end of the last collective.
    """
    if gemm_sms < 1 or len(group_tiles) != len(group_bytes) or not group_tiles:
        raise ValueError("pipeline_seconds: need gemm_sms >= 1 and one byte count per group")
    idle = comm_idle or comm_busy
    gemm_end = math.ceil(sum(group_tiles) / gemm_sms) * wave_s
    end, done = 0.0, 0
    for tiles, nbytes in zip(group_tiles, group_bytes):
        done += tiles
        ready = math.ceil(done / gemm_sms) * wave_s
        start = max(ready, end) + latency_s
        end = _collective_end(start, nbytes, gemm_end, comm_busy, idle)
    return end


@dataclasses.dataclass(frozen=True)
class GemmTiming:
    """The signaling GEMM of one shape measured alone on `gemm_sms` SMs."""

    gemm_sms: int
    wave_s: float  # measured time / ceil(tiles / gemm_sms)
    tile_m: int
    tile_n: int
    seconds: float = 0.0
    config_name: str = ""


def pick_curve(curves: Mapping[int, CommCurve], ctas: int) -> CommCurve:
    """The curve measured at `ctas` CTAs, else at the largest bound below it, else the smallest."""
    if ctas in curves:
        return curves[ctas]
    below = [c for c in curves if c <= ctas]
    return curves[max(below)] if below else curves[min(curves)]


def predict_seconds(cand: Candidate, gemm: GemmTiming, curves: Mapping[int, CommCurve], m: int,
                    n: int, batch: int, itemsize: int = 2, latency_s: float = 5e-6,
                    busy_factor: float = 1.0) -> float:
    """Predicted time of `cand` for a per-batch [m, n] output (batch = tp for reduce_scatter).

    While the GEMM runs NCCL gets at most the SMs left to it, so its rate is the curve of
    min(nccl_max_ctas, sms_for_nccl) CTAs, slowed by `busy_factor` (interference with the GEMM
    beyond SM count: memory traffic, CTA placement; fitted by `fit_busy_factor`); after the
    GEMM, the curve of nccl_max_ctas.
    """
    tile_rows = -(-m // gemm.tile_m)
    bounds = uniform_groups(tile_rows, cand.num_groups)
    tiles, nbytes = group_work(bounds, gemm.tile_m, -(-n // gemm.tile_n), m, n, batch, itemsize)
    base = pick_curve(curves, min(cand.nccl_max_ctas, cand.sms_for_nccl))
    busy = CommCurve(base.latency_s * busy_factor, base.bandwidth / busy_factor)
    idle = pick_curve(curves, cand.nccl_max_ctas)
    return pipeline_seconds(tiles, nbytes, gemm.gemm_sms, gemm.wave_s, busy, idle, latency_s)


def fit_busy_factor(measured_s: float, predict: Callable[[float], float], lo: float = 0.5,
                    hi: float = 16.0, iters: int = 40) -> float:
    """The factor f in [lo, hi] with predict(f) == measured_s (bisection; predict is
    non-decreasing in f), clamped to the interval when no factor matches."""
    if predict(lo) >= measured_s:
        return lo
    if predict(hi) <= measured_s:
        return hi
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        if predict(mid) < measured_s:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


GAPS = tuple(round(1e-6 * 1.25 ** i, 9) for i in range(20))  # 1 us .. ~70 us


def fit_gap_and_factor(measured: Sequence[float],
                       predict: Callable[[int, float, float], float]) -> tuple:
    """(gap, factor) of runs of one configuration at several group counts.

    For each per-group gap in GAPS the busy factor is fitted on run 0; the gap whose predictions
    (`predict(i, gap, factor)` of run i) have the least squared relative error over all runs
    wins. The gap covers what each extra group costs beyond its bytes (counter wait, NCCL launch
    under load), which a one-group calibration cannot see.
    """
    best = None
    for gap in GAPS:
        f = fit_busy_factor(measured[0], lambda x, gap=gap: predict(0, gap, x))
        err = sum(((predict(i, gap, f) - t) / t) ** 2 for i, t in enumerate(measured))
        if best is None or err < best[0]:
            best = (err, gap, f)
    return best[1], best[2]
