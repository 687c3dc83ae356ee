"""Overlapped GEMM + collective on all local GPUs (TP = number of GPUs), against plain JAX.

Methods (bf16; per-GPU x[M,K] @ w[K,N]; collective over the "tp" axis):
  fo_jax             fo_jax.overlapped_matmul, default configuration (or the best of --sweep)
  fo_jax.sequential  the same kernels without overlap: one group, GEMM on all SMs, then NCCL
  jax.baseline       XLA dot (fp32 accumulation) + psum / psum_scatter, inside shard_map
  gemm_only          XLA dot alone;   comm_only: psum / psum_scatter alone
  fo_jax[...]        with --sweep: each swept configuration (groups, sm_budget, nccl_max_ctas)
Prints speedup over jax.baseline and overlap efficiency
  (T_serial - T_overlap) / (T_serial - max(T_gemm, T_comm)),  T_serial = fo_jax.sequential.
Times: median of 5 x 20 back-to-back calls (benchlib). Writes JSON Lines + a markdown table.

Usage: python benchmarks/bench_overlap.py [--collectives reduce_scatter all_reduce]
       [--shapes MxNxK ...] [--sweep] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import fo_jax  # noqa: E402

DESIGN_SHAPES = ["4096x8192x2048", "8192x8192x2048", "8192x8192x7168", "16384x8192x7168",
                 "16384x8192x2048"]
SWEEP = [dict(num_groups=g, sm_budget=sm, nccl_max_ctas=c)
         for g, sm, c in itertools.product((4, 8, 16), (116, 124), (8, 16))]


def build(mesh, collective, kind, config=None):
    out_spec = P("tp", None) if collective == "reduce_scatter" else P()

    def body(x, w):
        if kind == "fo_jax":
            return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                            config=config)
        if kind == "baseline":
            return fo_jax.reference.overlapped_matmul(x, w, "tp", collective)
        if kind == "gemm_only":
            return fo_jax.reference.matmul(x, w)
        raise ValueError(kind)

    if kind == "gemm_only":
        out_spec = P("tp", None)  # per-device [M, N] stacked
    if kind == "comm_only":
        def comm(y):  # y: this device's [M, N] partial product
            if collective == "reduce_scatter":
                return jax.lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
            return jax.lax.psum(y, "tp")
        return jax.jit(jax.shard_map(comm, mesh=mesh, in_specs=P("tp", None), out_specs=out_spec))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                                 out_specs=out_spec))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", nargs="*", default=DESIGN_SHAPES)
    ap.add_argument("--collectives", nargs="*", default=["reduce_scatter", "all_reduce"])
    ap.add_argument("--sweep", action="store_true", help="also time the SWEEP configurations")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra configurations to time, each GROUPS:SM_BUDGET:NCCL_MAX_CTAS")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2 or not fo_jax.cuda_module_available():
        sys.exit("bench_overlap.py needs 2+ CUDA GPUs and fo_jax's CUDA module")
    tp = len(gpus)
    mesh = Mesh(np.array(gpus), ("tp",))
    dtype = jnp.dtype(jnp.bfloat16)
    res = benchlib.Results(benchlib.device_info(gpus) | {"dtype": str(dtype), "tp": tp})
    table = []
    work = [(c, s) for c in args.collectives for s in args.shapes]
    for i, (collective, s) in enumerate(work):
        m, n, k = (int(v) for v in s.split("x"))
        print(f"[{i + 1}/{len(work)}] {collective} {s}", file=sys.stderr, flush=True)
        rng = np.random.default_rng(i)
        x = jax.device_put(jnp.asarray(rng.standard_normal((m, tp * k)) / np.sqrt(tp * k), dtype),
                           NamedSharding(mesh, P(None, "tp")))
        w = jax.device_put(jnp.asarray(rng.standard_normal((tp * k, n)), dtype),
                           NamedSharding(mesh, P("tp", None)))
        y = jax.device_put(jnp.asarray(rng.standard_normal((tp * m, n)), dtype),
                           NamedSharding(mesh, P("tp", None)))
        assert x.dtype == dtype and w.dtype == dtype and y.dtype == dtype
        fns = {
            "fo_jax": (build(mesh, collective, "fo_jax"), (x, w)),
            "fo_jax.sequential": (build(mesh, collective, "fo_jax", fo_jax.OverlapConfig(
                num_groups=1, sm_budget=1024)), (x, w)),
            "jax.baseline": (build(mesh, collective, "baseline"), (x, w)),
            "gemm_only": (build(mesh, collective, "gemm_only"), (x, w)),
            "comm_only": (build(mesh, collective, "comm_only"), (y,)),
        }
        extra = [dict(zip(("num_groups", "sm_budget", "nccl_max_ctas"), map(int, c.split(":"))))
                 for c in args.configs]
        if args.sweep or extra:
            for cfg in (SWEEP if args.sweep else []) + extra:
                label = "fo_jax[g{num_groups},sm{sm_budget},c{nccl_max_ctas}]".format(**cfg)
                fns[label] = (build(mesh, collective, "fo_jax", fo_jax.OverlapConfig(**cfg)),
                              (x, w))
        ref = np.asarray(fns["jax.baseline"][0](x, w).astype(jnp.float32))
        times = {}
        for name, (f, a) in fns.items():
            out = f(*a)
            assert out.dtype == dtype, (name, out.dtype)
            if name.startswith("fo_jax"):
                got = np.asarray(out.astype(jnp.float32))
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                assert err < 2e-2, f"{name} {collective} {s}: wrong result (rel err {err:.2e})"
            ms = benchlib.time_ms(f, *a)
            times[name] = ms
            res.add(M=m, N=n, K=k, collective=collective, method=name + args.tag,
                    ms=round(ms, 4))
        best = min((v, kk) for kk, v in times.items() if kk.startswith("fo_jax") and
                   kk != "fo_jax.sequential")
        t_ovl, t_ser = times["fo_jax"], times["fo_jax.sequential"]
        floor = max(times["gemm_only"], times["comm_only"])
        eff = (t_ser - t_ovl) / (t_ser - floor) if t_ser > floor else math.nan
        table.append([collective, s, f"{times['jax.baseline']:.3f}", f"{t_ovl:.3f}",
                      f"{times['jax.baseline'] / t_ovl:.2f}x", f"{t_ser:.3f}", f"{floor:.3f}",
                      f"{eff:.2f}", f"{best[1]} {best[0]:.3f}"])
    header = ["collective", "M x N x K", "jax.baseline", "fo_jax", "speedup", "fo_jax.sequential",
              "max(gemm, comm)", "overlap eff.", "best fo_jax"]
    md = (f"{res.base['device']} x{tp}, {res.base['date']}, commit {res.base['commit']}, bf16, "
          "ms (median of 5 x 20 calls)\n\n" + benchlib.markdown_table(header, table))
    for collective in args.collectives:
        sp = [float(r[4][:-1]) for r in table if r[0] == collective]
        if sp:
            md += f"\n{collective}: geometric-mean speedup {math.prod(sp) ** (1 / len(sp)):.3f}x\n"
    print("\n" + md)
    stem = os.path.join(args.out, f"overlap_tp{tp}_{res.base['date']}{args.tag}")
    res.write_jsonl(stem + ".jsonl")
    res.write_markdown(stem + ".md", md)


if __name__ == "__main__":
    main()
