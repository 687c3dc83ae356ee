"""Parameter boxes for layers that run inside jax.shard_map, and their mesh PartitionSpecs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from flax.core import meta
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fo_jax.flax import _logical


class ShardMapPartitioned(nn.Partitioned):
    """`nn.Partitioned` whose unbox applies no sharding constraint.

    Inside `jax.shard_map` a parameter is already a local shard and the mesh axes are Manual, where
    `with_sharding_constraint` is an error; everything else (`nn.get_partition_spec`,
    `nn.get_sharding`, `nn.unbox`) treats it as a plain `nn.Partitioned`.
    """

    def unbox(self, apply_constraint: bool = True) -> Any:
        del apply_constraint
        return self.value


class ShardMapLogicallyPartitioned(nn.LogicallyPartitioned):
    """`nn.LogicallyPartitioned` for fo_jax layers' parameters: logical `names` (e.g. ("mlp",
    "embed")) and, in `rules`, the mapping the layer needs (its sharded name to its axis_name, the
    other names to None).

    - `nn.get_partition_spec` gives the logical PartitionSpec, as for any logically partitioned
      parameter; `nn.logical_to_mesh` maps it under your rules (include
      `fo_jax.flax.logical_rules(axis_name)` or equivalent).
    - `mesh_partition_spec()` and `nn.get_sharding(variables, mesh)` give the mesh layout the layer
      needs, after checking the active `nn.logical_axis_rules` against it (ValueError on a
      mismatch).
    - `unbox` applies no sharding constraint: inside shard_map the value is a local shard.
    - Converted to nnx (`to_nnx_metadata`), `rules` become the Variable's `sharding_rules`.
    """

    def unbox(self, apply_constraint: bool = True) -> Any:
        del apply_constraint
        return self.value

    def mesh_partition_spec(self, fn: str = "fo_jax.flax",
                            what: str = "this parameter") -> PartitionSpec:
        """The mesh PartitionSpec this parameter has in the layer's layout, checked against the
        active logical axis rules (`fn` and `what` name the caller and the parameter in
        errors)."""
        return _logical.mesh_spec(fn, what, self.names, self.rules or ())

    def get_sharding(self, mesh: Mesh) -> jax.sharding.Sharding:
        return NamedSharding(mesh, self.mesh_partition_spec())


def with_partitioning(fn: Callable[..., Any], names: tuple) -> Callable[..., ShardMapPartitioned]:
    """Like `nn.with_partitioning(fn, names)` (names are mesh axes), boxing into
    `ShardMapPartitioned`."""

    def wrapper(*args, **kwargs):
        return ShardMapPartitioned(fn(*args, **kwargs), names)

    return wrapper


def with_logical_partitioning(fn: Callable[..., Any], names: tuple,
                              rules: tuple) -> Callable[..., ShardMapLogicallyPartitioned]:
    """Boxes `fn`'s result into `ShardMapLogicallyPartitioned(value, names, rules=rules)`."""

    def wrapper(*args, **kwargs):
        return ShardMapLogicallyPartitioned(fn(*args, **kwargs), names, rules=rules)

    return wrapper


def leaf_spec(x: Any, fn: str = "fo_jax.flax", what: str = "this parameter") -> PartitionSpec:
    """Mesh PartitionSpec of one variable (box or plain array) under the active rules."""
    if isinstance(x, ShardMapLogicallyPartitioned):
        return x.mesh_partition_spec(fn, what)
    if isinstance(x, nn.LogicallyPartitioned):
        return nn.logical_to_mesh_axes(x.names, x.rules)
    if isinstance(x, meta.Partitioned):
        return x.get_partition_spec()
    return PartitionSpec()


def rules_context(rules: Any):
    """`nn.logical_axis_rules(rules)`, or nothing when rules is None (the active rules apply)."""
    return contextlib.nullcontext() if rules is None else nn.logical_axis_rules(rules)


def partition_specs(variables: Any, rules: Any = None) -> Any:
    """Mesh PartitionSpecs of a variables tree (boxed or not): the shard_map in_specs for applying
    the layers, one PartitionSpec where `nn.get_partition_spec` would put one.

    fo_jax parameters get the layout their layer needs (checked against `rules`, default: the
    active `nn.logical_axis_rules`; ValueError on a mismatch), other logically partitioned
    variables their rules' mapping, `nn.Partitioned` ones their names, the rest P().
    """
    def spec(path, x):
        return leaf_spec(x, "fo_jax.flax.partition_specs",
                         f"parameter {jax.tree_util.keystr(path)}")

    with rules_context(rules):
        return jax.tree_util.tree_map_with_path(
            spec, variables, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))
