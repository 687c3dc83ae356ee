"""Overlapped fp8 benchmark: overlapped_matmul on float8_e4m3fn operands over a "tp" mesh of 2+ GPUs
against XLA's fp8 dot + collective (the fp8 jax.baseline) and the non-overlapped fp8 call.

Methods per (collective, shape MxNxK per GPU: x[M, K] @ w[K, N], K sharded over tp; for
all_gather x's M rows gathered over tp, w's N columns sharded):
  fo_jax              overlapped_matmul(xq, wq, x_scale=, w_scale=): fo_jax's fp8 GEMM
                      overlapped with the collective of its bf16 output (default transport);
                      all_gather: the overlapped all-gather, opted in, its consumer the fp8 GEMM
                      (one x_scale for all ranks: quantize_fp8's scale, replicated)
  fo_jax.nccl         the same, OverlapConfig(transport="nccl")
  fo_jax.fast         the same as fo_jax with OverlapConfig(fp8_fast_accumulation=True)
  fo_jax.fp8_then_xla fo_jax.matmul's fp8 GEMM (fo_jax's kernel: allow_fallback=False, as the
                      overlap's producer, never the handover to XLA's fp8 dot), then XLA's
                      psum / psum_scatter (the fp8 call before it overlapped); all_gather:
                      XLA's all_gather of the fp8 x first
  jax.baseline        XLA's fp8 dot (lax.dot_general of the fp8 operands, bf16 out, times the
                      scales), then XLA's collective
  fo_jax.bf16         overlapped_matmul on the bf16 operands of the same values (for scale)
  jax.baseline.bf16   XLA's bf16 dot + collective on those
The fp8 weight is stored [N, K] (--w-layout nk, the default: the layout both fp8 GEMMs read;
fo_jax's methods pass w_transposed=True, XLA's dot contracts the weight's last dimension) or
[K, N] (--w-layout kn: each GEMM transposes it per call, which costs XLA's fp8 dot 1.3-3.2x and
fo_jax's 1-38% on one H200, docs/gemm_performance.md "fp8"; the runs before 2026-11-30 used it).
Every fp8 method is checked against jax.baseline first (relative Frobenius error < 2e-2: two
different fp8 GEMMs, each rounding once to bf16, and the collective's bf16 sums), fo_jax.bf16
against jax.baseline.bf16 (the fp8 quantization alone is ~4% from the bf16 values); a failing
method's row carries "error" and no time. Timing: fo_jax.bench's (core.time_ms_interleaved:
wall time per call, trials interleaved with the order rotated), every overlap shape with
OverlapConfig(allow_fallback=False) so that the call overlaps whatever its size.

Output (--out DIR): fp8_overlap_<gpu>_tp<tp>_<date>.jsonl (fo_jax.bench's row fields plus
"collective", "M", "N", "K", "method", "ms", "w_layout") and .md.

Usage: python3 benchmarks/bench_fp8_overlap.py [--tp 4] [--shapes MxNxK ...] [--w-layout nk|kn]
       [--collectives reduce_scatter all_reduce all_gather] [--reps 20] [--trials 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# An installed fo_jax (the one with the compiled CUDA module) comes first; this checkout only where
# none is installed (its source tree has no CUDA module: every fo_jax method would time the
# reference path, which main() refuses).
if importlib.util.find_spec("fo_jax") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fo_jax  # noqa: E402
from fo_jax.bench import core  # noqa: E402

SHAPES = core.DESIGN_SHAPES
NO_FALLBACK = dict(allow_fallback=False)


def weight_spec(collective: str, w_layout: str) -> P:
    """The fp8 weight's sharding: K over tp (reduce-scatter, all-reduce) or N (all-gather), in
    the stored layout."""
    kn = P(None, "tp") if collective == "all_gather" else P("tp", None)
    return kn if w_layout == "kn" else P(*reversed(tuple(kn)))


def build(mesh, collective: str, method: str, w_layout: str = "nk"):
    """A jitted shard_map function of (xq, wq, xs, ws, x16, w16); wq stored as `w_layout`."""
    ag = collective == "all_gather"
    wt = w_layout == "nk"
    out = {"reduce_scatter": P("tp", None), "all_gather": P(None, "tp")}.get(collective, P())
    opt_in = dict(all_gather="overlap") if ag else {}

    def then_collective(x, w, matmul):  # matmul reads w in the stored layout
        if ag:
            return matmul(jax.lax.all_gather(x, "tp", axis=0, tiled=True), w)
        return fo_jax.reference.apply_collective(matmul(x, w), "tp", collective)

    def body(xq, wq, xs, ws, x16, w16):
        if method == "fo_jax":
            cfg = fo_jax.OverlapConfig(**NO_FALLBACK, **opt_in)
        elif method == "fo_jax.nccl":
            cfg = fo_jax.OverlapConfig(transport="nccl", **NO_FALLBACK, **opt_in)
        elif method == "fo_jax.fast":
            cfg = fo_jax.OverlapConfig(fp8_fast_accumulation=True, **NO_FALLBACK, **opt_in)
        elif method == "fo_jax.bf16":
            return fo_jax.overlapped_matmul(x16, w16, axis_name="tp", collective=collective,
                                            config=fo_jax.OverlapConfig(**NO_FALLBACK, **opt_in))
        elif method == "fo_jax.fp8_then_xla":
            return then_collective(xq, wq, lambda x, w: fo_jax.matmul(
                x, w, x_scale=xs, w_scale=ws, w_transposed=wt,
                config=fo_jax.OverlapConfig(**NO_FALLBACK)))
        elif method == "jax.baseline":
            return then_collective(xq, wq, lambda x, w: core.xla_fp8_dot(
                x, w, xs, ws, w_transposed=wt))
        elif method == "jax.baseline.bf16":
            if ag:
                return fo_jax.reference.plain_all_gather_matmul(x16, w16, "tp")[0]
            return fo_jax.reference.plain_overlapped_matmul(x16, w16, "tp", collective)
        else:
            raise ValueError(method)
        return fo_jax.overlapped_matmul(xq, wq, axis_name="tp", collective=collective,
                                        config=cfg, x_scale=xs, w_scale=ws, w_transposed=wt)

    specs = (P("tp", None), P(None, "tp")) if ag else (P(None, "tp"), P("tp", None))
    in_specs = (specs[0], weight_spec(collective, w_layout), P(), P(), *specs)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out))


METHODS = ("fo_jax", "fo_jax.nccl", "fo_jax.fast", "fo_jax.fp8_then_xla", "jax.baseline",
           "fo_jax.bf16", "jax.baseline.bf16")
BF16_METHODS = ("fo_jax.bf16", "jax.baseline.bf16")


def operands(mesh, collective: str, m: int, n: int, k: int, seed: int,
             w_layout: str = "nk") -> tuple:
    """(xq, wq, xs, ws, x16, w16): the bf16 operands of fo_jax.bench and their fp8 quantization
    (one scale per tensor, over all ranks' shards: the all-gather's x_scale is replicated), wq
    stored as `w_layout` (w16 stays [K, N])."""
    draw = core.gather_operands if collective == "all_gather" else core.random_operands
    x16, w16 = draw(mesh, m, n, k, jnp.bfloat16, seed=seed)
    quant = jax.jit(fo_jax.quantize_fp8)
    (xq, xs), (wq, ws) = quant(x16), quant(w16)
    if w_layout == "nk":
        wq = jax.device_put(jnp.transpose(wq),
                            NamedSharding(mesh, weight_spec(collective, w_layout)))
    return xq, wq, xs, ws, x16, w16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=None, help="GPUs (default: all, at most 8)")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--collectives", nargs="+", default=["reduce_scatter", "all_reduce"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--w-layout", choices=["nk", "kn"], default="nk",
                    help="the fp8 weight stored [N, K] (read by both fp8 GEMMs as is) or [K, N]")
    args = ap.parse_args()
    devs = [d for d in jax.devices() if d.platform == "gpu"]
    tp = args.tp or min(len(devs), 8)
    if tp < 2 or len(devs) < tp:
        sys.exit(f"bench_fp8_overlap: needs at least 2 GPUs (tp {tp}, found {len(devs)})")
    if not fo_jax.cuda_module_available():
        from fo_jax import _cuda  # noqa: PLC0415

        sys.exit(f"bench_fp8_overlap: fo_jax from {os.path.dirname(fo_jax.__file__)} has no CUDA "
                 f"module ({_cuda.unavailable_reason()}): its methods would time the reference "
                 "path")
    mesh = Mesh(np.array(devs[:tp]), ("tp",))
    base = core.device_info(devs[:tp]) | {"suite": "fp8_overlap", "tp": tp,
                                          "w_layout": args.w_layout}
    res = core.Results(base)
    table = []
    for i, (collective, s) in enumerate((c, s) for c in args.collectives for s in args.shapes):
        m, n, k = core.parse_shape(s)
        ops = operands(mesh, collective, m, n, k, seed=i, w_layout=args.w_layout)
        fns = {name: build(mesh, collective, name, args.w_layout) for name in METHODS}
        ref = fns["jax.baseline"](*ops)
        ref16 = fns["jax.baseline.bf16"](*ops)
        ok = {}
        for name, f in fns.items():
            try:
                err = float(core.rel_err(f(*ops), ref16 if name in BF16_METHODS else ref))
                assert err < 2e-2, f"wrong result (rel err {err:.2e})"
                ok[name] = f
            except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
                core.progress(f"{collective} {s}: {name}: FAILED {e!r:.200}")
                res.add(collective=collective, M=m, N=n, K=k, method=name, ms=None,
                        error=repr(e)[:500])
        times = core.time_ms_interleaved(ok, *ops, reps=args.reps, trials=args.trials)
        for name, ms in times.items():
            res.add(collective=collective, M=m, N=n, K=k, method=name, ms=round(ms, 4))
        row = [collective, s] + [f"{times[n_]:.3f}" if n_ in times else "error"
                                 for n_ in METHODS]
        for method in ("fo_jax", "fo_jax.fast"):
            if method in times and "jax.baseline" in times:
                row.append(f"{times['jax.baseline'] / times[method]:.2f}x")
            else:
                row.append("-")
        table.append(row)
    stem = os.path.join(args.out, f"fp8_overlap_{base['device'].replace(' ', '_').lower()}"
                                  f"_tp{tp}_{base['date']}")
    res.write_jsonl(stem + ".jsonl")
    md = (f"# Overlapped fp8, {core.provenance(base)}, TP {tp}; ms per call (median of "
          f"{args.trials} trials of {args.reps} calls)\n\n"
          + "jax.baseline is XLA's fp8 dot at default precision, which accumulates fast (as "
          "fo_jax.fast does; fo_jax accumulates in float32). The fp8 weight is stored "
          f"{'[N, K]' if args.w_layout == 'nk' else '[K, N]'} for every fp8 method.\n\n"
          + core.markdown_table(["collective", "MxNxK", *METHODS, "baseline / fo_jax",
                                 "baseline / fo_jax.fast"], table))
    res.write_markdown(stem + ".md", md)
    print(md)


if __name__ == "__main__":
    main()
