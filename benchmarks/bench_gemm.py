"""Single-GPU GEMM benchmark: fo_jax's signaling CUTLASS GEMM against XLA's dot.

Methods (bf16, x[M,K] @ w[K,N] per GPU):
  xla.dot                  jnp.dot(x, w) in bf16 (XLA's GEMM, fp32 accumulation inside)
  fo_jax.matmul            fo_jax.matmul with allow_fallback=False: the GEMM kernel (its own tile
                           choice, even where fo_jax.matmul would hand the shape to XLA's dot),
                           one group, no counters
  fo_jax.matmul.nosignal   fo_jax's GEMM, 8 groups (the overlap's tile order), no counters
  fo_jax.matmul.signal     8 groups with counters (the overlap's producer)
  fo_jax.matmul.remap      + the reduce-scatter row remap (batch 4), counters on
  fo_jax.matmul.sm116      signaling GEMM on 116 SMs (16 left to NCCL)
Times: median of 11 x 20 back-to-back calls (benchlib; the anchors use 5 x 20), the methods'
trials interleaved in rotated order so clock drift hits all alike. Kernel-level times (no host
or harness effects): dev/probes_py/profile_gemm.py.
Also the GPU kernel time per call of every method (JAX profiler traces, benchlib.
kernel_ms_interleaved): the overhead columns are within the wall clock's noise, not the kernel's.
Writes JSON Lines + two markdown tables (wall clock, GPU kernel time).

Usage: python benchmarks/bench_gemm.py [--out benchmarks/results] [--shapes MxNxK ...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import fo_jax  # noqa: E402

ODD_SHAPES = ["1000x1032x520", "6000x5000x3000"]
KERNEL = fo_jax.OverlapConfig(allow_fallback=False)  # fo_jax.matmul on fo_jax's own kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", nargs="*", default=benchlib.DESIGN_SHAPES + ODD_SHAPES)
    ap.add_argument("--tag", default="")
    ap.add_argument("--trials", type=int, default=11,
                    help="timed trials of 20 calls per method (median reported)")
    args = ap.parse_args()

    gpus = benchlib.cuda_gpus_or_exit("bench_gemm.py")
    from fo_jax import _cuda_ops, _plan

    dev = gpus[0]
    dtype = jnp.dtype(jnp.bfloat16)
    res = benchlib.Results(benchlib.device_info([dev]) | {"dtype": str(dtype)})
    table, gpu_table = [], []
    for i, s in enumerate(args.shapes):
        m, n, k = (int(v) for v in s.split("x"))
        print(f"[{i + 1}/{len(args.shapes)}] {s}", file=sys.stderr, flush=True)
        x, w = benchlib.gemm_operands(m, n, k, dtype, dev, seed=i)
        flops = 2.0 * m * n * k

        def plan(groups, batch=1, sm=0, mm=m):
            cfg = fo_jax.OverlapConfig(num_groups=groups)
            return _plan.plan_gemm("bench", dtype, mm, n, k, batch, cfg, groups, sm)

        p8 = plan(8)
        methods = {
            "xla.dot": jax.jit(jnp.dot),
            "fo_jax.matmul.nosignal": jax.jit(lambda a, b: _cuda_ops.signaling_gemm(
                a, b, p8, 1, False)[0]),
            "fo_jax.matmul": jax.jit(lambda a, b: fo_jax.matmul(a, b, config=KERNEL)),
            "fo_jax.matmul.signal": jax.jit(lambda a, b: _cuda_ops.signaling_gemm(
                a, b, p8, 1, True)[0]),
            "fo_jax.matmul.sm116": jax.jit(lambda a, b: _cuda_ops.signaling_gemm(
                a, b, plan(8, sm=116), 1, True)[0]),
        }
        if m % 32 == 0:
            p_rs = plan(8, batch=4, mm=m // 4)
            methods["fo_jax.matmul.remap"] = jax.jit(
                lambda a, b: _cuda_ops.signaling_gemm(a, b, p_rs, 4, True)[0])
        # Correctness guard: a benchmark of a wrong kernel is worthless.
        ref = np.asarray(methods["xla.dot"](x, w).astype(jnp.float32))
        for name in ("fo_jax.matmul", "fo_jax.matmul.signal"):
            got = np.asarray(methods[name](x, w).astype(jnp.float32))
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            assert err < 1e-2, f"{s}: {name} differs from xla.dot (rel err {err:.2e})"
        for name, f in methods.items():
            out = f(x, w)
            assert out.dtype == dtype, (name, out.dtype)
        times = benchlib.time_ms_interleaved(methods, x, w, trials=args.trials)
        gpu = benchlib.kernel_ms_interleaved(methods, x, w)
        for name, ms in times.items():
            res.add(M=m, N=n, K=k, method=name + args.tag, ms=round(ms, 4),
                    tflops=round(flops / ms / 1e9, 1), gpu_ms=round(gpu[name], 4),
                    gpu_tflops=round(flops / gpu[name] / 1e9, 1),
                    config=p8.config_name if name.startswith("fo_jax") else None)
        base = times["xla.dot"]
        mm, sig, nosig = (times[k] for k in ("fo_jax.matmul", "fo_jax.matmul.signal",
                                               "fo_jax.matmul.nosignal"))
        table.append([s, p8.config_name, f"{base:.3f}", f"{mm:.3f}", f"{flops / mm / 1e9:.0f}",
                      f"{base / mm:.3f}", f"{base / sig:.3f}", f"{sig / nosig - 1:+.1%}",
                      f"{times.get('fo_jax.matmul.remap', math.nan) / nosig - 1:+.1%}",
                      f"{times['fo_jax.matmul.sm116'] / sig - 1:+.1%}"])
        g_rm = gpu.get("fo_jax.matmul.remap", math.nan)
        gpu_table.append([s, f"{gpu['xla.dot']:.4f}", f"{gpu['fo_jax.matmul']:.4f}",
                          f"{flops / gpu['fo_jax.matmul'] / 1e9:.0f}",
                          f"{gpu['xla.dot'] / gpu['fo_jax.matmul']:.3f}",
                          f"{gpu['xla.dot'] / gpu['fo_jax.matmul.signal']:.3f}",
                          f"{gpu['fo_jax.matmul.signal'] / gpu['fo_jax.matmul.nosignal'] - 1:+.1%}",
                          f"{g_rm / gpu['fo_jax.matmul.nosignal'] - 1:+.1%}"])
    header = ["M x N x K", "config", "xla.dot ms", "fo_jax.matmul ms", "TFLOP/s",
              "matmul vs xla", "8 groups + signals vs xla", "signal ovh", "remap+signal ovh",
              "116 SMs"]
    gpu_header = ["M x N x K", "xla.dot GPU ms", "fo_jax.matmul GPU ms", "TFLOP/s",
                  "matmul vs xla", "8 groups + signals vs xla", "signal ovh", "remap+signal ovh"]
    md = (f"{benchlib.provenance(res.base)}, bf16\n\n"
          f"Wall clock (median of {args.trials} x 20 back-to-back calls, host and queue "
          "included):\n\n" + benchlib.markdown_table(header, table) +
          "\nGPU kernel time per call (JAX profiler, median of 3 traces of 8 calls per method, "
          "rotated order; no host or queue time):\n\n" +
          benchlib.markdown_table(gpu_header, gpu_table))
    print("\n" + md)
    stem = os.path.join(args.out, f"gemm_{res.base['date']}{args.tag}")
    res.write_jsonl(stem + ".jsonl")
    res.write_markdown(stem + ".md", md)


if __name__ == "__main__":
    main()
