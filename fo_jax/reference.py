"""The reference path: the exact definition of each op, built from XLA ops.

overlapped_matmul must equal these on every platform; tests compare both paths against them, and
non-CUDA platforms (or FO_JAX_FORCE_REFERENCE=1) run them directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w accumulated in float32, returned in the input dtype."""
    out = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def overlapped_matmul(x: jax.Array, w: jax.Array, axis_name: str, collective: str) -> jax.Array:
    """psum(x @ w) or psum_scatter(x @ w, scatter_dimension=0, tiled=True) over `axis_name`."""
    partial = matmul(x, w)
    if collective == "all_reduce":
        return jax.lax.psum(partial, axis_name)
    return jax.lax.psum_scatter(partial, axis_name, scatter_dimension=0, tiled=True)


def plain_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` in the input dtype, as users write it: on GPU XLA's 16-bit GEMM accumulates in
    float32 and rounds once (like `matmul`), without `matmul`'s separate conversion pass."""
    return jnp.dot(x, w)


def plain_overlapped_matmul(x: jax.Array, w: jax.Array, axis_name: str,
                            collective: str) -> jax.Array:
    """The same result as `overlapped_matmul` written as users write it: `x @ w` in the input
    dtype (on GPU XLA accumulates 16-bit GEMMs in float32 and rounds once), then the collective.
    fo_jax takes this on CUDA for calls too small to gain from overlap."""
    partial = plain_matmul(x, w)
    if collective == "all_reduce":
        return jax.lax.psum(partial, axis_name)
    return jax.lax.psum_scatter(partial, axis_name, scatter_dimension=0, tiled=True)
