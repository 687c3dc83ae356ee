"""Checks and attention math shared by the linen and nnx transformer layers (local heads, inside
shard_map).

The fused QKV projection's output features are laid out [heads, 3, head_dim] (heads outermost):
splitting its columns evenly over the tensor-parallel axis hands each device whole heads, each
with its query, key and value, so one column-parallel GEMM serves all three and the kernel's
initializer (drawn on the whole [d_model, heads * 3 * head_dim] matrix, as `nn.Dense` does) is
partitioned by contiguous column blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NORMS = ("layernorm", "rmsnorm")


def check_norm(fn: str, norm: str) -> str:
    if norm not in NORMS:
        raise ValueError(f"{fn}: unknown norm {norm!r}; expected one of {NORMS}")
    return norm


def head_dim(fn: str, d_model: int, num_heads: int, given: int | None) -> int:
    """The per-head width: `given`, or d_model / num_heads (which must divide)."""
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"{fn}: num_heads must be a positive int, got {num_heads!r}")
    if given is not None:
        if not isinstance(given, int) or given < 1:
            raise ValueError(f"{fn}: head_dim must be a positive int or None, got {given!r}")
        return given
    if d_model % num_heads:
        raise ValueError(f"{fn}: d_model={d_model} is not divisible by num_heads={num_heads}; "
                         f"pass head_dim explicitly")
    return d_model // num_heads


def check_heads(fn: str, num_heads: int, size: int, axis_name: str) -> int:
    """This device's head count: num_heads / size (whole heads per device)."""
    if num_heads % size:
        raise ValueError(f"{fn}: num_heads={num_heads} is not divisible by the size of axis "
                         f"{axis_name!r} ({size}); each device holds whole heads")
    return num_heads // size


def check_input(fn: str, x: jax.Array, sequence_first: bool) -> None:
    if x.ndim != 3:
        layout = "[seq, batch, d_model]" if sequence_first else "[batch, seq, d_model]"
        raise ValueError(f"{fn}: the input must be {layout} (for reduce_scatter: this device's "
                         f"rows of the leading axis), got shape {tuple(x.shape)}")


def split_qkv(qkv: jax.Array, heads: int, head_dim: int) -> tuple:
    """[..., heads * 3 * head_dim] -> (q, k, v), each [..., heads, head_dim]."""
    qkv = qkv.reshape(*qkv.shape[:-1], heads, 3, head_dim)
    return qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
           sequence_first: bool) -> jax.Array:
    """`jax.nn.dot_product_attention` over this device's heads; q, k, v and the result are
    [batch, seq, heads, head_dim] ([seq, batch, ...] with sequence_first)."""
    if sequence_first:
        q, k, v = (jnp.swapaxes(a, 0, 1) for a in (q, k, v))
    o = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    return jnp.swapaxes(o, 0, 1) if sequence_first else o
