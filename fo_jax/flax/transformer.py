"""flax.linen tensor-parallel transformer layers: `ParallelSelfAttention` and
`ParallelTransformerBlock`, built from the layers of `fo_jax.flax.linen`.

Sequence parallel (collective="reduce_scatter", the default): the block's input and output are
this device's rows of the leading axis, so blocks chain. Per block the four tensor-parallel
communication points are fo_jax ops: the QKV and MLP up-projections all-gather their input into
the GEMM (`fo_jax.all_gather_matmul`), the attention output and MLP down-projections
reduce-scatter theirs (`fo_jax.overlapped_matmul`), and the backward pairs each with its mirror.
collective="all_reduce": replicated input and output, one all-reduce after each of the two
row-parallel projections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fo_jax import _checks
from fo_jax.config import OverlapConfig
from fo_jax.flax import _block, _boxes, _logical
from fo_jax.flax._logical import EMBED, HEADS, KV, MLP
from fo_jax.flax.linen import ColumnParallelDense, ParallelAttentionOutput, ParallelMLP

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]


class ParallelSelfAttention(nn.Module):
    """Multi-head self-attention with its heads split over `axis_name` (Megatron attention).

    The twin of `qkv = nn.Dense(num_heads * 3 * head_dim, name="qkv")(x)` reshaped to
    [..., num_heads, 3, head_dim] (query, key, value of each head side by side),
    `jax.nn.dot_product_attention(q, k, v, is_causal=causal)`, then
    `nn.DenseGeneral(d_model, axis=(-2, -1), name="out")`.

    Inside shard_map each device holds whole heads: the QKV kernel's columns of its heads
    (`ColumnParallelDense`, one fused GEMM for query, key and value), attends over them locally,
    and projects them with `ParallelAttentionOutput` (row-parallel over heads).

    Layouts (x is [batch, seq, d_model], or [seq, batch, d_model] with sequence_first=True):

    - collective="reduce_scatter" (sequence parallel): x holds this device's rows of the leading
      axis; the QKV GEMM all-gathers them (`fo_jax.all_gather_matmul`) and the output projection
      reduce-scatters its result back to this device's rows.
    - collective="all_reduce": x replicated over `axis_name`; the output is replicated too.

    Parameters (logical names): qkv/kernel [d_model, num_heads * 3 * head_dim] (embed_axis,
    heads_axis) and qkv/bias, columns split over axis_name; out/kernel [num_heads, head_dim,
    d_model] (heads_axis, kv_axis, embed_axis), heads split; out/bias (embed_axis,), replicated.

    Attributes:
      num_heads: total heads (divisible by the size of `axis_name`).
      head_dim: per-head width (default d_model / num_heads).
      axis_name: tensor-parallel mesh axis.
      collective: "reduce_scatter" or "all_reduce".
      causal: causal mask (`is_causal` of `jax.nn.dot_product_attention`).
      sequence_first: the input is [seq, batch, d_model] (so the sequence is the axis split
        over devices in the sequence-parallel layout) instead of [batch, seq, d_model].
      use_bias: biases in both projections.
      dtype: computation dtype.
      param_dtype: parameter dtype.
      kernel_init: kernel initializer (both projections; the output projection's is applied to
        the flattened [heads * head_dim, d_model] kernel, as `nn.DenseGeneral` does).
      bias_init: bias initializer (both projections).
      config: optional `fo_jax.OverlapConfig` for the all-gather and reduce-scatter GEMMs.
      embed_axis, heads_axis, kv_axis: logical names of d_model, the (fused) heads and head_dim.
    """

    num_heads: int
    head_dim: int | None = None
    axis_name: str = "tp"
    collective: str = "reduce_scatter"
    causal: bool = False
    sequence_first: bool = False
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    config: OverlapConfig | None = None
    embed_axis: str | None = EMBED
    heads_axis: str = HEADS
    kv_axis: str | None = KV

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the attention; see the class docstring for the layouts."""
        fn = "fo_jax.flax.ParallelSelfAttention"
        size = _checks.axis_size(fn, self.axis_name)
        _checks.check_collective(fn, self.collective)
        _block.check_input(fn, x, self.sequence_first)
        d_model = x.shape[-1]
        head_dim = _block.head_dim(fn, d_model, self.num_heads, self.head_dim)
        local = _block.check_heads(fn, self.num_heads, size, self.axis_name)
        common = {"axis_name": self.axis_name, "use_bias": self.use_bias, "dtype": self.dtype,
                  "param_dtype": self.param_dtype, "kernel_init": self.kernel_init,
                  "bias_init": self.bias_init, "config": self.config}
        qkv = ColumnParallelDense(self.num_heads * 3 * head_dim,
                                  gather_input=self.collective == "reduce_scatter",
                                  kernel_axes=(self.embed_axis, self.heads_axis), name="qkv",
                                  **common)(x)
        q, k, v = _block.split_qkv(qkv, local, head_dim)
        o = _block.attend(q, k, v, causal=self.causal, sequence_first=self.sequence_first)
        return ParallelAttentionOutput(d_model, collective=self.collective,
                                       kernel_axes=(self.heads_axis, self.kv_axis,
                                                    self.embed_axis), name="out", **common)(o)


def _norm(module: nn.Module, fn: str, kind: str, epsilon: float, name: str) -> nn.Module:
    """nn.LayerNorm / nn.RMSNorm with replicated parameters named (embed_axis,)."""
    names = (module.embed_axis,)
    rules = _logical.own_rules(names, None, module.axis_name) if names[0] else ()
    if names[0]:
        _logical.mesh_spec(fn, f"parameter {'/'.join((*module.scope.path, name))!r}", names,
                           rules)

    def box(init):
        return _boxes.with_logical_partitioning(init, names, rules) if names[0] else init

    common = dict(epsilon=epsilon, dtype=module.dtype, param_dtype=module.param_dtype,
                  scale_init=box(nn.initializers.ones), name=name)
    if kind == "rmsnorm":
        return nn.RMSNorm(**common)
    return nn.LayerNorm(bias_init=box(nn.initializers.zeros), **common)


class ParallelTransformerBlock(nn.Module):
    """A pre-norm transformer block, tensor parallel over `axis_name`:

        x = x + ParallelSelfAttention(norm(x)); x = x + ParallelMLP(norm(x))

    the twin of the same block written with `nn.LayerNorm` (or `nn.RMSNorm`), `nn.Dense` /
    `nn.DenseGeneral` and `jax.nn.dot_product_attention` (see `ParallelSelfAttention` for the
    attention's layout), with the same parameter names: ln1, attention/{qkv,out}, ln2,
    mlp/{up,down}.

    Layouts (x is [batch, seq, d_model], or [seq, batch, d_model] with sequence_first=True):
    collective="reduce_scatter" (sequence parallel, the default): x and the output are this
    device's rows of the leading axis, and the norms and residual adds run on those rows only;
    collective="all_reduce": x and the output are replicated over `axis_name`. Either way input
    and output layouts agree, so blocks chain.

    The norms' parameters (scale, and LayerNorm's bias) are replicated and named (embed_axis,).

    Attributes:
      num_heads: total attention heads (divisible by the size of `axis_name`).
      mlp_features: the MLP's hidden width d_ff (divisible by the size of `axis_name`).
      head_dim: per-head width (default d_model / num_heads).
      axis_name: tensor-parallel mesh axis.
      collective: "reduce_scatter" or "all_reduce".
      causal: causal self-attention.
      sequence_first: the input is [seq, batch, d_model].
      norm: "layernorm" or "rmsnorm".
      norm_epsilon: the norms' epsilon.
      activation: the MLP's activation.
      use_bias: biases in the projections.
      dtype: computation dtype.
      param_dtype: parameter dtype.
      kernel_init: kernel initializer of every projection.
      bias_init: bias initializer of every projection.
      config: optional `fo_jax.OverlapConfig` for every overlapped GEMM.
      embed_axis, heads_axis, kv_axis, mlp_axis: logical names of d_model, the heads, head_dim
        and d_ff.
    """

    num_heads: int
    mlp_features: int
    head_dim: int | None = None
    axis_name: str = "tp"
    collective: str = "reduce_scatter"
    causal: bool = False
    sequence_first: bool = False
    norm: str = "layernorm"
    norm_epsilon: float = 1e-6
    activation: Callable[[Array], Array] = nn.gelu
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    config: OverlapConfig | None = None
    embed_axis: str | None = EMBED
    heads_axis: str = HEADS
    kv_axis: str | None = KV
    mlp_axis: str = MLP

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the block; see the class docstring for the layouts."""
        fn = "fo_jax.flax.ParallelTransformerBlock"
        _checks.axis_size(fn, self.axis_name)
        _checks.check_collective(fn, self.collective)
        _block.check_norm(fn, self.norm)
        _block.check_input(fn, x, self.sequence_first)
        common = {"axis_name": self.axis_name, "collective": self.collective,
                  "use_bias": self.use_bias, "dtype": self.dtype,
                  "param_dtype": self.param_dtype, "kernel_init": self.kernel_init,
                  "bias_init": self.bias_init, "config": self.config,
                  "embed_axis": self.embed_axis}
        h = _norm(self, fn, self.norm, self.norm_epsilon, "ln1")(x)
        x = x + ParallelSelfAttention(self.num_heads, head_dim=self.head_dim, causal=self.causal,
                                      sequence_first=self.sequence_first,
                                      heads_axis=self.heads_axis, kv_axis=self.kv_axis,
                                      name="attention", **common)(h)
        h = _norm(self, fn, self.norm, self.norm_epsilon, "ln2")(x)
        return x + ParallelMLP(self.mlp_features, activation=self.activation,
                               mlp_axis=self.mlp_axis, name="mlp", **common)(h)
