"""The accumulation error of each compiled fp8 GEMM row, against the exact product.

fo_jax's fp8 kernels write bf16, whose rounding hides a small accumulation error in a relative
Frobenius error. So this probe compares each row's output with the float64 product of the same
fp8 operands rounded once to bf16 (the best any bf16-output kernel can return) and reports:
  rel_err      ||y - exact|| / ||exact||, exact the float64 product (not rounded)
  ideal        the same for the correctly rounded bf16 product: the floor
  excess       sqrt(rel_err^2 - ideal^2): the kernel's own accumulation error
  off_ulp      fraction of elements that differ from the correctly rounded product
on operands N(0, 1) ("normal") and U(0, 1) ("positive": every product adds in the same
direction, the worst case for an accumulator that truncates), for K in --ks.

Usage: python3 dev/probes_py/fp8_accumulation_error.py [--m 2048] [--n 2048]
           [--ks 2048 8192 16384] [--configs NAME ...] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import fo_jax  # noqa: E402
from fo_jax import _plan  # noqa: E402


def operands(kind: str, m: int, n: int, k: int, seed: int):
    kx, kw = jax.random.split(jax.random.key(seed))
    if kind == "normal":
        x = jax.random.normal(kx, (m, k), jnp.float32)
        w = jax.random.normal(kw, (k, n), jnp.float32)
    else:
        x = jax.random.uniform(kx, (m, k), jnp.float32)
        w = jax.random.uniform(kw, (k, n), jnp.float32)
    xq, xs = fo_jax.quantize_fp8(x)
    wq, ws = fo_jax.quantize_fp8(w)
    return xq, jnp.transpose(wq), xs, ws  # w stored [N, K]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--ks", type=int, nargs="*", default=[2048, 8192, 16384])
    ap.add_argument("--configs", nargs="*", default=None,
                    help="fp8 rows (default: every compiled fp8 row)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    names = args.configs or [c["name"] for c in
                             _plan.gemm_configs_for(jnp.float8_e4m3fn, fast_accum=None)]
    out = open(args.out, "w") if args.out else None
    print(f"{jax.devices()[0].device_kind}, M={args.m} N={args.n}", flush=True)
    print(f"{'config':32s} {'data':8s} {'K':>6s} {'rel_err':>9s} {'ideal':>9s} {'excess':>9s} "
          f"{'off_ulp':>8s}", flush=True)
    for kind in ("normal", "positive"):
        for k in args.ks:
            xq, wt, xs, ws = operands(kind, args.m, args.n, k, seed=k)
            exact = jnp.dot(xq.astype(jnp.float64) * xs.astype(jnp.float64),
                            jnp.transpose(wt).astype(jnp.float64) * ws.astype(jnp.float64),
                            precision=jax.lax.Precision.HIGHEST)
            ideal = exact.astype(jnp.bfloat16)
            norm = jnp.linalg.norm(exact)
            ideal_err = float(jnp.linalg.norm(ideal.astype(jnp.float64) - exact) / norm)
            for name in names:
                cfg = _plan.row_config(name)
                y = jax.jit(lambda a, b, s, t, cfg=cfg: fo_jax.matmul(
                    a, b, x_scale=s, w_scale=t, w_transposed=True, config=cfg))(xq, wt, xs, ws)
                err = float(jnp.linalg.norm(y.astype(jnp.float64) - exact) / norm)
                off = float(jnp.mean((y != ideal).astype(jnp.float32)))
                excess = float(np.sqrt(max(err * err - ideal_err * ideal_err, 0.0)))
                print(f"{name:32s} {kind:8s} {k:6d} {err:9.3e} {ideal_err:9.3e} {excess:9.3e} "
                      f"{off:8.4f}", flush=True)
                if out:
                    out.write(json.dumps(dict(config=name, data=kind, M=args.m, N=args.n, K=k,
                                              rel_err=err, ideal=ideal_err, excess=excess,
                                              off_ulp=off,
                                              device=jax.devices()[0].device_kind)) + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
