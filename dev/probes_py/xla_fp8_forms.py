"""Ways of writing XLA's scaled fp8 dot: what XLA compiles each to, its speed and its error.

fo_jax.matmul may hand an fp8 GEMM to XLA's fp8 dot where that is faster (fo_jax/_xla_fp8.py).
The handover keeps the accumulation the call asks for (fp32 promotion by default, XLA's fast
accumulation with OverlapConfig(fp8_fast_accumulation=True)) and, ideally, fo_jax's one rounding
to bf16 with exact float32 scales, at the speed of XLA's own fp8 dot. This probe compiles each
form at precision DEFAULT
(fast accumulation) and HIGHEST (promotion), prints the custom calls and fusions of the compiled
module, the GPU kernel time per call at --shapes (interleaved, benchlib.kernel_ms_interleaved)
and, at M = N = 2048 and K = --k, the error against the exact product as
fp8_accumulation_error.py measures it (rel_err, and excess over the correctly rounded bf16
product), on N(0, 1) and U(0, 1) data.

Forms (x [M, K], w [N, K] fp8, xs / ws float32 scalars):
  out_scale_bf16   fo_jax/_xla_fp8.py: dot(x, w) -> bf16, then * bf16(xs * ws) (two roundings,
                   the scales' product rounded to bf16): fo_jax's handover and the benchmarks'
                   baseline; XLA folds the multiply into the GEMM
  out_scale_f32    dot(x, w) -> bf16, then * (xs * ws) in float32, -> bf16 (two roundings, the
                   scales exact); XLA leaves the multiply to a second kernel
  dequant_f32      dot(x.f32 * xs, w.f32 * ws) -> bf16: the dequantization pattern XLA's
                   gemm rewriter folds into cuBLASLt's operand scales, in float32
  f32_out          dot(x, w) -> f32, * (xs * ws), -> bf16 (one rounding, f32 written out)

XLA autotunes every form at every shape (5-35 s each): keep the shapes few.

Usage: python3 dev/probes_py/xla_fp8_forms.py [--shapes 8192x8192x2048 ...] [--k 8192]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import benchlib  # noqa: E402

import fo_jax  # noqa: E402
from fo_jax import _xla_fp8  # noqa: E402

DN = (((1,), (1,)), ((), ()))  # x [M, K] . w [N, K]
BF16, F32 = jnp.bfloat16, jnp.float32


def out_scale_bf16(x, w, xs, ws, precision):
    return _xla_fp8.fp8_dot(x, w, xs, ws, w_transposed=True, precision=precision)


def out_scale_f32(x, w, xs, ws, precision):
    y = jax.lax.dot_general(x, w, DN, precision=precision, preferred_element_type=BF16)
    return (y.astype(F32) * (xs * ws)).astype(BF16)


def dequant_f32(x, w, xs, ws, precision):
    return jax.lax.dot_general(x.astype(F32) * xs, w.astype(F32) * ws, DN, precision=precision,
                               preferred_element_type=BF16)


def f32_out(x, w, xs, ws, precision):
    y = jax.lax.dot_general(x, w, DN, precision=precision, preferred_element_type=F32)
    return (y * (xs * ws)).astype(BF16)


FORMS = {"out_scale_bf16": out_scale_bf16, "out_scale_f32": out_scale_f32,
         "dequant_f32": dequant_f32, "f32_out": f32_out}
PRECISIONS = {"DEFAULT": None, "HIGHEST": jax.lax.Precision.HIGHEST}


def methods() -> dict:
    out = {}
    for fname, f in FORMS.items():
        for pname, p in PRECISIONS.items():
            out[f"{fname}/{pname}"] = jax.jit(lambda x, w, xs, ws, f=f, p=p: f(x, w, xs, ws, p))
    # fo_jax's kernels, never the handover to XLA's fp8 dot that the table may choose.
    out["fo_jax/promotion"] = jax.jit(lambda x, w, xs, ws: fo_jax.matmul(
        x, w, x_scale=xs, w_scale=ws, w_transposed=True,
        config=fo_jax.OverlapConfig(allow_fallback=False)))
    out["fo_jax/fast"] = jax.jit(lambda x, w, xs, ws: fo_jax.matmul(
        x, w, x_scale=xs, w_scale=ws, w_transposed=True,
        config=fo_jax.OverlapConfig(fp8_fast_accumulation=True, allow_fallback=False)))
    return out


def operands(kind: str, m: int, n: int, k: int, seed: int):
    kx, kw = jax.random.split(jax.random.key(seed))
    draw = jax.random.normal if kind == "normal" else jax.random.uniform
    xq, xs = fo_jax.quantize_fp8(draw(kx, (m, k), F32))
    wq, ws = fo_jax.quantize_fp8(draw(kw, (n, k), F32))
    return xq, wq, xs, ws


def compiled_calls(fn, args) -> str:
    """The custom-call targets and fusion kinds of the compiled module, in order."""
    text = fn.lower(*args).compile().as_text()
    entry = text[text.find("ENTRY"):]
    calls = re.findall(r'custom_call_target="([^"]+)"', entry)
    fusions = re.findall(r"kind=(k\w+)", entry)
    return f"custom calls {calls}, fusions {fusions}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*",
                    default=["8192x8192x2048"])
    ap.add_argument("--k", type=int, default=8192)
    args = ap.parse_args()
    fns = methods()
    print(jax.devices()[0].device_kind, jax.__version__, flush=True)

    print(f"\n## compiled (2048x2048x{args.k})", flush=True)
    probe = operands("normal", 2048, 2048, args.k, 0)
    for name, fn in fns.items():
        try:
            print(f"{name:26s} {compiled_calls(fn, probe)}", flush=True)
        except Exception as e:  # noqa: BLE001 (a form XLA rejects is a finding)
            print(f"{name:26s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)

    print("\n## error against the exact product, M = N = 2048", flush=True)
    print(f"{'method':26s} {'data':8s} {'K':>6s} {'rel_err':>9s} {'ideal':>9s} {'excess':>9s}")
    for kind in ("normal", "positive"):
        for k in (args.k,):
            x, w, xs, ws = operands(kind, 2048, 2048, k, seed=k)
            exact = jnp.dot(x.astype(jnp.float64) * xs.astype(jnp.float64),
                            (w.astype(jnp.float64) * ws.astype(jnp.float64)).T,
                            precision=jax.lax.Precision.HIGHEST)
            norm = jnp.linalg.norm(exact)
            ideal = float(jnp.linalg.norm(exact.astype(BF16).astype(jnp.float64) - exact) / norm)
            for name, fn in fns.items():
                y = fn(x, w, xs, ws)
                err = float(jnp.linalg.norm(y.astype(jnp.float64) - exact) / norm)
                excess = float(np.sqrt(max(err * err - ideal * ideal, 0.0)))
                print(f"{name:26s} {kind:8s} {k:6d} {err:9.3e} {ideal:9.3e} {excess:9.3e}",
                      flush=True)

    print("\n## GPU kernel time per call (ms, median of interleaved rounds)", flush=True)
    for spec in args.shapes:
        m, n, k = (int(v) for v in spec.split("x"))
        a = operands("normal", m, n, k, seed=1)
        ms = benchlib.kernel_ms_interleaved(fns, *a)
        base = ms["fo_jax/promotion"]
        print(f"{spec}: " + ", ".join(f"{name} {t:.4f} ({base / t:.3f}x)"
                                      for name, t in ms.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
