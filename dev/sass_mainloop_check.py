#!/usr/bin/env python3
"""Checks that the GEMM kernels' main loops stay in the uniform datapath (SASS, no GPU needed).

An sm90 GEMM's main loop issues its MMAs (HGMMA, QGMMA) with operand descriptors in uniform
registers. When the compiler cannot prove the loop's state warp-uniform (e.g. after a branch on
the thread index elsewhere in the tile loop), it computes the descriptors per thread and moves
them with R2UR before every MMA, and syncs the warp in the loop: dozens of extra instructions per
k-tile, a few percent of a short-K GEMM (docs/gemm_performance.md, "The residual gap"). This script
disassembles binaries (the fo_jax CUDA module, `.devbuild/gemm_selftest`, `.devbuild/gemm_probe`,
a `.cubin`) with cuobjdump and reports, per kernel with MMAs: its instructions, the span from its
first to its last MMA, and the R2UR and WARPSYNC instructions in that span (from 30 before the
first MMA). A kernel whose span holds more R2UR than twice its MMAs (a non-uniform loop moves
two descriptors of two registers each per MMA; a uniform one has none in its steady state, and a
few in a peeled first k-tile), or a warp sync, fails the check.

Usage: python3 dev/sass_mainloop_check.py BINARY [...] [--cuobjdump PATH]
Exit status 1 if any kernel fails. cuobjdump comes with the CUDA toolkit, or
`pip install nvidia-cuda-cuobjdump` (its bin/ holds it).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

MMA = re.compile(r"\b[HQ]GMMA\.")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?);")


def kernels(sass: str) -> list:
    """[(mangled name, [instruction text])] of the functions in cuobjdump -sass output."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    return [(parts[i], INSTRUCTION.findall(parts[i + 1])) for i in range(1, len(parts), 2)]


def main_loop(instructions: list) -> dict | None:
    """The MMA span's counts, or None for a function without MMAs."""
    at = [i for i, s in enumerate(instructions) if MMA.search(s)]
    if not at:
        return None
    span = instructions[max(0, at[0] - 30):at[-1] + 1]
    return dict(instructions=len(instructions), span=at[-1] - at[0], mma=len(at),
                r2ur=sum("R2UR" in s for s in span), warpsync=sum("WARPSYNC" in s for s in span))


def check(binary: str, cuobjdump: str) -> list:
    """[(kernel, counts, ok)] for every kernel with MMAs in `binary`."""
    out = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for name, instructions in kernels(out):
        counts = main_loop(instructions)
        if counts is None:
            continue
        counts["pingpong"] = "Pingpong" in name
        ok = counts["r2ur"] <= 2 * counts["mma"] and counts["warpsync"] == 0
        rows.append((name, counts, ok))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    args = ap.parse_args()
    if not args.cuobjdump:
        sys.exit("sass_mainloop_check.py: cuobjdump not found (CUDA toolkit, or pip install "
                 "nvidia-cuda-cuobjdump; then --cuobjdump PATH)")
    failed = 0
    for binary in args.binaries:
        rows = check(binary, args.cuobjdump)
        bad = [r for r in rows if not r[2]]
        failed += len(bad)
        print(f"{binary}: {len(rows)} kernels with MMAs, {len(bad)} with a non-uniform main loop")
        for name, c, _ in bad:
            kind = "ping-pong" if c["pingpong"] else "cooperative"
            print(f"  {kind}: {c['instructions']} instructions, main loop {c['span']} with "
                  f"{c['mma']} MMAs, R2UR {c['r2ur']}, WARPSYNC {c['warpsync']}: {name[:100]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
