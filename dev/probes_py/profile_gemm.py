"""Kernel-level GEMM profile: which GPU kernels XLA's dot and fo_jax's GEMM run, and for how long.

The wall-clock harness (bench_gemm.py) times whole calls back to back; this script records JAX
profiler traces (CUPTI) of the same calls and reports, per method and shape, every GPU kernel the
call launched with its median device duration, plus the custom call / fusion XLA chose for the
dot (from the optimized HLO). Methods alternate (one short trace each, --rounds times, the order
rotated every round) so clock and power drift hit all alike.

Usage: python dev/probes_py/profile_gemm.py [--shapes MxNxK ...] [--configs NAME ...] [--out DIR]
Writes <out>/gemm_profile_<date>.jsonl (one row per method, shape and kernel).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, _BENCHMARKS)  # benchlib
import benchlib  # noqa: E402

import fo_jax  # noqa: E402

# The design shapes plus one with partial tiles in M and N.
SHAPES = benchlib.DESIGN_SHAPES + ["6000x5000x3000"]


def hlo_summary(fn, *args) -> str:
    """The GEMM XLA picked: custom-call targets and GEMM fusion configs of the optimized HLO."""
    text = fn.lower(*args).compile().as_text()
    found = []
    for line in text.splitlines():
        if "custom_call_target" in line or "triton_gemm_config" in line or "__cudnn" in line:
            target = re.search(r'custom_call_target="([^"]+)"', line)
            cfg = re.search(r'"triton_gemm_config":\{[^}]*\}', line)
            algo = re.search(r'"selected_algorithm":"?(-?\d+)', line)
            found.append(" ".join(x for x in [
                target.group(1) if target else "", cfg.group(0) if cfg else "",
                f"algorithm={algo.group(1)}" if algo else ""] if x))
    return "; ".join(found) or "(no custom call or GEMM fusion in the optimized HLO)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=SHAPES)
    ap.add_argument("--configs", nargs="*", default=[],
                    help="fo_jax GEMM configs to profile besides the selected one (NAME, or "
                         "NAME/kS: a cooperative one split in S along K)")
    ap.add_argument("--calls", type=int, default=24, help="profiled calls per method")
    ap.add_argument("--rounds", type=int, default=4,
                    help="traces per method (calls / rounds calls each), order rotated per round")
    ap.add_argument("--out", default=os.path.join(_BENCHMARKS, "results"))
    args = ap.parse_args()

    gpus = benchlib.cuda_gpus_or_exit("profile_gemm.py")
    from fo_jax import _cuda_ops, _plan

    dev = gpus[0]
    dtype = jnp.dtype(jnp.bfloat16)
    res = benchlib.Results(benchlib.device_info([dev]) | {"dtype": str(dtype)}, echo=False)
    for i, s in enumerate(args.shapes):
        m, n, k = (int(v) for v in s.split("x"))
        x, w = benchlib.gemm_operands(m, n, k, dtype, dev, seed=i)
        flops = 2.0 * m * n * k

        def gemm(cfg_name=None, groups=1, signal=False, batch=1, splits=None):
            if splits:  # fo_jax.matmul's plan: the only one that splits K
                cfg = fo_jax.OverlapConfig(gemm_config=cfg_name, k_splits=splits)
                plan = _plan.plan_matmul("profile", dtype, m, n, k, cfg)
            else:
                cfg = fo_jax.OverlapConfig(num_groups=groups, gemm_config=cfg_name)
                plan = _plan.plan_gemm("profile", dtype, m // batch, n, k, batch, cfg, groups, 0)
            return plan.config_name, jax.jit(
                lambda a, b: _cuda_ops.signaling_gemm(a, b, plan, batch, signal)[0])

        xla = jax.jit(jnp.dot)
        methods = {"xla.dot": xla}
        name, f = gemm()
        methods[f"fo_jax[{name}]"] = f
        methods[f"fo_jax[{name}] 8 groups"] = gemm(groups=8)[1]
        methods[f"fo_jax[{name}] 8 groups, signals"] = gemm(groups=8, signal=True)[1]
        if m % 32 == 0:  # the reduce-scatter layout of TP = 4: 4 row blocks remapped group-major
            methods[f"fo_jax[{name}] 8 groups, signals, remap"] = gemm(groups=8, signal=True,
                                                                       batch=4)[1]
        for c in args.configs:
            base, _, split = c.partition("/k")  # NAME/kS: split in S along K
            if c != name:
                methods[f"fo_jax[{c}]"] = gemm(base, splits=int(split) if split else None)[1]
        print(f"[{i + 1}/{len(args.shapes)}] {s}: XLA chose {hlo_summary(xla, x, w)}",
              flush=True)
        ref = np.asarray(xla(x, w).astype(jnp.float32))
        for mname, f in methods.items():
            got = np.asarray(f(x, w).astype(jnp.float32))
            if "remap" in mname:  # rows permuted (tests check the layout): compare norms only
                err = abs(float(np.linalg.norm(got) / np.linalg.norm(ref)) - 1.0)
            else:
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            assert err < 1e-2, f"{s} {mname}: differs from xla.dot (rel err {err:.2e})"
            for _ in range(3):
                jax.block_until_ready(f(x, w))
        # One trace per method (kernels are then attributed without guessing), the methods
        # alternating over `rounds` short traces, the order rotated every round, so clock and
        # power drift (these GPUs run GEMMs at their power cap) hit every method alike and no
        # method always follows the same one.
        stats = {mname: collections.defaultdict(list) for mname in methods}
        periods: dict = {mname: [] for mname in methods}
        round_ms: dict = {mname: [] for mname in methods}
        rounds = args.rounds
        names = list(methods)
        for r in range(rounds):
            for mname in benchlib.rotated(names, r):
                f = methods[mname]
                with tempfile.TemporaryDirectory() as tdir:
                    with jax.profiler.trace(tdir):  # back to back, as in the benchmarks
                        jax.block_until_ready([f(x, w) for _ in range(args.calls // rounds)])
                    events = benchlib.kernel_events(tdir).get(0, [])
                for kname, start, end, _ in events:
                    stats[mname][kname].append((end - start) / 1e3)
                # GPU kernel time per call in this round (the spread over rounds shows drift).
                round_ms[mname].append(sum(e[2] - e[1] for e in events) / 1e6
                                       / (args.calls // rounds))
                # Device period per call: first kernel start to last kernel end, over the calls
                # (includes the idle gaps between kernels and calls that kernel times miss).
                if events:
                    first = min(e[1] for e in events)
                    last = max(e[2] for e in events)
                    periods[mname].append((last - first) / 1e3 / (args.calls // rounds))
        ncalls = rounds * (args.calls // rounds)
        # Host side, as the wall-clock harness runs it: time to enqueue 20 calls without waiting,
        # and the wall time of the 20 (if dispatch >= the device period, the harness is host-bound).
        host = {mname: benchlib.dispatch_and_wall_ms(f, x, w) for mname, f in methods.items()}
        for mname in methods:
            total_us = sum(np.median(v) * len(v) / ncalls for v in stats[mname].values())
            period = float(np.median(periods[mname])) if periods[mname] else float("nan")
            print(f"  {mname:36s} {total_us / 1e3:8.4f} ms  {flops / total_us / 1e6:6.1f} TFLOP/s"
                  f"   device period {period / 1e3:8.4f} ms/call   host dispatch "
                  f"{host[mname][0]:.4f}, wall {host[mname][1]:.4f} ms/call")
            print("      per round (ms/call, rotated order): "
                  + " ".join(f"{v:.4f}" for v in round_ms[mname]))
            for kname, durs in stats[mname].items():
                per = len(durs) / ncalls
                print(f"      {np.median(durs):9.1f} us x{per:.0f}  {kname[:150]}")
                res.add(M=m, N=n, K=k, method=mname, kernel=kname,
                        median_us=round(float(np.median(durs)), 2),
                        launches_per_call=len(durs) / ncalls,
                        call_ms=round(total_us / 1e3, 4), period_ms=round(period / 1e3, 4),
                        tflops=round(flops / total_us / 1e6, 1))
    path = os.path.join(args.out, f"gemm_profile_{res.base['date']}.jsonl")
    res.write_jsonl(path)
    print("wrote", path)


if __name__ == "__main__":
    main()
