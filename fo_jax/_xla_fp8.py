"""XLA's fp8 dot, where fo_jax.matmul hands an fp8 GEMM to XLA (fo_jax/_paths.py, choose_fp8).

It keeps the numerics of fo_jax's fp8 kernel: the float32 scales applied exactly and one rounding
to bfloat16, written as the dequantization XLA's GEMM rewriter folds into cuBLASLt's fp8 GEMM
(its operand scales), and the accumulation the call asks for: precision HIGHEST (cuBLASLt
promotes partial sums to fp32, as fo_jax's default kernels do) unless fast accumulation was
asked for (XLA's default precision: the whole K sum in the tensor cores' accumulator).
dev/probes_py/xla_fp8_forms.py compares the ways of writing it: what XLA compiles each to, its
speed and its error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fp8_dot(x, w_nk, xs, ws, fast: bool) -> jax.Array:
    """(x * xs) @ (w_nk * ws).T in bfloat16: x [M, K] and w_nk [N, K] float8_e4m3fn, xs and ws
    float32 scalars."""
    precision = None if fast else jax.lax.Precision.HIGHEST
    return jax.lax.dot_general(x.astype(jnp.float32) * xs, w_nk.astype(jnp.float32) * ws,
                               (((1,), (1,)), ((), ())), precision=precision,
                               preferred_element_type=jnp.bfloat16)
