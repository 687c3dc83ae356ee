"""XLA's fp8 dot, where fo_jax.matmul hands an fp8 GEMM to XLA (fo_jax/_paths.py, choose_fp8).

Written as the benchmarks' XLA baseline is (fo_jax/bench/core.py, xla_fp8_dot): lax.dot_general
of the fp8 operands to bfloat16, which XLA lowers to cuBLASLt's fp8 GEMM writing bfloat16, then
the two scales in one elementwise fusion, here multiplied in float32 (the scales exact, where the
baseline rounds their product to bfloat16). The result is rounded twice (the GEMM's bfloat16
output, then the scaled value), where fo_jax's kernel scales in its epilogue and rounds once.
The accumulation is the call's: precision HIGHEST (cuBLASLt promotes partial sums to fp32, as
fo_jax's default kernels do) unless fast accumulation was asked for (XLA's default precision).

Dequantizing the operands in float32 instead (x.astype(f32) * xs, the pattern XLA's GEMM
rewriter folds into cuBLASLt's operand scales) rounds once, but XLA then has cuBLASLt write a
float32 product and converts it in a second kernel: 1.14-2.43x the time of the benchmarks'
baseline at the same accumulation on one H200, 5 shapes
(benchmarks/results/gemm_sweep_h200_2026-11-30_5af0c2f_fp8_handover.jsonl).
dev/probes_py/xla_fp8_forms.py compares the forms: their compiled calls, speed and error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fp8_dot(x, w_nk, xs, ws, fast: bool) -> jax.Array:
    """(x * xs) @ (w_nk * ws).T in bfloat16: x [M, K] and w_nk [N, K] float8_e4m3fn, xs and ws
    float32 scalars."""
    precision = None if fast else jax.lax.Precision.HIGHEST
    y = jax.lax.dot_general(x, w_nk, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=jnp.bfloat16)
    return (y.astype(jnp.float32) * (xs * ws)).astype(jnp.bfloat16)
