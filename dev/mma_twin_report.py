"""How an accurate fp8 row's MMA-loop twins compare with it, from one GEMM sweep.

Reads a benchmarks/bench_gemm_sweep.py JSON Lines file whose --configs timed a row and its twins
(csrc/kernels/gemm_configs.py MMA_TWINS: the same tile with the other MMA loop; FORMER_TWINS:
those of the committed sweeps no longer built) in the same traces, and prints per shape and
twin: the twin's time over the row's, and the difference per tile on each SM (the tiles of the
shape over the SMs, rounded up: the waves) in microseconds and per k-tile (K / tile K, rounded
up) in nanoseconds; then the geometric mean of the time ratio by K. Every number comes from one
trace, so it is free of the few percent two leases differ by.

Usage: python3 dev/mma_twin_report.py SWEEP.jsonl [--row NAME]
       (default: every row that has a twin timed in the file)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "csrc", "kernels"))
import gemm_configs  # noqa: E402  (the kernel table: a script there, importable)

# Twins the committed sweeps of 2026-12-02 timed that are no longer built: {twin: its row}. In
# those sweeps cooperative 128x128 ran CUTLASS's mma(), and these were fo_jax's mma() in its own
# order of release and promotion (_own_mma) and in CUTLASS's (_late_release), the form the row
# has taken since.
FORMER_TWINS = {"fp8_coop_128x128x128_c1_own_mma": "fp8_coop_128x128x128_c1",
                "fp8_coop_128x128x128_c1_late_release": "fp8_coop_128x128x128_c1"}
K_BUCKETS = ((0, 2048, "K <= 2048"), (2049, 4096, "2048 < K <= 4096"),
             (4097, 1 << 30, "K > 4096"))


def comparisons(rows: list, row: str | None = None) -> list:
    """[dict(shape, row, twin, ratio, us_per_tile, ns_per_k_tile, k_tiles)] for every shape at
    which the sweep timed a row and one of its twins, sorted by twin, K, M, N."""
    configs = {c.name: c for c in gemm_configs.TABLE}
    twins = {**FORMER_TWINS, **gemm_configs.MMA_TWINS}
    times: dict = defaultdict(dict)
    sms = {}
    for r in rows:
        if r.get("method") == "fo_jax.gemm" and (r.get("config") in configs
                                                 or r.get("config") in twins):
            shape = (r["M"], r["N"], r["K"])
            times[shape][r["config"]] = r["ms"]
            sms[shape] = r.get("sms") or 132
    out = []
    for twin, base in twins.items():
        if row and base != row:
            continue
        c = configs[base]
        for shape, t in times.items():
            if base not in t or twin not in t:
                continue
            m, n, k = shape
            tiles = -(-m // c.tile_m) * -(-n // c.tile_n)
            waves = -(-tiles // sms[shape])
            k_tiles = -(-k // c.tile_k)
            us = (t[twin] - t[base]) * 1e3 / waves
            out.append(dict(shape=shape, row=base, twin=twin, ratio=t[twin] / t[base],
                            us_per_tile=us, ns_per_k_tile=us * 1e3 / k_tiles, k_tiles=k_tiles))
    return sorted(out, key=lambda d: (d["twin"], d["shape"][2], d["shape"][0], d["shape"][1]))


def geomeans(found: list) -> dict:
    """{(twin, K bucket label): (geomean of the time ratios, shapes)}."""
    out = {}
    for twin in sorted({d["twin"] for d in found}):
        for lo, hi, label in K_BUCKETS:
            ratios = [d["ratio"] for d in found if d["twin"] == twin and lo <= d["shape"][2] <= hi]
            if ratios:
                out[(twin, label)] = (math.exp(sum(map(math.log, ratios)) / len(ratios)),
                                      len(ratios))
    return out


def markdown(found: list) -> str:
    lines = ["| M x N x K | row | twin | twin / row | per tile and SM | per k-tile |",
             "|---|---|---|---|---|---|"]
    for d in found:
        lines.append(f"| {'x'.join(map(str, d['shape']))} | {d['row']} | {d['twin']} | "
                     f"{d['ratio']:.3f} | {d['us_per_tile']:+.2f} us | "
                     f"{d['ns_per_k_tile']:+.0f} ns ({d['k_tiles']} k-tiles) |")
    lines.append("")
    for (twin, label), (g, count) in geomeans(found).items():
        lines.append(f"- {twin}, {label}: twin / row {g:.3f} in geomean over {count} shapes")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="bench_gemm_sweep.py JSON Lines")
    ap.add_argument("--row", default=None, help="only this row's twins")
    args = ap.parse_args()
    with open(args.sweep) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    found = comparisons(rows, args.row)
    if not found:
        sys.exit(f"mma_twin_report.py: {args.sweep} times no row beside its MMA twin")
    print(markdown(found), end="")


if __name__ == "__main__":
    main()
