"""Cost of the consumer GEMM's flag checks on one GPU: the consumer ("all-gather") kernel with every
band's flag already set against the plain kernel, same config, groups and tile order.

What it times: GPU time per launch from CUDA events around each launch, the two kernels' launches
interleaved on one stream after 3 warm-up pairs, median of --iters pairs (the CUDA module's
consumer_gemm_check, csrc/comm/consumer_gemm_check.h; no JAX computation). A is the gathered input
of 4 bands of M / 4 rows (M = gathered rows per GPU), the kernel visiting the own band first.
Each shape's check also runs the consumer with its bands arriving late (reversed order, a delay
before each) and asserts D equals the plain GEMM bit for bit: a benchmark of a wrong kernel is
worthless.

Usage: python benchmarks/bench_consumer_gemm.py [--out benchmarks/results] [--shapes MxNxK ...]
       [--dtypes bfloat16 float16 float8_e4m3fn] [--bands 4 ...] [--iters 100] [--tag TAG]
--bands: the band counts to time (each band is one flag check per CTA: a cost that grows with
the count is the checks', one that does not is the consumer kernel's own).
Writes <out>/consumer_gemm_<date><tag>.jsonl (one row per shape, dtype and kernel) and a
markdown table beside it.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", nargs="*", default=benchlib.DESIGN_SHAPES)
    ap.add_argument("--dtypes", nargs="*", default=["bfloat16", "float16"],
                    choices=["bfloat16", "float16", "float8_e4m3fn"])
    ap.add_argument("--bands", nargs="*", type=int, default=[4],
                    help="bands of A (of M / bands rows each)")
    ap.add_argument("--iters", type=int, default=100, help="timed launch pairs per shape")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    gpus = benchlib.cuda_gpus_or_exit("bench_consumer_gemm.py")
    from fo_jax import _cuda

    check = _cuda.module().consumer_gemm_check
    table = []
    res = benchlib.Results(benchlib.device_info(gpus[:1]))
    for dtype in args.dtypes:
        for bands in args.bands:
            for i, s in enumerate(args.shapes):
                m, n, k = (int(v) for v in s.split("x"))
                print(f"[{dtype} {bands} bands {i + 1}/{len(args.shapes)}] {s}", file=sys.stderr,
                      flush=True)
                r = check(m_local=m // bands, n=n, k=k, bands=bands, dtype=dtype,
                          order="reversed", delay_us=100, seed=i, timing_iters=args.iters)
                assert not r["timed_out"] and r["mismatches"] == 0 and not r["counter_problem"], (
                    f"{s} {dtype}: the consumer GEMM is wrong: {r}")
                overhead = r["consumer_us"] / r["plain_us"] - 1
                for method, us in (("plain", r["plain_us"]),
                                   ("consumer.flags_set", r["consumer_us"])):
                    res.add(dtype=dtype, M=m, N=n, K=k, bands=bands, method=method,
                            config=r["config"], gpu_us=round(us, 2), iters=args.iters,
                            tflops=round(2.0 * m * n * k / us / 1e6, 1))
                table.append([s, dtype, bands, r["config"], f"{r['plain_us']:.1f}",
                              f"{r['consumer_us']:.1f}", f"{overhead:+.2%}"])
    header = ["M x N x K", "dtype", "bands", "config", "plain GPU us",
              "consumer (flags set) GPU us", "flag-check cost"]
    md = (f"{res.base['device']}, {res.base['date']}, commit {res.base['commit']}\n\n"
          f"Consumer GEMM with every flag set against the plain GEMM, A in bands of M / bands "
          f"rows, median GPU time of {args.iters} interleaved launch pairs (CUDA "
          "events):\n\n" + benchlib.markdown_table(header, table))
    print("\n" + md)
    stem = os.path.join(args.out, f"consumer_gemm_{res.base['date']}{args.tag}")
    res.write_jsonl(stem + ".jsonl")
    res.write_markdown(stem + ".md", md)


if __name__ == "__main__":
    main()
