"""flax.nnx tensor-parallel transformer layers: `ParallelSelfAttention` and
`ParallelTransformerBlock`, the nnx twins of `fo_jax.flax.ParallelSelfAttention` and
`fo_jax.flax.ParallelTransformerBlock` (same math, layouts and parameter names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import meta

from fo_jax import _checks
from fo_jax.config import OverlapConfig
from fo_jax.flax import _block, _logical
from fo_jax.flax._logical import EMBED, HEADS, KV, MLP
from fo_jax.nnx.layers import (
    ColumnParallelDense,
    ParallelAttentionOutput,
    ParallelMLP,
    default_bias_init,
    default_kernel_init,
)

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]


class ParallelSelfAttention(nnx.Module):
    """Multi-head self-attention with its heads split over `axis_name`: the twin of
    `qkv = nnx.Linear(d_model, num_heads * 3 * head_dim)` reshaped to [..., num_heads, 3,
    head_dim], `jax.nn.dot_product_attention(q, k, v, is_causal=causal)`, then
    `out = nnx.LinearGeneral((num_heads, head_dim), d_model, axis=(-2, -1))`, held as attributes
    `qkv` (a `ColumnParallelDense`) and `out` (a `ParallelAttentionOutput`). Layouts as
    `fo_jax.flax.ParallelSelfAttention`.

    Args:
      d_model: input and output features. num_heads: total heads (divisible by the size of
        `axis_name`). head_dim: per-head width (default d_model / num_heads).
      axis_name, collective, causal, sequence_first, use_bias, dtype, param_dtype, kernel_init,
        bias_init, config, embed_axis, heads_axis, kv_axis: as
        `fo_jax.flax.ParallelSelfAttention`.
      rngs: `nnx.Rngs` (qkv's keys, then out's).
    """

    def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
                 axis_name: str = "tp", collective: str = "reduce_scatter",
                 causal: bool = False, sequence_first: bool = False, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init,
                 bias_init: Initializer = default_bias_init, config: OverlapConfig | None = None,
                 embed_axis: str | None = EMBED, heads_axis: str = HEADS,
                 kv_axis: str | None = KV, rngs: nnx.Rngs):
        fn = "fo_jax.nnx.ParallelSelfAttention"
        _checks.check_collective(fn, collective)
        self.head_dim = _block.head_dim(fn, d_model, num_heads, head_dim)
        self.num_heads, self.axis_name = num_heads, axis_name
        self.causal, self.sequence_first = causal, sequence_first
        common = {"axis_name": axis_name, "use_bias": use_bias, "dtype": dtype,
                  "param_dtype": param_dtype, "kernel_init": kernel_init,
                  "bias_init": bias_init, "config": config, "rngs": rngs}
        self.qkv = ColumnParallelDense(d_model, num_heads * 3 * self.head_dim,
                                       gather_input=collective == "reduce_scatter",
                                       kernel_axes=(embed_axis, heads_axis), **common)
        self.out = ParallelAttentionOutput(num_heads, self.head_dim, d_model,
                                           collective=collective,
                                           kernel_axes=(heads_axis, kv_axis, embed_axis),
                                           **common)

    def __call__(self, x: Array) -> Array:
        """Applies the attention to x [batch, seq, d_model] ([seq, batch, d_model] with
        sequence_first); for reduce_scatter this device's rows of the leading axis."""
        fn = "fo_jax.nnx.ParallelSelfAttention"
        size = _checks.axis_size(fn, self.axis_name)
        _block.check_input(fn, x, self.sequence_first)
        local = _block.check_heads(fn, self.num_heads, size, self.axis_name)
        q, k, v = _block.split_qkv(self.qkv(x), local, self.head_dim)
        return self.out(_block.attend(q, k, v, causal=self.causal,
                                      sequence_first=self.sequence_first))


def _norm(fn: str, kind: str, d_model: int, epsilon: float, embed_axis: str | None,
          axis_name: str, dtype: Dtype | None, param_dtype: Dtype,
          rngs: nnx.Rngs) -> nnx.Module:
    """nnx.LayerNorm / nnx.RMSNorm with replicated parameters named (embed_axis,)."""
    metadata = {}
    if embed_axis is not None:
        names = (embed_axis,)
        rules = _logical.own_rules(names, None, axis_name)
        _logical.mesh_spec(fn, f"{kind} parameters", names, rules, last_wins=True)
        eager = nnx.using_eager_sharding() and meta.global_mesh_defined()
        metadata = {"out_sharding": names, "sharding_rules": rules, "eager_sharding": eager}
    common = dict(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                  scale_metadata=metadata, rngs=rngs)
    if kind == "rmsnorm":
        return nnx.RMSNorm(d_model, **common)
    return nnx.LayerNorm(d_model, bias_metadata=metadata, **common)


class ParallelTransformerBlock(nnx.Module):
    """A pre-norm transformer block, tensor parallel over `axis_name`:

        x = x + attention(ln1(x)); x = x + mlp(ln2(x))

    with attributes `ln1`, `attention` (`ParallelSelfAttention`), `ln2` (nnx.LayerNorm or
    nnx.RMSNorm, replicated parameters named (embed_axis,)) and `mlp` (`ParallelMLP`): the twin
    of the same block built from nnx.LayerNorm, nnx.Linear / nnx.LinearGeneral and
    `jax.nn.dot_product_attention` in the same order. Layouts as
    `fo_jax.flax.ParallelTransformerBlock` (sequence parallel by default: input and output are
    this device's rows of the leading axis).

    Args:
      d_model: features. num_heads: total heads. mlp_features: d_ff.
      head_dim, axis_name, collective, causal, sequence_first, norm, norm_epsilon, activation,
        use_bias, dtype, param_dtype, kernel_init, bias_init, config, embed_axis, heads_axis,
        kv_axis, mlp_axis: as `fo_jax.flax.ParallelTransformerBlock`.
      rngs: `nnx.Rngs` (ln1, attention, ln2, mlp, in that order).
    """

    def __init__(self, d_model: int, num_heads: int, mlp_features: int, *,
                 head_dim: int | None = None, axis_name: str = "tp",
                 collective: str = "reduce_scatter", causal: bool = False,
                 sequence_first: bool = False, norm: str = "layernorm",
                 norm_epsilon: float = 1e-6, activation: Callable[[Array], Array] = nnx.gelu,
                 use_bias: bool = True, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, kernel_init: Initializer = default_kernel_init,
                 bias_init: Initializer = default_bias_init, config: OverlapConfig | None = None,
                 embed_axis: str | None = EMBED, heads_axis: str = HEADS,
                 kv_axis: str | None = KV, mlp_axis: str = MLP, rngs: nnx.Rngs):
        fn = "fo_jax.nnx.ParallelTransformerBlock"
        _checks.check_collective(fn, collective)
        _block.check_norm(fn, norm)
        self.axis_name, self.sequence_first = axis_name, sequence_first
        common = {"axis_name": axis_name, "collective": collective, "use_bias": use_bias,
                  "dtype": dtype, "param_dtype": param_dtype, "kernel_init": kernel_init,
                  "bias_init": bias_init, "config": config, "embed_axis": embed_axis,
                  "rngs": rngs}
        norm_args = (fn, norm, d_model, norm_epsilon, embed_axis, axis_name, dtype, param_dtype,
                     rngs)
        self.ln1 = _norm(*norm_args)
        self.attention = ParallelSelfAttention(d_model, num_heads, head_dim=head_dim,
                                               causal=causal, sequence_first=sequence_first,
                                               heads_axis=heads_axis, kv_axis=kv_axis, **common)
        self.ln2 = _norm(*norm_args)
        self.mlp = ParallelMLP(d_model, mlp_features, activation=activation, mlp_axis=mlp_axis,
                               **common)

    def __call__(self, x: Array) -> Array:
        """Applies the block; see the class docstring for the layouts."""
        fn = "fo_jax.nnx.ParallelTransformerBlock"
        _checks.axis_size(fn, self.axis_name)
        _block.check_input(fn, x, self.sequence_first)
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))
