"""The fo_jax.nnx layers: `RowParallelDense`, `ColumnParallelDense`, `ParallelMLP`,
`ParallelAttentionOutput` (the package docstring says how they are built and applied)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

try:
    from flax import nnx
    from flax.nnx.nn import dtypes
except Exception as e:  # flax.nnx raises AttributeError on jax versions it does not support
    raise ImportError(f"fo_jax.nnx needs flax.nnx, which does not import here (flax.nnx with jax "
                      f"{jax.__version__}: {e!r}); install a flax release that supports this "
                      "jax") from e
from flax.core import meta

from fo_jax import _checks
from fo_jax.config import OverlapConfig
from fo_jax.flax import _logical, _math
from fo_jax.flax._logical import EMBED, HEADS, KV, MLP

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

default_kernel_init = nnx.initializers.lecun_normal()
default_bias_init = nnx.initializers.zeros_init()

__all__ = [
    "ColumnParallelDense",
    "ParallelAttentionOutput",
    "ParallelMLP",
    "RowParallelDense",
]


def _param(fn: str, what: str, value: Array, names: tuple, sharded_dim: int | None,
           axis_name: str) -> nnx.Param:
    """An nnx.Param of the GLOBAL value, annotated with logical names and the layer's mapping
    (checked against the active logical axis rules)."""
    rules = _logical.own_rules(names, sharded_dim, axis_name)
    _logical.mesh_spec(fn, what, names, rules, last_wins=True)
    eager = nnx.using_eager_sharding() and meta.global_mesh_defined()
    return nnx.Param(value, out_sharding=names, sharding_rules=rules, eager_sharding=eager)


def _local(fn: str, param: nnx.Param, what: str) -> Array:
    """The local value of `param` inside shard_map, its layout checked against the active
    logical axis rules."""
    _logical.mesh_spec(fn, what, param.get_metadata("out_sharding"),
                       param.get_metadata("sharding_rules"), last_wins=True)
    return param[...]


def _check_whole(fn: str, what: str, local: int, full: int, dim: int, axis_name: str,
                 size: int) -> None:
    """Raises if a parameter's sharded dimension is not this device's 1/size share of `full`."""
    if local * size != full:
        raise ValueError(
            f"{fn}: {what} has {local} entries along dimension {dim} inside shard_map, expected "
            f"{full} / {size} (split over {axis_name!r}, size {size}); pass the state with "
            f"fo_jax.nnx.partition_specs(state) as the shard_map in_specs")


class RowParallelDense(nnx.Module):
    """Dense layer whose input features are sharded over `axis_name` (Megatron row-parallel):
    the tensor-parallel twin of `nnx.Linear(in_features, out_features)`.

    Inside shard_map each device holds kernel rows [in / P, out] and its slice of the input's
    last axis [..., in / P]; the partial products are reduced by `fo_jax.overlapped_matmul`:
    collective="all_reduce" gives [..., out] replicated over `axis_name`; "reduce_scatter"
    scatters the leading axis ([B, ..., in / P] -> this device's [B / P, ..., out]). The bias
    (replicated) is added after the collective, to the rows this device holds.

    Parameters (global shapes; logical names; layout inside shard_map):
      kernel [in, out]: `kernel_axes` (default ("mlp", "embed")); rows split over axis_name.
      bias [out]: (kernel_axes[1],); replicated.

    Args:
      in_features, out_features: global sizes.
      axis_name, collective, use_bias, dtype, param_dtype, kernel_init, bias_init: as
        `fo_jax.flax.RowParallelDense` (initializers draw the whole parameter, as nnx.Linear).
      config: optional `fo_jax.OverlapConfig` passed to `overlapped_matmul`.
      kernel_axes: logical names of the kernel's two dimensions.
      rngs: `nnx.Rngs`; draws the kernel key then (with a bias) the bias key, as nnx.Linear.
    """

    def __init__(self, in_features: int, out_features: int, *, axis_name: str = "tp",
                 collective: str = "reduce_scatter", use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init,
                 bias_init: Initializer = default_bias_init,
                 config: OverlapConfig | None = None, kernel_axes: tuple = (MLP, EMBED),
                 rngs: nnx.Rngs):
        fn = "fo_jax.nnx.RowParallelDense"
        _checks.check_collective(fn, collective)
        _math.check_config(fn, config)
        names = _logical.check_names(fn, "kernel_axes", kernel_axes, 2, 0)
        self.in_features, self.out_features = in_features, out_features
        self.axis_name, self.collective, self.config = axis_name, collective, config
        self.dtype, self.param_dtype = dtype, param_dtype
        self.kernel = _param(fn, "kernel", kernel_init(rngs.params(), (in_features, out_features),
                                                       param_dtype), names, 0, axis_name)
        self.bias = nnx.data(None)
        if use_bias:
            self.bias = _param(fn, "bias", bias_init(rngs.params(), (out_features,), param_dtype),
                               names[1:], None, axis_name)

    def __call__(self, x: Array) -> Array:
        """Applies the layer to the local input shard x [..., in / P]."""
        fn = "fo_jax.nnx.RowParallelDense"
        size = _checks.axis_size(fn, self.axis_name)
        kernel = _local(fn, self.kernel, "kernel")
        _check_whole(fn, "kernel", kernel.shape[0], self.in_features, 0, self.axis_name, size)
        bias = None if self.bias is None else _local(fn, self.bias, "bias")
        x, kernel, bias = dtypes.promote_dtype((x, kernel, bias), dtype=self.dtype)
        return _math.row_parallel(fn, x, kernel, bias, axis_name=self.axis_name,
                                  collective=self.collective, config=self.config)


class ColumnParallelDense(nnx.Module):
    """Dense layer whose output features are sharded over `axis_name` (Megatron column-parallel):
    the tensor-parallel twin of `nnx.Linear(in_features, out_features)`.

    Inside shard_map each device holds kernel columns [in, out / P] and the matching bias slice,
    and computes its output slice [..., out / P] with a local GEMM (no collective in the forward;
    under autodiff JAX sums the input cotangent over `axis_name`). `gather_input=True` takes this
    device's rows of the sequence-parallel layout and all-gathers them into the GEMM
    (`fo_jax.all_gather_matmul`; its backward scatters the input cotangent with fo_jax's GEMM +
    reduce-scatter).

    Parameters (global shapes; logical names; layout inside shard_map):
      kernel [in, out]: `kernel_axes` (default ("embed", "mlp")); columns split over axis_name.
      bias [out]: (kernel_axes[1],); split over axis_name.

    Args:
      in_features, out_features: global sizes (out divisible by the size of `axis_name`).
      axis_name, gather_input, use_bias, dtype, param_dtype, kernel_init, bias_init, config:
        as `fo_jax.flax.ColumnParallelDense`.
      kernel_axes: logical names of the kernel's two dimensions.
      rngs: `nnx.Rngs`; draws the kernel key then (with a bias) the bias key, as nnx.Linear.
    """

    def __init__(self, in_features: int, out_features: int, *, axis_name: str = "tp",
                 gather_input: bool = False, use_bias: bool = True, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, kernel_init: Initializer = default_kernel_init,
                 bias_init: Initializer = default_bias_init, kernel_axes: tuple = (EMBED, MLP),
                 config: OverlapConfig | None = None, rngs: nnx.Rngs):
        fn = "fo_jax.nnx.ColumnParallelDense"
        _math.check_config(fn, config)
        names = _logical.check_names(fn, "kernel_axes", kernel_axes, 2, 1)
        self.in_features, self.out_features = in_features, out_features
        self.axis_name, self.gather_input, self.config = axis_name, gather_input, config
        self.dtype, self.param_dtype = dtype, param_dtype
        self.kernel = _param(fn, "kernel", kernel_init(rngs.params(), (in_features, out_features),
                                                       param_dtype), names, 1, axis_name)
        self.bias = nnx.data(None)
        if use_bias:
            self.bias = _param(fn, "bias", bias_init(rngs.params(), (out_features,), param_dtype),
                               names[1:], 0, axis_name)

    def __call__(self, x: Array) -> Array:
        """Applies the layer; returns this device's output slice [..., out / P]."""
        fn = "fo_jax.nnx.ColumnParallelDense"
        size = _checks.axis_size(fn, self.axis_name)
        if self.out_features % size:
            raise ValueError(f"{fn}: out_features={self.out_features} is not divisible by the "
                             f"size of axis {self.axis_name!r} ({size})")
        kernel = _local(fn, self.kernel, "kernel")
        _check_whole(fn, "kernel", kernel.shape[1], self.out_features, 1, self.axis_name, size)
        bias = None if self.bias is None else _local(fn, self.bias, "bias")
        x, kernel, bias = dtypes.promote_dtype((x, kernel, bias), dtype=self.dtype)
        return _math.column_parallel(fn, x, kernel, bias,
                                     gather_axis=self.axis_name if self.gather_input else None,
                                     config=self.config)


class ParallelMLP(nnx.Module):
    """Tensor-parallel transformer MLP: `up` (ColumnParallelDense) -> activation -> `down`
    (RowParallelDense); the twin of `nnx.Linear(d, h)` -> activation -> `nnx.Linear(h, d)` held
    as attributes `up` and `down`. Layouts as `fo_jax.flax.ParallelMLP`: collective="all_reduce"
    maps a replicated [..., d] to a replicated [..., d]; "reduce_scatter" (sequence parallel)
    maps this device's rows [B / P, ..., d] to the same layout.

    Parameters (logical names): up.kernel (embed_axis, mlp_axis) and up.bias (mlp_axis,), split
    along mlp_axis; down.kernel (mlp_axis, embed_axis), rows split; down.bias (embed_axis,),
    replicated.

    Args:
      in_features: d_model. hidden_features: d_ff (divisible by the size of `axis_name`).
      axis_name, collective, activation, use_bias, dtype, param_dtype, kernel_init, bias_init,
        config, embed_axis, mlp_axis: as `fo_jax.flax.ParallelMLP`.
      rngs: `nnx.Rngs` (up's keys, then down's).
    """

    def __init__(self, in_features: int, hidden_features: int, *, axis_name: str = "tp",
                 collective: str = "reduce_scatter",
                 activation: Callable[[Array], Array] = nnx.gelu, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init,
                 bias_init: Initializer = default_bias_init, config: OverlapConfig | None = None,
                 embed_axis: str | None = EMBED, mlp_axis: str = MLP, rngs: nnx.Rngs):
        _checks.check_collective("fo_jax.nnx.ParallelMLP", collective)
        common = {"axis_name": axis_name, "use_bias": use_bias, "dtype": dtype,
                  "param_dtype": param_dtype, "kernel_init": kernel_init,
                  "bias_init": bias_init, "rngs": rngs}
        self.axis_name, self.activation = axis_name, activation
        self.up = ColumnParallelDense(in_features, hidden_features,
                                      gather_input=collective == "reduce_scatter",
                                      kernel_axes=(embed_axis, mlp_axis), config=config, **common)
        self.down = RowParallelDense(hidden_features, in_features, collective=collective,
                                     config=config, kernel_axes=(mlp_axis, embed_axis), **common)

    def __call__(self, x: Array) -> Array:
        """Applies the block; see the class docstring for the layouts."""
        _checks.axis_size("fo_jax.nnx.ParallelMLP", self.axis_name)
        return self.down(self.activation(self.up(x)))


class ParallelAttentionOutput(nnx.Module):
    """Attention output projection over heads sharded on `axis_name`: the tensor-parallel twin
    of `nnx.LinearGeneral((num_heads, head_dim), out_features, axis=(-2, -1))`.

    Inside shard_map the input holds this device's heads [..., heads / P, head_dim]; output
    layout and bias as `RowParallelDense`.

    Parameters (global shapes; logical names; layout inside shard_map):
      kernel [heads, head_dim, out]: `kernel_axes` (default ("heads", "kv", "embed")); heads
        split over axis_name. Drawn like nnx.LinearGeneral: kernel_init on the flattened
        [heads * head_dim, out], reshaped.
      bias [out]: (kernel_axes[2],); replicated.

    Args:
      num_heads, head_dim, out_features: global sizes.
      axis_name, collective, use_bias, dtype, param_dtype, kernel_init, bias_init, config: as
        `fo_jax.flax.ParallelAttentionOutput`.
      kernel_axes: logical names of the kernel's three dimensions.
      rngs: `nnx.Rngs`; kernel key, then (with a bias) bias key, as nnx.LinearGeneral.
    """

    def __init__(self, num_heads: int, head_dim: int, out_features: int, *,
                 axis_name: str = "tp", collective: str = "reduce_scatter",
                 use_bias: bool = True, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, kernel_init: Initializer = default_kernel_init,
                 bias_init: Initializer = default_bias_init, config: OverlapConfig | None = None,
                 kernel_axes: tuple = (HEADS, KV, EMBED), rngs: nnx.Rngs):
        fn = "fo_jax.nnx.ParallelAttentionOutput"
        _checks.check_collective(fn, collective)
        _math.check_config(fn, config)
        names = _logical.check_names(fn, "kernel_axes", kernel_axes, 3, 0)
        self.num_heads, self.head_dim, self.out_features = num_heads, head_dim, out_features
        self.axis_name, self.collective, self.config = axis_name, collective, config
        self.dtype, self.param_dtype = dtype, param_dtype
        flat = kernel_init(rngs.params(), (num_heads * head_dim, out_features), param_dtype)
        self.kernel = _param(fn, "kernel", flat.reshape(num_heads, head_dim, out_features), names,
                             0, axis_name)
        self.bias = nnx.data(None)
        if use_bias:
            self.bias = _param(fn, "bias", bias_init(rngs.params(), (out_features,), param_dtype),
                               names[2:], None, axis_name)

    def __call__(self, x: Array) -> Array:
        """Applies the projection to x [..., heads / P, head_dim]."""
        fn = "fo_jax.nnx.ParallelAttentionOutput"
        size = _checks.axis_size(fn, self.axis_name)
        if x.ndim < 3:
            raise ValueError(f"{fn}: input must be [..., heads, head_dim] with a leading axis, "
                             f"got {tuple(x.shape)}")
        kernel = _local(fn, self.kernel, "kernel")
        _check_whole(fn, "kernel", kernel.shape[0], self.num_heads, 0, self.axis_name, size)
        bias = None if self.bias is None else _local(fn, self.bias, "bias")
        heads, head_dim = kernel.shape[:2]
        if x.shape[-2:] != (heads, head_dim):
            raise ValueError(f"{fn}: input heads {tuple(x.shape[-2:])} differ from this device's "
                             f"kernel heads ({heads}, {head_dim}); shard the heads axis of the "
                             f"input over {self.axis_name!r}")
        x, kernel, bias = dtypes.promote_dtype((x, kernel, bias), dtype=self.dtype)
        x = x.reshape(*x.shape[:-2], heads * head_dim)
        return _math.row_parallel(fn, x, kernel.reshape(heads * head_dim, -1), bias,
                                  axis_name=self.axis_name, collective=self.collective,
                                  config=self.config)
