"""Logical axis names of fo_jax's tensor-parallel parameters, checked against logical axis rules.

A tensor-parallel layer fixes where each parameter dimension lives inside `jax.shard_map`: one
dimension is split over the layer's `axis_name`, every other one is whole on every device. Its
parameters carry logical names (Flax's convention: "embed", "mlp", "heads", "kv") plus that fixed
mapping (the layer's own rules). Logical axis rules (`nn.logical_axis_rules`) may restate the
mapping; rules that send a dimension anywhere else describe a layout the layer cannot compute, so
they are an error here, not a silent resharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec

# Flax's usual logical names (as in MaxText / T5X rules).
EMBED, MLP, HEADS, KV = "embed", "mlp", "heads", "kv"

Rules = tuple[tuple[str, Any], ...]


def logical_rules(axis_name: str = "tp") -> Rules:
    """Logical axis rules that map the names fo_jax layers shard by default ("mlp" and "heads") to
    the tensor-parallel mesh axis `axis_name`.

    Use them with Flax's logical-axis tools, alone or joined with your own rules:
    `with nn.logical_axis_rules(fo_jax.flax.logical_rules("tp") + my_rules): ...`; then
    `nn.logical_to_mesh(nn.get_partition_spec(variables))` gives the mesh PartitionSpecs.
    Names not listed ("embed", "kv") stay replicated, which is where the layers hold them.
    """
    if not isinstance(axis_name, str):
        raise TypeError(f"fo_jax.flax.logical_rules: axis_name must be a str (one mesh axis), "
                        f"got {axis_name!r}")
    return ((MLP, axis_name), (HEADS, axis_name))


def check_names(fn: str, attr: str, names: Any, ndim: int, sharded_dim: int) -> tuple:
    """Validates a layer's logical names for one parameter of rank `ndim`; returns them as a
    tuple. The sharded dimension needs a name (rules address dimensions by name)."""
    if not isinstance(names, Sequence) or isinstance(names, str) or len(names) != ndim:
        raise ValueError(f"{fn}: {attr} must be a tuple of {ndim} logical axis names (str or "
                         f"None), got {names!r}")
    names = tuple(names)
    for n in names:
        if n is not None and not isinstance(n, str):
            raise TypeError(f"{fn}: {attr} entries must be str or None, got {n!r} in {names!r}")
    if names[sharded_dim] is None:
        raise ValueError(f"{fn}: {attr}[{sharded_dim}] names the dimension this layer shards over "
                         f"its axis_name; it must be a str, got {names!r}")
    dups = sorted({n for n in names if n is not None and names.count(n) > 1})
    if dups:
        raise ValueError(f"{fn}: {attr} repeats logical name(s) {dups} in {names!r}")
    return names


def own_rules(names: tuple, sharded_dim: int | None, axis_name: str) -> Rules:
    """The mapping a layer needs for one parameter: its sharded name to `axis_name`, every other
    name to None (whole on every device). `sharded_dim=None`: replicated parameter."""
    return tuple((n, axis_name if i == sharded_dim else None)
                 for i, n in enumerate(names) if n is not None)


def _as_axes(v: Any) -> tuple:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


def _rule_for(name: str, rules: Sequence, last_wins: bool) -> tuple[bool, Any]:
    hits = [axes for n, axes in rules if n == name]
    if not hits:
        return False, None
    return True, hits[-1] if last_wins else hits[0]


def mesh_spec(fn: str, what: str, names: Sequence, rules: Rules, context: Sequence | None = None,
              *, last_wins: bool = False) -> PartitionSpec:
    """The mesh PartitionSpec of a parameter with logical `names` and its layer's own `rules`.

    `context` (default: the active `nn.logical_axis_rules`) is checked against the layer's rules:
    a name that the context maps elsewhere raises ValueError naming the rule and the fix. The
    context resolves a name by its first rule (linen's priority order) or, with last_wins=True,
    its last (nnx's dict semantics), so the check agrees with what Flax itself would compute.
    """
    own = dict(rules)
    context = get_logical_axis_rules() if context is None else context
    spec = []
    for i, name in enumerate(names):
        want = own.get(name) if name is not None else None
        spec.append(want)
        if name is None or not context:
            continue
        found, got = _rule_for(name, context, last_wins)
        if not found or _as_axes(got) == _as_axes(want):
            continue
        where = f"{name!r} (dimension {i} of {what}, logical axes {tuple(names)})"
        if want is None:
            raise ValueError(
                f"{fn}: logical axis rules map {where} to mesh axes {got!r}, but this layer holds "
                f"that dimension whole on every device inside shard_map; map {name!r} to None, "
                f"or rename the layer's logical axes (kernel_axes=..., ParallelMLP: "
                f"embed_axis=/mlp_axis=)")
        raise ValueError(
            f"{fn}: logical axis rules map {where} to mesh axes {got!r}, but this layer shards "
            f"that dimension over its axis_name={want!r}; map {name!r} to {want!r} "
            f"(fo_jax.flax.logical_rules({want!r}) does), or set the layer's axis_name to the mesh "
            f"axis you want")
    return PartitionSpec(*spec)
