"""Overlapped GEMM + collective on all local GPUs (TP = number of GPUs), against plain JAX.

A thin wrapper: the measuring code is fo_jax/bench/ (inside the package, so that the installed
`python -m fo_jax.bench` runs it too); this script keeps its CLI, methods and file names.
Methods (bf16; per-GPU x[M,K] @ w[K,N]; collective over the "tp" axis; for all_gather M is the
gathered rows, each GPU holding M / TP of x's rows):
  fo_jax             fo_jax.overlapped_matmul, default configuration (the copy-engine
                     transport where it can run, else NCCL); all_gather: the overlapped
                     all-gather, opted in (OverlapConfig(all_gather="overlap"))
  fo_jax.nccl        the same with transport="nccl"
  fo_jax.sequential  the same kernels without overlap: one group, GEMM on all SMs, then NCCL
  jax.baseline       XLA dot (fp32 accumulation) + psum / psum_scatter, inside shard_map
                     (all_gather: XLA's all_gather, then the dot)
  gemm_only          XLA dot alone;   comm_only: psum / psum_scatter / all_gather alone
  fo_jax[...]        with --sweep / --configs: each configuration (groups, sm_budget, nccl_max_ctas)
Prints speedup over jax.baseline and overlap efficiency
  (T_serial - T_overlap) / (T_serial - max(T_gemm, T_comm)),  T_serial = fo_jax.sequential.
Each time over max(T_gemm, T_comm) (ms / bound: 1.00 is the overlap's best) and, per collective,
the multi-GPU criteria as PASS/FAIL lines (docs/performance.md, "How to measure").
Times: median of 5 x 20 back-to-back calls. Writes JSON Lines + a markdown table
(overlap_tp{P}_{date}{tag}.*). The full comparison (chunked, XLA windowed einsum, plots) is
`python -m fo_jax.bench`.

Needs a GPU and fo_jax's CUDA module (no CPU fallback); with one GPU (or --tp 1) it times the
single-GPU rows of `python -m fo_jax.bench` (fo_jax.matmul and overlapped_matmul at axis size 1).

Usage: python benchmarks/bench_overlap.py [--collectives reduce_scatter all_reduce all_gather]
       [--shapes MxNxK ...] [--sweep] [--configs G:SM:C[:GEMM_CONFIG] ...]
       [--dtype bfloat16|float16] [--tp N] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from fo_jax import bench
from fo_jax.bench.core import BENCH_COLLECTIVES, DESIGN_SHAPES

SWEEP = [dict(num_groups=g, sm_budget=sm, nccl_max_ctas=c)
         for g, sm, c in itertools.product((4, 8, 16), (116, 124), (8, 16))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", nargs="*", default=DESIGN_SHAPES)
    ap.add_argument("--collectives", nargs="*", default=list(BENCH_COLLECTIVES),
                    choices=BENCH_COLLECTIVES)
    ap.add_argument("--sweep", action="store_true", help="also time the SWEEP configurations")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra configurations to time, each "
                    "GROUPS:SM_BUDGET:NCCL_MAX_CTAS[:GEMM_CONFIG]")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--tp", type=int, default=None, help="GPUs to use (default: all local GPUs)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    configs = (SWEEP if args.sweep else []) + bench.parse_configs(args.configs, sweep=False)
    try:
        bench.run(args.shapes, args.collectives, args.out, stem_prefix="overlap",
                  configs=configs, extended=False, plots=False, tag=args.tag, require_gpu=True,
                  tp=args.tp, dtype=args.dtype)
    except bench.SelectionError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
