"""Trace-time validation of user input: every bad input fails here, naming the problem."""

from __future__ import annotations

import jax
import jax.numpy as jnp

COLLECTIVES = ("reduce_scatter", "all_reduce")
# Input dtypes accepted at all; the CUDA path takes the 16-bit ones (fp32: reference path only).
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
CUDA_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_operands(fn: str, x, w) -> jnp.dtype:
    """Checks ranks, contraction sizes and dtypes of x[M, K] @ w[K, N]; returns the dtype."""
    for name, a in (("x", x), ("w", w)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{fn}: {name} must be a JAX array, got {type(a).__name__}")
        if len(a.shape) != 2:
            raise ValueError(
                f"{fn}: {name} must have rank 2, got shape {tuple(a.shape)} (rank {len(a.shape)})")
    if x.shape[1] != w.shape[0]:
        raise ValueError(
            f"{fn}: contraction sizes differ: x is {tuple(x.shape)} and w is {tuple(w.shape)} "
            f"(x.shape[1]={x.shape[1]} != w.shape[0]={w.shape[0]})")
    dx, dw = jnp.dtype(x.dtype), jnp.dtype(w.dtype)
    if dx != dw:
        raise TypeError(f"{fn}: x and w must have the same dtype, got {dx} and {dw}")
    if dx not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{fn}: unsupported dtype {dx}; supported: {names}")
    return dx


def check_collective(fn: str, collective) -> str:
    if collective not in COLLECTIVES:
        raise ValueError(f"{fn}: unknown collective {collective!r}; expected one of {COLLECTIVES}")
    return collective


def axis_size(fn: str, axis_name) -> int:
    """Size of a mesh axis bound by an enclosing shard_map; ValueError if unbound."""
    if not isinstance(axis_name, str):
        raise TypeError(f"{fn}: axis_name must be a str (one mesh axis), got {axis_name!r}")
    try:
        return int(jax.lax.axis_size(axis_name))
    except NameError as e:
        raise ValueError(
            f"{fn}: axis name {axis_name!r} is not bound here; call it inside "
            f"jax.shard_map(..., mesh=mesh) whose mesh has an axis named {axis_name!r}") from e


def check_scatter_rows(fn: str, m: int, size: int, axis_name: str) -> None:
    if m % size:
        raise ValueError(
            f"{fn}: reduce_scatter needs x.shape[0] (M={m}) divisible by the size of axis "
            f"{axis_name!r} ({size}); got remainder {m % size}")

