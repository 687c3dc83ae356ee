"""Device timeline of one overlapped call: when the GEMM and each NCCL kernel ran, per GPU.

The wall-clock benchmark (bench_overlap.py) says how long a call takes; this script says why. It
records a JAX profiler trace (CUPTI) of a few back-to-back calls per method and prints, for the
last call on every GPU, each kernel's start and end relative to the call's first kernel (us),
the call's device span, and how much NCCL time ran while the GEMM was running. Kernel-level
timing has no host or dispatch effects; the host dispatch time per call is printed beside it.

Methods: fo_jax with the default configuration and each --configs G:SM:C[:GEMM_CONFIG], and
jax.baseline (XLA dot + psum / psum_scatter). Per-GPU x[M,K] @ w[K,N], bf16, TP = all GPUs.

Usage: python dev/probes_py/profile_overlap.py [--shape MxNxK] [--collectives ...] [--configs ...]
Writes <out>/overlap_profile_tp{P}_<date>.jsonl (one row per method, GPU and kernel).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import jax.numpy as jnp

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, _BENCHMARKS)  # benchlib
import benchlib  # noqa: E402

import fo_jax  # noqa: E402
from fo_jax import bench  # noqa: E402
from fo_jax.bench import core as _benchcore  # noqa: E402


def last_call(events: list, gap_ns: float = 30e3) -> list:
    """The kernels of the last call: the last busy period of the device timeline, where a busy
    period is a run of kernels with no idle gap over gap_ns (calls are host-synchronized)."""
    events = sorted(events, key=lambda e: e[1])
    first, busy_until = 0, -1.0
    for i, e in enumerate(events):
        if e[1] > busy_until + gap_ns:
            first = i
        busy_until = max(busy_until, e[2])
    return events[first:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x8192x2048")
    ap.add_argument("--collectives", nargs="*", default=["reduce_scatter", "all_reduce"])
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra fo_jax configurations, each G:SM:C[:GEMM_CONFIG]")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(_BENCHMARKS, "results"))
    args = ap.parse_args()

    mesh = benchlib.tp_mesh_or_exit("profile_overlap.py")
    gpus = list(mesh.devices.flat)
    tp = len(gpus)
    m, n, k = _benchcore.parse_shape(args.shape)
    dtype = jnp.bfloat16
    x, w = _benchcore.random_operands(mesh, m, n, k, dtype)
    res = benchlib.Results(benchlib.device_info(gpus), echo=False)
    for collective in args.collectives:
        fns = {"fo_jax": _benchcore.build(mesh, collective, "fo_jax")}
        for cfg in bench.parse_configs(args.configs, sweep=False):
            fns[bench.config_label(cfg)] = _benchcore.build(mesh, collective, "fo_jax",
                                                            fo_jax.OverlapConfig(**cfg))
        fns["jax.baseline"] = _benchcore.build(mesh, collective, "baseline")
        print(f"\n=== {collective} {args.shape} TP={tp} (last of {args.calls} calls; us from the "
              "call's first kernel; GEMM-concurrent NCCL = NCCL time inside the GEMM's span)")
        for name, f in fns.items():
            for _ in range(3):
                jax.block_until_ready(f(x, w))
            with tempfile.TemporaryDirectory() as tdir:
                with jax.profiler.trace(tdir):  # back to back, as in the benchmarks
                    jax.block_until_ready([f(x, w) for _ in range(args.calls)])
                per_gpu = benchlib.kernel_events(tdir)
            # Host side: dispatching 20 calls without waiting, per call (if this is as long as
            # the wall-clock time per call, the benchmark is host-bound), then the wall time.
            dispatch_ms, wall_ms = benchlib.dispatch_and_wall_ms(f, x, w)
            print(f"--- {name}: host dispatch {dispatch_ms:.3f} ms/call, wall {wall_ms:.3f} "
                  "ms/call (20 back to back)")
            starts = {gpu: last_call(per_gpu[gpu])[0][1] for gpu in per_gpu}
            first = min(starts.values())
            print("  last call's first kernel, us after the earliest GPU's: " + ", ".join(
                f"GPU{g} {(t - first) / 1e3:.1f}" for g, t in sorted(starts.items())))
            for gpu in sorted(per_gpu):
                evs = last_call(per_gpu[gpu])
                t0 = evs[0][1]
                span = (max(e[2] for e in evs) - t0) / 1e3
                gemm = [e for e in evs if benchlib.kernel_label(e[0]) == "fo_jax GEMM"
                        or "gemm" in e[0].lower() or "nvjet" in e[0]]
                g0, g1 = (gemm[0][1], gemm[-1][2]) if gemm else (t0, t0)
                nccl = [e for e in evs if "nccl" in e[0].lower()]
                inside = sum(max(0, min(e[2], g1) - max(e[1], g0)) for e in nccl) / 1e3
                total_nccl = sum(e[2] - e[1] for e in nccl) / 1e3
                print(f"  GPU{gpu}: span {span:7.1f} us; GEMM {(g1 - g0) / 1e3:7.1f} us; NCCL "
                      f"{total_nccl:7.1f} us in {len(nccl)} kernels, {inside:6.1f} us of it "
                      "during the GEMM")
                if gpu == 0:
                    for e in evs:
                        print(f"      {(e[1] - t0) / 1e3:8.1f} .. {(e[2] - t0) / 1e3:8.1f}  "
                              f"{benchlib.kernel_label(e[0])}  [{e[3][:24]}]")
                for e in evs:
                    res.add(collective=collective, M=m, N=n, K=k, method=name, gpu=gpu,
                            kernel=benchlib.kernel_label(e[0]),
                            start_us=round((e[1] - t0) / 1e3, 1),
                            end_us=round((e[2] - t0) / 1e3, 1), stream=e[3])
    path = os.path.join(args.out, f"overlap_profile_tp{tp}_{res.base['date']}.jsonl")
    res.write_jsonl(path)
    print("wrote", path)


if __name__ == "__main__":
    main()
