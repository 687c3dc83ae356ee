"""The reference path: the exact definition of each op, built from XLA ops.

overlapped_matmul must equal these on every platform; tests compare both paths against them, and
non-CUDA platforms (or FO_JAX_FORCE_REFERENCE=1) run them directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x[..., K] @ w[K, N] accumulated in float32, returned in the input dtype."""
    out = jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())),
                              preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def fp8_matmul(x: jax.Array, w: jax.Array, x_scale: jax.Array, w_scale: jax.Array,
               out_dtype=jnp.bfloat16) -> jax.Array:
    """(x * x_scale) @ (w * w_scale) for fp8 x[..., K], w[K, N] and float32 scalar scales:
    both operands dequantized to float32, multiplied at HIGHEST precision, returned in
    out_dtype."""
    xf = x.astype(jnp.float32) * x_scale
    wf = w.astype(jnp.float32) * w_scale
    out = jax.lax.dot_general(xf, wf, (((x.ndim - 1,), (0,)), ((), ())),
                              precision=jax.lax.Precision.HIGHEST,
                              preferred_element_type=jnp.float32)
    return out.astype(out_dtype)


def apply_collective(y: jax.Array, axis_name: str, collective: str) -> jax.Array:
    """psum(y) for "all_reduce", psum_scatter(y, scatter_dimension=0, tiled=True) for
    "reduce_scatter", over `axis_name`."""
    if collective == "all_reduce":
        return jax.lax.psum(y, axis_name)
    return jax.lax.psum_scatter(y, axis_name, scatter_dimension=0, tiled=True)


def overlapped_matmul(x: jax.Array, w: jax.Array, axis_name: str, collective: str) -> jax.Array:
    """psum(x @ w) or psum_scatter(x @ w, scatter_dimension=0, tiled=True) over `axis_name`."""
    return apply_collective(matmul(x, w), axis_name, collective)


def plain_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` in the input dtype, as users write it: on GPU XLA's 16-bit GEMM accumulates in
    float32 and rounds once (like `matmul`), without `matmul`'s separate conversion pass."""
    return jnp.dot(x, w)


def plain_overlapped_matmul(x: jax.Array, w: jax.Array, axis_name: str,
                            collective: str) -> jax.Array:
    """The same result as `overlapped_matmul` written as users write it: `x @ w` in the input
    dtype (on GPU XLA accumulates 16-bit GEMMs in float32 and rounds once), then the collective.
    fo_jax takes this on CUDA for calls too small to gain from overlap."""
    return apply_collective(plain_matmul(x, w), axis_name, collective)


def all_gather_matmul(x: jax.Array, w: jax.Array, axis_name: str) -> tuple:
    """(all_gather(x, axis_name, axis=0, tiled=True) @ w, the gathered x); the product
    accumulated in float32 and returned in the input dtype."""
    g = jax.lax.all_gather(x, axis_name, axis=0, tiled=True)
    return matmul(g, w), g


def plain_all_gather_matmul(x: jax.Array, w: jax.Array, axis_name: str) -> tuple:
    """all_gather_matmul as users write it: XLA's all_gather, then `g @ w` in the input dtype."""
    g = jax.lax.all_gather(x, axis_name, axis=0, tiled=True)
    return plain_matmul(g, w), g
