"""Where a persistent GEMM kernel's tile time goes, from an Nsight Compute source page.

Reads the pages that dev/probes_py/ncu_gemm_profile.py exports (the source page: SASS with its
warps' stall samples and executed counts; the raw page: every metric) and splits one kernel's
consumer time per tile into regions of its SASS, which you name by the index of their first
instruction (--list prints the SASS with those indices, executed counts and samples, to pick
them from). Per region: its share of the consumer warps' samples, its instructions per tile
and warp, its main stall reasons; and, with the kernel's cycles and tensor-pipe activity from
the raw page, its cycles per tile. The tensor pipe's active cycles per tile are the tile's MMA
time; a region in which no MMA is in flight (the epilogue of a cooperative kernel, the work
between two tiles) adds its cycles to the tile's idle time.

Usage:
  python dev/ncu_tile_split.py PREFIX --kernel REGEX --list
  python dev/ncu_tile_split.py PREFIX --kernel REGEX --tiles N --consumer-warps 8 \\
      --region "tile start:506" --region "main loop:658" --region "epilogue:1101" \\
      --region "scheduler:1764" --region "producer:2101"
PREFIX is the pages' common path without "_source.csv" / "_raw.csv". Samples before the first
region are not counted; the region named "producer" (if any) is left out of the consumer
shares. --tiles is the kernel's tile count (the samples are split per tile with it).
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import re


def kernel_blocks(path: str) -> dict:
    """{kernel name: (header, rows)} of a source page, in report order (name made unique)."""
    blocks, name, lines = {}, None, []

    def flush():
        if name is not None:
            rows = list(csv.reader(io.StringIO("\n".join(lines))))
            key = name
            while key in blocks:
                key += "'"
            blocks[key] = (rows[0], rows[1:])

    with open(path) as f:
        for line in f:
            if line.startswith('"Kernel Name"'):
                flush()
                name, lines = next(csv.reader([line]))[1], []
            else:
                lines.append(line.rstrip("\n"))
    flush()
    return blocks


def raw_metrics(path: str, index: int) -> dict:
    """The raw page's metrics of the report's index-th kernel (the pages list the kernels in the
    same order; the raw page abbreviates their names)."""
    with open(path) as f:
        rows = list(csv.reader(f))
    return dict(zip(rows[0], rows[2 + index]))


def number(text: str) -> float:
    return float(text.replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix")
    ap.add_argument("--kernel", required=True, help="regular expression of the kernel's name")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--region", action="append", default=[], metavar="NAME:FIRST")
    ap.add_argument("--tiles", type=int)
    ap.add_argument("--consumer-warps", type=int, default=8)
    args = ap.parse_args()

    blocks = kernel_blocks(args.prefix + "_source.csv")
    names = [k for k in blocks if re.search(args.kernel, k)]
    if len(names) != 1:
        raise SystemExit(f"--kernel matches {len(names)} kernels: {[n[:60] for n in names]}")
    name = names[0]
    hdr, rows = blocks[name]
    samples = hdr.index("Warp Stall Sampling (All Samples)")
    executed = hdr.index("Instructions Executed")
    stalls = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    if args.list:
        for i, r in enumerate(rows):
            print(f"{i:5d} {int(r[executed]):9d} {int(r[samples]):6d}  {r[1].strip()}")
        return
    if not args.region or not args.tiles:
        raise SystemExit("give --region NAME:FIRST (one or more) and --tiles")
    bounds = sorted((int(spec.rsplit(":", 1)[1]), spec.rsplit(":", 1)[0]) for spec in args.region)
    regions = []
    for j, (first, rname) in enumerate(bounds):
        last = bounds[j + 1][0] if j + 1 < len(bounds) else len(rows)
        regions.append((rname, rows[first:last]))
    consumer = sum(int(r[samples]) for rname, rs in regions if rname != "producer" for r in rs)

    raw = raw_metrics(args.prefix + "_raw.csv", list(blocks).index(name))
    cycles = number(raw["sm__cycles_elapsed.avg"])
    ctas = number(raw["launch__grid_size"])
    tensor = number(raw["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"]) / 100
    per_tile = cycles * ctas / args.tiles
    print(f"{name[:100]}")
    print(f"{number(raw['gpu__time_duration.sum']):.1f} us at "
          f"{number(raw['smsp__cycles_elapsed.avg.per_second']):.2f} GHz, {cycles:.0f} cycles per "
          f"SM; {args.tiles} tiles over {ctas:.0f} CTAs: {per_tile:.0f} cycles per tile, of which "
          f"the tensor pipe is active {tensor * per_tile:.0f} ({100 * tensor:.1f}%)")
    print("| region | consumer samples | cycles per tile | instructions per tile and warp "
          "| main stall reasons |")
    print("|---|---|---|---|---|")
    for rname, rs in regions:
        s = sum(int(r[samples]) for r in rs)
        inst = sum(int(r[executed]) for r in rs) / (args.tiles * args.consumer_warps)
        reasons = collections.Counter()
        for r in rs:
            for i in stalls:
                if r[i] not in ("", "-"):
                    reasons[hdr[i][len("stall_"):]] += int(r[i])
        top = ", ".join(f"{k} {100 * v / max(s, 1):.0f}%" for k, v in reasons.most_common(3))
        if rname == "producer":
            print(f"| {rname} (not a consumer) | {s} | | | {top} |")
        else:
            print(f"| {rname} | {100 * s / consumer:.1f}% | {s / consumer * per_tile:.0f} | "
                  f"{inst:.0f} | {top} |")


if __name__ == "__main__":
    main()
