"""XLA's scaled fp8 dot: where fo_jax.matmul hands an fp8 GEMM to XLA (fo_jax/_paths.py,
choose_fp8) and the fp8 baseline of the benchmarks (fo_jax/bench/core.py re-exports it).

lax.dot_general of the fp8 operands to bfloat16, which XLA lowers to cuBLASLt's fp8 GEMM writing
bfloat16, then the product of the two scales, rounded to bfloat16, applied to it: XLA folds that
multiply into the GEMM, so the call is the one kernel (its time is the GEMM's alone). The
scales' product carries a relative rounding of at most 2^-9 into the whole output, and as
written the result is rounded twice (the GEMM's bfloat16 output, then the scaled value), where
fo_jax's kernel applies exact scales in its epilogue and rounds once. Precision HIGHEST has
cuBLASLt promote partial sums to fp32, as fo_jax's default kernels do; XLA's default precision
accumulates fast (the whole K sum in the tensor cores' accumulator).

Two other forms cost XLA a second kernel, measured on one H200:
- the scales' product applied in float32 (y.astype(f32) * (xs * ws), then bfloat16): XLA keeps
  the multiply out of the GEMM, in an elementwise fusion that reads and writes the whole output:
  1.03-2.31x the time of this form (1.25x in geomean; 32 shapes with M >= 4096, both
  accumulations, benchmarks/results/gemm_sweep_h200_2026-11-30_5efeae9_fp8_scale_f32.md against
  the earlier fp8 sweeps of the same shapes, which timed this form), the most at short K;
- the operands dequantized in float32 (x.astype(f32) * xs, the pattern XLA's GEMM rewriter folds
  into cuBLASLt's operand scales): cuBLASLt writes a float32 product and a second kernel converts
  it, 1.14-2.43x (benchmarks/results/gemm_sweep_h200_2026-11-30_5af0c2f_fp8_handover.jsonl).
dev/probes_py/xla_fp8_forms.py compares the forms: their compiled calls, speed and error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fp8_dot(x, w, xs, ws, *, w_transposed: bool, precision=None) -> jax.Array:
    """(x * xs) @ (w * ws) in bfloat16: x [M, K] and w [K, N] (or [N, K] with w_transposed, the
    layout XLA's fp8 GEMM reads without a transpose) float8_e4m3fn, xs and ws float32 scalars;
    precision as lax.dot_general's (None: fast accumulation, HIGHEST: fp32 promotion)."""
    y = jax.lax.dot_general(x, w, (((1,), (1 if w_transposed else 0,)), ((), ())),
                            precision=precision, preferred_element_type=jnp.bfloat16)
    return (y * (xs * ws).astype(jnp.bfloat16)).astype(jnp.bfloat16)
