"""Flax (linen) tensor-parallel layers on top of `fo_jax.overlapped_matmul`.

Layers run inside `jax.shard_map`: they see local shards and name the tensor axis they reduce
over. Parameters carry `nn.Partitioned` annotations over that mesh axis, so
`nn.get_partition_spec(variables)` gives the shard_map in_specs (and `nn.get_sharding` the
NamedShardings for jit). Importing this module needs flax; `import fo_jax` does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from fo_jax.config import OverlapConfig
from fo_jax.overlap import overlapped_matmul

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = [
    "ColumnParallelDense",
    "ParallelAttentionOutput",
    "ParallelMLP",
    "RowParallelDense",
    "ShardMapPartitioned",
    "init_sharded",
    "with_partitioning",
]


class ShardMapPartitioned(nn.Partitioned):
    """`nn.Partitioned` whose unbox applies no sharding constraint.

    Inside `jax.shard_map` a parameter is already a local shard and the mesh axes are Manual, where
    `with_sharding_constraint` is an error; everything else (`nn.get_partition_spec`,
    `nn.get_sharding`, `nn.unbox`) treats it as a plain `nn.Partitioned`.
    """

    def unbox(self, apply_constraint: bool = True) -> Any:
        del apply_constraint
        return self.value


def with_partitioning(fn: Initializer, names: tuple) -> Callable[..., ShardMapPartitioned]:
    """Like `nn.with_partitioning(fn, names)`, boxing into `ShardMapPartitioned`."""

    def wrapper(*args, **kwargs):
        return ShardMapPartitioned(fn(*args, **kwargs), names)

    return wrapper


def _sharded_init(init: Initializer, axis_name: str, dim: int,
                  full_shape: Callable[[tuple], tuple] | None = None) -> Initializer:
    """Initializer of one shard along `dim`: every device draws the whole parameter from the same
    key (exactly what the unsharded layer would draw) and keeps its own slice, so a tensor-parallel
    model initializes to the same values as its unsharded twin. Costs one full copy per device at
    init time only."""

    def f(key, shape, dtype=jnp.float32):
        n = jax.lax.axis_size(axis_name)
        whole = list(shape)
        whole[dim] *= n
        value = init(key, tuple(whole), dtype) if full_shape is None else jnp.reshape(
            init(key, full_shape(tuple(whole)), dtype), whole)
        start = jax.lax.axis_index(axis_name) * shape[dim]
        return jax.lax.dynamic_slice_in_dim(value, start, shape[dim], axis=dim)

    return f


def _row_parallel(x: Array, kernel: Array, bias: Array | None, *, axis_name: str,
                  collective: str, dtype: Dtype | None, config: OverlapConfig | None):
    """y = collective(x @ kernel) + bias over the last axis of x; kernel is [K_local, N]."""
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=dtype)
    lead = x.shape[:-1]
    if collective == "reduce_scatter":
        n = jax.lax.axis_size(axis_name)
        if not lead or lead[0] % n:
            raise ValueError(
                f"fo_jax.flax: reduce_scatter scatters the leading axis of the input over "
                f"{axis_name!r} (size {n}); it must exist and be divisible by {n}, got input "
                f"shape {tuple(x.shape)}")
        lead = (lead[0] // n, *lead[1:])
    y = overlapped_matmul(x.reshape(-1, x.shape[-1]), kernel, axis_name=axis_name,
                          collective=collective, config=config)
    y = y.reshape(*lead, kernel.shape[-1])
    return y if bias is None else y + bias  # after the collective: added once, to own rows


class RowParallelDense(nn.Module):
    """Dense layer whose input features are sharded over `axis_name` (Megatron row-parallel).

    Each device holds kernel rows [K_local, features] and its slice of the input's last axis; the
    partial products are reduced by `fo_jax.overlapped_matmul`:

    - collective="all_reduce": output [..., features], replicated over `axis_name`;
    - collective="reduce_scatter": the leading axis is scattered (sequence-parallel layout): an
      input [B, ..., K_local] gives this device's rows [B / P, ..., features].

    The bias (replicated) is added after the collective, to the rows this device holds.

    Attributes:
      features: output features (not sharded).
      axis_name: tensor-parallel mesh axis (bound by the enclosing shard_map).
      collective: "reduce_scatter" or "all_reduce".
      use_bias: whether to add a bias.
      dtype: computation dtype (default: promoted from input and params).
      param_dtype: parameter dtype.
      kernel_init: initializer of the whole [K, features] kernel.
      bias_init: bias initializer.
      config: optional `fo_jax.OverlapConfig` passed to `overlapped_matmul`.
    """

    features: int
    axis_name: str = "tp"
    collective: str = "reduce_scatter"
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    config: OverlapConfig | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the layer to the local input shard x [..., K_local]."""
        kernel = self.param(
            "kernel",
            with_partitioning(_sharded_init(self.kernel_init, self.axis_name, 0),
                                 (self.axis_name, None)),
            (x.shape[-1], self.features), self.param_dtype)
        bias = None
        if self.use_bias:
            bias = self.param("bias", with_partitioning(self.bias_init, (None,)),
                              (self.features,), self.param_dtype)
        return _row_parallel(x, kernel, bias, axis_name=self.axis_name,
                             collective=self.collective, dtype=self.dtype, config=self.config)


class ColumnParallelDense(nn.Module):
    """Dense layer whose output features are sharded over `axis_name` (Megatron column-parallel).

    Each device holds kernel columns [K, features / P] (and the matching bias slice) and computes
    its output slice with a local GEMM (float32 accumulation); no collective in the forward. Under
    autodiff the input cotangent is summed over `axis_name` (by JAX, transposing the replication
    of the input).

    Attributes:
      features: total output features (divisible by the size of `axis_name`).
      axis_name: tensor-parallel mesh axis.
      gather_input: all-gather the input's leading axis over `axis_name` first (the input is in
        the sequence-parallel layout that `RowParallelDense(collective="reduce_scatter")` makes).
      use_bias: whether to add a (sharded) bias.
      dtype: computation dtype (default: promoted from input and params).
      param_dtype: parameter dtype.
      kernel_init: initializer of the whole [K, features] kernel.
      bias_init: initializer of the whole [features] bias.
    """

    features: int
    axis_name: str = "tp"
    gather_input: bool = False
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the layer; returns this device's output slice [..., features / P]."""
        n = jax.lax.axis_size(self.axis_name)
        if self.features % n:
            raise ValueError(f"fo_jax.flax.ColumnParallelDense: features={self.features} is not "
                             f"divisible by the size of axis {self.axis_name!r} ({n})")
        local = self.features // n
        if self.gather_input:
            x = jax.lax.all_gather(x, self.axis_name, axis=0, tiled=True)
        kernel = self.param(
            "kernel",
            with_partitioning(_sharded_init(self.kernel_init, self.axis_name, 1),
                                 (None, self.axis_name)),
            (x.shape[-1], local), self.param_dtype)
        bias = None
        if self.use_bias:
            bias = self.param(
                "bias",
                with_partitioning(_sharded_init(self.bias_init, self.axis_name, 0),
                                     (self.axis_name,)),
                (local,), self.param_dtype)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        # Like nn.Dense: output in the compute dtype (16-bit GEMMs accumulate in float32 inside
        # XLA's GEMM); a float32 output plus a cast would add a conversion pass each way.
        y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
        return y if bias is None else y + bias


class ParallelMLP(nn.Module):
    """Tensor-parallel transformer MLP: column-parallel up-projection, activation, row-parallel
    down-projection (one collective per block, overlapped with the down-projection GEMM).

    Layouts (the input and output layouts agree, so blocks chain with residual adds):

    - collective="all_reduce": x [..., d_model] replicated over `axis_name` -> same.
    - collective="reduce_scatter" (sequence parallel): x holds this device's share of the leading
      axis [B / P, ..., d_model]; it is all-gathered before the up-projection and the output is
      reduce-scattered back to [B / P, ..., d_model].

    Attributes:
      hidden_features: total hidden width d_ff (divisible by the size of `axis_name`).
      axis_name: tensor-parallel mesh axis.
      collective: "reduce_scatter" or "all_reduce".
      activation: elementwise activation.
      use_bias: biases in both projections.
      dtype: computation dtype.
      param_dtype: parameter dtype.
      kernel_init: kernel initializer (both projections).
      bias_init: bias initializer (both projections).
      config: optional `fo_jax.OverlapConfig` for the down-projection.
    """

    hidden_features: int
    axis_name: str = "tp"
    collective: str = "reduce_scatter"
    activation: Callable[[Array], Array] = nn.gelu
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    config: OverlapConfig | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the block; see the class docstring for the layouts."""
        common = {"axis_name": self.axis_name, "use_bias": self.use_bias, "dtype": self.dtype,
                  "param_dtype": self.param_dtype, "kernel_init": self.kernel_init,
                  "bias_init": self.bias_init}
        h = ColumnParallelDense(self.hidden_features,
                                gather_input=self.collective == "reduce_scatter", name="up",
                                **common)(x)
        h = self.activation(h)
        return RowParallelDense(x.shape[-1], collective=self.collective, config=self.config,
                                name="down", **common)(h)


class ParallelAttentionOutput(nn.Module):
    """Attention output projection over heads sharded on `axis_name`: row-parallel dense on the
    concatenated heads, the tensor-parallel twin of `nn.DenseGeneral(features, axis=(-2, -1))`.

    The input holds this device's heads [..., heads / P, head_dim]; the kernel is
    [heads / P, head_dim, features] (partitioned over its first axis). Output layout and bias as in
    `RowParallelDense`.

    Attributes:
      features: output features (d_model).
      axis_name: tensor-parallel mesh axis.
      collective: "reduce_scatter" or "all_reduce".
      use_bias: whether to add a bias (replicated, after the collective).
      dtype: computation dtype.
      param_dtype: parameter dtype.
      kernel_init: initializer, applied like `nn.DenseGeneral` does: to the flattened
        [heads * head_dim, features] kernel.
      bias_init: bias initializer.
      config: optional `fo_jax.OverlapConfig`.
    """

    features: int
    axis_name: str = "tp"
    collective: str = "reduce_scatter"
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    config: OverlapConfig | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the projection to x [..., heads / P, head_dim]."""
        if x.ndim < 3:
            raise ValueError("fo_jax.flax.ParallelAttentionOutput: input must be "
                             f"[..., heads, head_dim] with a leading axis, got {tuple(x.shape)}")
        heads, head_dim = x.shape[-2:]
        init = _sharded_init(self.kernel_init, self.axis_name, 0,
                             full_shape=lambda s: (s[0] * s[1], s[2]))
        kernel = self.param(
            "kernel", with_partitioning(init, (self.axis_name, None, None)),
            (heads, head_dim, self.features), self.param_dtype)
        bias = None
        if self.use_bias:
            bias = self.param("bias", with_partitioning(self.bias_init, (None,)),
                              (self.features,), self.param_dtype)
        x = x.reshape(*x.shape[:-2], heads * head_dim)
        return _row_parallel(x, kernel.reshape(heads * head_dim, self.features), bias,
                             axis_name=self.axis_name, collective=self.collective,
                             dtype=self.dtype, config=self.config)


def init_sharded(module: nn.Module, mesh: Mesh, rngs: Any, *args: Any,
                 in_specs: Sequence[PartitionSpec], check_vma: bool = True) -> Any:
    """Initializes `module` inside `jax.shard_map` and returns its variables as global arrays.

    The variables keep their `nn.Partitioned` boxes; `nn.get_partition_spec(variables)` gives the
    in_specs for applying the module inside shard_map, and `nn.unbox(variables)` the plain arrays.
    Sharded parameters get the values the unsharded layer would draw from the same `rngs`.

    Args:
      module: a module built from fo_jax.flax layers (anything `module.init` accepts).
      mesh: the mesh; its axis names must include the layers' `axis_name`.
      rngs: PRNG key (or dict of keys) for `module.init`, replicated on every device.
      *args: example inputs (global arrays) for `module.init`.
      in_specs: one PartitionSpec per input in `args`.
      check_vma: forwarded to `jax.shard_map`.

    Returns:
      The variables collection, partitioned as annotated (replicated where not annotated).
    """

    def init(rngs, *args):
        return module.init(rngs, *args)

    specs = (PartitionSpec(), *in_specs)
    abstract = jax.eval_shape(
        jax.shard_map(init, mesh=mesh, in_specs=specs, out_specs=PartitionSpec(),
                      check_vma=False), rngs, *args)
    out_specs = nn.get_partition_spec(abstract)
    return jax.jit(jax.shard_map(init, mesh=mesh, in_specs=specs, out_specs=out_specs,
                                 check_vma=check_vma))(rngs, *args)
