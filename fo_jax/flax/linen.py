"""flax.linen tensor-parallel layers on top of `fo_jax.overlapped_matmul`.

The layers run inside `jax.shard_map`: they see local shards and name the mesh axis they reduce
over (`axis_name`). Their parameters carry logical axis names (`ShardMapLogicallyPartitioned`)
and the layout each layer needs; see the package docstring for the layouts and helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fo_jax import _checks
from fo_jax.config import OverlapConfig
from fo_jax.flax import _boxes, _init, _logical, _math
from fo_jax.flax._logical import EMBED, HEADS, KV, MLP

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]


def _draw_and_slice(draw: Initializer, dim: int, axis_name: str,
                    global_shape: tuple) -> Initializer:
    """Initializer of this device's shard along `dim`: draws the whole parameter from the key
    (what the unsharded layer draws) and keeps its own slice. Taken by `module.init` called
    inside your own shard_map; `init_sharded` draws only the shard instead."""

    def f(key, shape, dtype=jnp.float32):
        start = jax.lax.axis_index(axis_name) * shape[dim]
        return jax.lax.dynamic_slice_in_dim(draw(key, global_shape, dtype), start, shape[dim],
                                            axis=dim)

    return f


def _param(module: nn.Module, fn: str, name: str, init: Initializer, shape: tuple, dtype: Dtype,
           names: tuple, sharded_dim: int | None, size: int) -> Array:
    """Parameter `name` of local `shape`; dimension `sharded_dim` is split over the module's
    axis_name (of `size` devices), None: replicated. `init(key, global_shape, dtype)` draws it
    as the unsharded layer does. Checks the active logical axis rules against the layout."""
    rules = _logical.own_rules(names, sharded_dim, module.axis_name)
    _logical.mesh_spec(fn, f"parameter {'/'.join((*module.scope.path, name))!r}", names, rules)

    def box(f):
        return _boxes.with_logical_partitioning(f, names, rules)

    if sharded_dim is None:
        return module.param(name, box(init), shape, dtype)
    global_shape = list(shape)
    global_shape[sharded_dim] *= size
    global_shape = tuple(global_shape)
    capture = _init.active_capture()
    # Lifted transforms that do not carry the key collection (nn.scan, nn.vmap) keep it
    # immutable: there the parameter is drawn whole and sliced, as outside init_sharded.
    if (capture is not None and module.scope.is_mutable_collection(_init.KEYS)
            and not module.has_variable("params", name)):
        return capture.param(module, name, box, init, shape, global_shape, dtype)
    return module.param(
        name, box(_draw_and_slice(init, sharded_dim, module.axis_name, global_shape)), shape,
        dtype)


class RowParallelDense(nn.Module):
    """Dense layer whose input features are sharded over `axis_name` (Megatron row-parallel):
    the tensor-parallel twin of `nn.Dense(features)`.

    Each device holds kernel rows [K / P, features] and its slice of the input's last axis
    [..., K / P]; the partial products are reduced by `fo_jax.overlapped_matmul`:

    - collective="all_reduce": output [..., features], replicated over `axis_name`;
    - collective="reduce_scatter": the leading axis is scattered (sequence-parallel layout): an
      input [B, ..., K / P] gives this device's rows [B / P, ..., features].

    The bias (replicated) is added after the collective, to the rows this device holds.

    Parameters (logical names, mesh layout inside shard_map):
      kernel [K, features]: `kernel_axes` (default ("mlp", "embed")), rows split over axis_name.
      bias [features]: (kernel_axes[1],), replicated.

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
      kernel_axes: logical names of the kernel's two dimensions.
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
    kernel_axes: tuple = (MLP, EMBED)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the layer to the local input shard x [..., K / P]."""
        fn = "fo_jax.flax.RowParallelDense"
        size = _checks.axis_size(fn, self.axis_name)
        _checks.check_collective(fn, self.collective)
        names = _logical.check_names(fn, "kernel_axes", self.kernel_axes, 2, 0)
        kernel = _param(self, fn, "kernel", self.kernel_init, (x.shape[-1], self.features),
                        self.param_dtype, names, 0, size)
        bias = None
        if self.use_bias:
            bias = _param(self, fn, "bias", self.bias_init, (self.features,), self.param_dtype,
                          names[1:], None, size)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        return _math.row_parallel(fn, x, kernel, bias, axis_name=self.axis_name,
                                  collective=self.collective, config=self.config)


class ColumnParallelDense(nn.Module):
    """Dense layer whose output features are sharded over `axis_name` (Megatron column-parallel):
    the tensor-parallel twin of `nn.Dense(features)`.

    Each device holds kernel columns [K, features / P] (and the matching bias slice) and computes
    its output slice [..., features / P] with a local GEMM (float32 accumulation); no collective
    in the forward. Under autodiff the input cotangent is summed over `axis_name` (by JAX,
    transposing the replication of the input).

    With `gather_input=True` the input is this device's rows of the sequence-parallel layout
    [A, ..., K] (what `RowParallelDense(collective="reduce_scatter")` returns) and the layer
    computes all_gather(x, axis_name, axis=0, tiled=True) @ kernel through
    `fo_jax.all_gather_matmul`, giving [P * A, ..., features / P]; its backward scatters the
    input cotangent with fo_jax's GEMM + reduce-scatter.

    Parameters (logical names, mesh layout inside shard_map):
      kernel [K, features]: `kernel_axes` (default ("embed", "mlp")), columns split over
        axis_name.
      bias [features]: (kernel_axes[1],), split over axis_name.

    Attributes:
      features: total output features (divisible by the size of `axis_name`).
      axis_name: tensor-parallel mesh axis.
      gather_input: all-gather the input's leading axis over `axis_name` into the GEMM (the
        input is in the sequence-parallel layout that `RowParallelDense(collective=
        "reduce_scatter")` makes).
      use_bias: whether to add a (sharded) bias.
      dtype: computation dtype (default: promoted from input and params).
      param_dtype: parameter dtype.
      kernel_init: initializer of the whole [K, features] kernel.
      bias_init: initializer of the whole [features] bias.
      kernel_axes: logical names of the kernel's two dimensions.
      config: optional `fo_jax.OverlapConfig` passed to `all_gather_matmul` (gather_input=True).
    """

    features: int
    axis_name: str = "tp"
    gather_input: bool = False
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    kernel_axes: tuple = (EMBED, MLP)
    config: OverlapConfig | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the layer; returns this device's output slice [..., features / P]."""
        fn = "fo_jax.flax.ColumnParallelDense"
        size = _checks.axis_size(fn, self.axis_name)
        if self.features % size:
            raise ValueError(f"{fn}: features={self.features} is not divisible by the size of "
                             f"axis {self.axis_name!r} ({size})")
        names = _logical.check_names(fn, "kernel_axes", self.kernel_axes, 2, 1)
        local = self.features // size
        kernel = _param(self, fn, "kernel", self.kernel_init, (x.shape[-1], local),
                        self.param_dtype, names, 1, size)
        bias = None
        if self.use_bias:
            bias = _param(self, fn, "bias", self.bias_init, (local,), self.param_dtype,
                          names[1:], 0, size)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        return _math.column_parallel(fn, x, kernel, bias,
                                     gather_axis=self.axis_name if self.gather_input else None,
                                     config=self.config)


class ParallelMLP(nn.Module):
    """Tensor-parallel transformer MLP: column-parallel up-projection, activation, row-parallel
    down-projection (one collective per block, overlapped with the down-projection GEMM). The
    twin of `Dense(hidden_features, name="up")` -> activation -> `Dense(d_model, name="down")`.

    Layouts (the input and output layouts agree, so blocks chain with residual adds):

    - collective="all_reduce": x [..., d_model] replicated over `axis_name` -> same.
    - collective="reduce_scatter" (sequence parallel): x holds this device's share of the leading
      axis [B / P, ..., d_model]; the up-projection all-gathers it into its GEMM
      (`fo_jax.all_gather_matmul`) and the down-projection reduce-scatters the output back to
      [B / P, ..., d_model] (`fo_jax.overlapped_matmul`).

    Parameters (logical names): up/kernel (embed_axis, mlp_axis) and up/bias (mlp_axis,), split
    over axis_name along mlp_axis; down/kernel (mlp_axis, embed_axis), rows split over axis_name;
    down/bias (embed_axis,), replicated.

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
      config: optional `fo_jax.OverlapConfig` for the down-projection and, sequence parallel,
        the up-projection's all-gather GEMM.
      embed_axis: logical name of d_model (default "embed").
      mlp_axis: logical name of d_ff (default "mlp").
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
    embed_axis: str | None = EMBED
    mlp_axis: str = MLP

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the block; see the class docstring for the layouts."""
        fn = "fo_jax.flax.ParallelMLP"
        _checks.axis_size(fn, self.axis_name)
        _checks.check_collective(fn, self.collective)
        common = {"axis_name": self.axis_name, "use_bias": self.use_bias, "dtype": self.dtype,
                  "param_dtype": self.param_dtype, "kernel_init": self.kernel_init,
                  "bias_init": self.bias_init}
        h = ColumnParallelDense(self.hidden_features,
                                gather_input=self.collective == "reduce_scatter",
                                kernel_axes=(self.embed_axis, self.mlp_axis), config=self.config,
                                name="up", **common)(x)
        h = self.activation(h)
        return RowParallelDense(x.shape[-1], collective=self.collective, config=self.config,
                                kernel_axes=(self.mlp_axis, self.embed_axis), name="down",
                                **common)(h)


class ParallelAttentionOutput(nn.Module):
    """Attention output projection over heads sharded on `axis_name`: row-parallel dense on the
    concatenated heads, the tensor-parallel twin of `nn.DenseGeneral(features, axis=(-2, -1))`.

    The input holds this device's heads [..., heads / P, head_dim]. Output layout and bias as in
    `RowParallelDense`.

    Parameters (logical names, mesh layout inside shard_map):
      kernel [heads, head_dim, features]: `kernel_axes` (default ("heads", "kv", "embed")),
        heads split over axis_name.
      bias [features]: (kernel_axes[2],), replicated.

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
      kernel_axes: logical names of the kernel's three dimensions.
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
    kernel_axes: tuple = (HEADS, KV, EMBED)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Applies the projection to x [..., heads / P, head_dim]."""
        fn = "fo_jax.flax.ParallelAttentionOutput"
        size = _checks.axis_size(fn, self.axis_name)
        if x.ndim < 3:
            raise ValueError(f"{fn}: input must be [..., heads, head_dim] with a leading axis, "
                             f"got {tuple(x.shape)}")
        names = _logical.check_names(fn, "kernel_axes", self.kernel_axes, 3, 0)
        heads, head_dim = x.shape[-2:]
        init = self.kernel_init

        def flat_init(key, shape, dtype):  # as nn.DenseGeneral: on [heads * head_dim, features]
            return jnp.reshape(init(key, (shape[0] * shape[1], shape[2]), dtype), shape)

        kernel = _param(self, fn, "kernel", flat_init, (heads, head_dim, self.features),
                        self.param_dtype, names, 0, size)
        bias = None
        if self.use_bias:
            bias = _param(self, fn, "bias", self.bias_init, (self.features,), self.param_dtype,
                          names[2:], None, size)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        x = x.reshape(*x.shape[:-2], heads * head_dim)
        return _math.row_parallel(fn, x, kernel.reshape(heads * head_dim, self.features), bias,
                                  axis_name=self.axis_name, collective=self.collective,
                                  config=self.config)
