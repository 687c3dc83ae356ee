"""The overlap producer's signaling cost on one GPU, bf16 and fp8: fo_jax's GEMM kernel with the
overlap's 8 groups and their counters against the same kernel and groups without counters.

Per shape (x[M, K] @ w[K, N] on one GPU; fp8: float8_e4m3fn operands from fo_jax.quantize_fp8,
the weight stored [N, K], bf16 output), in GPU kernel time (JAX profiler traces, --rounds rounds
of --calls back-to-back calls per method, methods in rotated order: benchlib.kernel_ms_samples;
a method's time is its median over the rounds):
  <dtype>.1group     the kernel with one group, no counters (what fo_jax.matmul runs)
  <dtype>.8groups    8 groups in the overlap's tile order, no counters
  <dtype>.signal     8 groups with counters, the GEMM entry zeroing them (a memset) first
Reports the signaling overhead ("signaling": the signalled kernel's time without the memset
against 8groups, the counters' cost to the overlap's producer, which keeps its counters across
calls and zeroes nothing (csrc/comm/group_counters.h); the criterion of issue 31: <= 2%) and
the group order's (8groups / 1group - 1), each the median over rounds of that round's two
samples' ratio (taken next to each other), with the lowest and highest round beside the
signaling overhead: the spread a single reading carries. "with zeroing" is signal / 8groups - 1
with the memset counted (a producer that zeroes its counters every call). "with zeroing, span"
is the same ratio of the calls' span on the GPU (benchlib.gpu_ms_samples: from the first
kernel's start to the last one's end), which also holds what the GPU does between the kernels:
the memset before each signaling kernel, and the gaps around it. Where the host enqueues calls
slower than the GPU runs them (the 1-group span well above its kernel time) the span holds host
time too. "with zeroing, wall" is the same ratio of wall-clock time per call over --wall-calls
back-to-back calls with no profiler recording (benchlib.wall_ms_samples): the span as a user's
program sees it, wherever the host enqueues a call faster than the GPU runs it ("host ms", the
signalled call's enqueue time, well under "8 groups wall ms"). Give it --rounds 9 or more: in a
run's first rounds wall time climbs while the GPU's clocks settle under the sustained load. (The
stream cost without the memset: dev/probes/signal_cost_probe.cu --chain, "zeroed once".)
"producer runs": whether an overlapped call with this per-GPU GEMM runs the producer at all (its
estimated GEMM reaches the overlap's lowest floor; below it nothing signals): the verdicts count
those rows only, the table shows all. Each method's result is checked against XLA's dot of the same
(dequantized) operands first.

fp8 runs twice: fo_jax's default pick and its pick with OverlapConfig(fp8_fast_accumulation=True)
(--no-fast: the default only). --fp8-configs all|NAME ...: also every named fp8 tile
configuration (gemm_config) as the producer, one table row each (which row signals cheapest).

Usage: python benchmarks/bench_signal_overhead.py [--out benchmarks/results] [--shapes MxNxK ...]
         [--fp8-configs all|NAME ...] [--no-fast] [--rounds 3] [--calls 8]
         [--wall-calls 64]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import fo_jax  # noqa: E402
from fo_jax.fp8 import dequantize  # noqa: E402

LIMIT = 0.02  # signaling overhead criterion (issue 31)


def producer_runs(dtype_name: str, m: int, n: int, k: int, fast: bool) -> bool:
    """Whether an overlapped call with this per-GPU GEMM runs the producer on some transport:
    its estimated GEMM time reaches the lowest overlap floor (the copy engine's); below it the
    call is a plain GEMM then XLA's collective (fo_jax/_paths.py), and nothing signals."""
    from fo_jax import _paths  # noqa: PLC0415

    cfg = fo_jax.OverlapConfig(fp8_fast_accumulation=fast)
    t_gemm = _paths.overlap_gemm_seconds(dtype_name, cfg, "reduce_scatter", m, n, k)
    return _paths._too_small(cfg, t_gemm, "copy_engine") is None


def methods_for(dtype_name: str, m: int, n: int, k: int, seed: int, dev,
                gemm_config: str | None = None, fast: bool = False) -> tuple:
    """({method: f(x, w)}, x, w, reference, config name): the three variants of one dtype, on
    the tile configuration fo_jax chooses (with fp8 fast accumulation if `fast`) or on
    `gemm_config`."""
    from fo_jax import _cuda_ops, _plan  # noqa: PLC0415

    x, w = benchlib.gemm_operands(m, n, k, jnp.bfloat16, dev, seed)
    ref = np.asarray(jnp.dot(x, w, preferred_element_type=jnp.float32))

    def plan(groups, dtype):
        cfg = (_plan.row_config(gemm_config, num_groups=groups) if gemm_config
               else fo_jax.OverlapConfig(num_groups=groups, fp8_fast_accumulation=fast))
        return _plan.plan_gemm("bench", dtype, m, n, k, 1, cfg, groups, 0)

    if dtype_name == "bfloat16":
        p1, p8 = plan(1, jnp.bfloat16), plan(8, jnp.bfloat16)
        fns = {
            "1group": lambda a, b: _cuda_ops.signaling_gemm(a, b, p1, 1, False)[0],
            "8groups": lambda a, b: _cuda_ops.signaling_gemm(a, b, p8, 1, False)[0],
            "signal": lambda a, b: _cuda_ops.signaling_gemm(a, b, p8, 1, True)[0],
        }
        return {f"bf16.{k}": jax.jit(f) for k, f in fns.items()}, x, w, ref, p8.config_name
    (xq, xs), (wq, ws) = fo_jax.quantize_fp8(x), fo_jax.quantize_fp8(w)
    w_nk = jnp.asarray(wq.T)  # the weight as the fp8 kernel reads it, stored once
    ref = np.asarray(jnp.dot(dequantize(xq, xs), dequantize(wq, ws),
                             preferred_element_type=jnp.float32))
    p1, p8 = plan(1, jnp.float8_e4m3fn), plan(8, jnp.float8_e4m3fn)

    def fp8(p, signal):
        return jax.jit(lambda a, b: _cuda_ops.signaling_gemm_fp8(a, b, xs, ws, p, signal)[0])

    fns = {"fp8.1group": fp8(p1, False), "fp8.8groups": fp8(p8, False),
           "fp8.signal": fp8(p8, True)}
    return fns, xq, w_nk, ref, p8.config_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", nargs="*", default=benchlib.DESIGN_SHAPES)
    ap.add_argument("--fp8-configs", nargs="*", default=[],
                    help="also these fp8 tile configurations as the producer ('all': every one)")
    ap.add_argument("--no-fast", action="store_true",
                    help="skip the fp8 rows with fast accumulation (fo_jax's fast pick)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timing rounds per method (more: a tighter median and spread)")
    ap.add_argument("--calls", type=int, default=8, help="back-to-back calls per round")
    ap.add_argument("--wall-calls", type=int, default=64,
                    help="back-to-back calls per round of the wall-clock timing")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.rounds < 1 or args.calls < 1 or args.wall_calls < 1:
        ap.error("--rounds, --calls and --wall-calls must be at least 1")
    from fo_jax import _plan  # noqa: PLC0415

    fp8_names = [c["name"] for c in _plan.gemm_configs()
                 if "float8_e4m3fn" in c.get("dtypes", ())]
    extra = fp8_names if args.fp8_configs == ["all"] else args.fp8_configs
    # (dtype, forced row or None: fo_jax's choice, fp8 fast accumulation)
    cases = [("bfloat16", None, False), ("float8_e4m3fn", None, False)]
    if not args.no_fast:
        cases.append(("float8_e4m3fn", None, True))
    cases += [("float8_e4m3fn", name, False) for name in extra]
    (dev,) = benchlib.cuda_gpus_or_exit("bench_signal_overhead.py")[:1]
    res = benchlib.Results(benchlib.device_info([dev]))
    # per measure, per dtype label
    lines, worst = [], {"kernel": {}, "zeroing": {}, "span": {}, "wall": {}}
    for i, s in enumerate(args.shapes):
        m, n, k = (int(v) for v in s.split("x"))
        for dt, forced, fast in cases:
            label = dt + (" fast" if fast else "")
            print(f"[{i + 1}/{len(args.shapes)}] {s} {label} {forced or ''}", file=sys.stderr,
                  flush=True)
            fns, a, b, ref, config = methods_for(dt, m, n, k, i, dev, forced, fast)
            for name, f in fns.items():
                got = np.asarray(f(a, b).astype(jnp.float32))
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                assert err < 3e-2, f"{s} {name}: rel err {err:.2e} against XLA's dot"
            samples, spans, alone = benchlib.gpu_ms_samples(fns, a, b, calls=args.calls,
                                                            rounds=args.rounds)
            walls, hosts = benchlib.wall_ms_samples(fns, a, b, calls=args.wall_calls,
                                                    rounds=args.rounds)
            prefix = next(iter(fns)).split(".")[0]
            one, eight, sig = (samples[f"{prefix}.{v}"] for v in ("1group", "8groups", "signal"))
            for name, ms in samples.items():
                res.add(suite="signal_overhead", dtype=dt, M=m, N=n, K=k, method=name,
                        gpu_ms=round(benchlib.median(ms), 4),
                        gpu_ms_rounds=[round(v, 4) for v in ms],
                        kernels_alone_ms=round(benchlib.median(alone[name]), 4),
                        kernels_alone_ms_rounds=[round(v, 4) for v in alone[name]],
                        span_ms=round(benchlib.median(spans[name]), 4),
                        span_ms_rounds=[round(v, 4) for v in spans[name]],
                        wall_ms=round(benchlib.median(walls[name]), 4),
                        wall_ms_rounds=[round(v, 4) for v in walls[name]],
                        host_ms=round(benchlib.median(hosts[name]), 4), config=config,
                        chosen=forced is None,
                        fast_accumulation=fast or config.startswith("fp8fast"))
            overhead, low, high = benchlib.paired_overhead(alone[f"{prefix}.signal"],
                                                           alone[f"{prefix}.8groups"])
            zeroing = benchlib.paired_overhead(sig, eight)[0]
            span_overhead, wall_overhead = (
                benchlib.paired_overhead(d[f"{prefix}.signal"], d[f"{prefix}.8groups"])[0]
                for d in (spans, walls))
            order = benchlib.paired_overhead(eight, one)[0]
            runs = producer_runs(dt, m, n, k, fast)
            if forced is None and runs:  # the criterion: what fo_jax runs as the producer
                for measure, v in (("kernel", overhead), ("zeroing", zeroing),
                                   ("span", span_overhead), ("wall", wall_overhead)):
                    worst[measure][label] = max(worst[measure].get(label, -1.0), v)
            lines.append([s, dt, config + ("" if forced is None else " (forced)"),
                          "yes" if runs else "no"]
                         + [f"{benchlib.median(v):.4f}" for v in
                            (one, eight, alone[f"{prefix}.signal"], sig)]
                         + [f"{order:+.1%}", f"{overhead:+.1%}", f"{low:+.1%} .. {high:+.1%}",
                            f"{zeroing:+.1%}", f"{span_overhead:+.1%}", f"{wall_overhead:+.1%}",
                            f"{benchlib.median(walls[f'{prefix}.8groups']):.4f}",
                            f"{benchlib.median(hosts[f'{prefix}.signal']):.4f}"])
    header = ["MxNxK", "dtype", "config", "producer runs", "1 group ms", "8 groups ms",
              "8 groups + signals ms", "+ zeroing ms", "group order", "signaling",
              "signaling, rounds", "with zeroing", "with zeroing, span", "with zeroing, wall",
              "8 groups wall ms", "host ms (signal)"]
    table = benchlib.markdown_table(header, lines)
    verdicts = [f"{'PASS' if w <= LIMIT else 'FAIL'} signaling overhead {dt}: worst "
                f"{w:+.1%} (limit +{LIMIT:.0%}) where the producer runs; with a memset "
                f"zeroing the counters {worst['zeroing'][dt]:+.1%}, in span "
                f"{worst['span'][dt]:+.1%}, in wall time {worst['wall'][dt]:+.1%}"
                for dt, w in worst["kernel"].items()]
    print(table + "\n" + "\n".join(verdicts))
    gpu = "h200" if "H200" in res.base["device"] else "h100" if "H100" in res.base["device"] \
        else "gpu"
    stem = os.path.join(args.out, f"signal_overhead_{gpu}_{res.base['date']}_"
                                  f"{res.base['commit']}{args.tag}")
    res.write_jsonl(stem + ".jsonl")
    title = f"# {benchlib.provenance(res.base)}\n\n"
    res.write_markdown(stem + ".md", title + f"GPU kernel time per call (JAX profiler, median of "
                       f"{args.rounds} interleaved rounds of {args.calls} calls; the ratios are "
                       f"medians of each round's ratio, with its lowest and highest round; "
                       f"'signaling' compares the kernels alone, as the overlap's producer runs "
                       f"them (its counters are never zeroed between calls), 'with zeroing' "
                       f"counts the GEMM entry's memset of the counters too; "
                       f"'with zeroing, span' is that ratio of the calls' span on the GPU, "
                       f"which also holds what runs between the kernels; 'with zeroing, wall' the "
                       f"same ratio of wall-clock time per call over {args.wall_calls} "
                       f"back-to-back calls without the profiler, where the host's enqueue time "
                       f"per call ('host ms') stays under it).\n\n" + table + "\n"
                       + "\n".join(f"- {v}" for v in verdicts) + "\n")
    print(f"wrote {stem}.jsonl and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
