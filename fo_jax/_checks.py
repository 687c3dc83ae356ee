"""Trace-time validation of user input: every bad input fails here, naming the problem."""

from __future__ import annotations

import jax
import jax.numpy as jnp

COLLECTIVES = ("reduce_scatter", "all_reduce", "all_gather")
# Input dtypes accepted at all; the CUDA path takes the 16-bit ones (fp32: reference path only).
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
CUDA_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_operands(fn: str, x, w, min_x_rank: int = 1) -> jnp.dtype:
    """Checks ranks, contraction sizes and dtypes of x[..., K] @ w[K, N]; returns the dtype."""
    for name, a in (("x", x), ("w", w)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{fn}: {name} must be a JAX array, got {type(a).__name__}")
    if len(w.shape) != 2:
        raise ValueError(
            f"{fn}: w must have rank 2 ([K, N]), got shape {tuple(w.shape)} (rank {len(w.shape)})")
    if len(x.shape) < min_x_rank:
        raise ValueError(
            f"{fn}: x must have rank {min_x_rank} or more ([..., K]), got shape "
            f"{tuple(x.shape)} (rank {len(x.shape)})")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"{fn}: contraction sizes differ: x is {tuple(x.shape)} and w is {tuple(w.shape)} "
            f"(x.shape[-1]={x.shape[-1]} != w.shape[0]={w.shape[0]})")
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


def pmap_binds_a_mesh() -> bool:
    """Whether this JAX's pmap is a shard_map, whose axis is a manual mesh axis; not where
    jax_pmap_shmap_merge exists and is off (as in 0.6), whose pmap binds its axis as vmap does."""
    return bool(jax.config.values.get("jax_pmap_shmap_merge", True))


def mesh_axis_size(fn: str, axis_name) -> int:
    """Size of the axis of an overlapped call's collective: a mesh axis of an enclosing shard_map
    (or pmap). An axis bound by jax.vmap(axis_name=...) names no devices to overlap across, so
    it raises ValueError here, naming the JAX collective that takes it (without this check the
    call fails later inside the batching rules, with JAX's internal errors)."""
    size = axis_size(fn, axis_name)
    mesh = jax.sharding.get_abstract_mesh()
    manual = getattr(mesh, "manual_axes", None)
    # Where pmap binds its axis without a mesh, an axis outside every mesh may be either, and
    # passes.
    if (manual is not None and axis_name not in manual
            and (pmap_binds_a_mesh() or not getattr(mesh, "empty", True))):
        raise ValueError(
            f"{fn}: axis name {axis_name!r} is bound by jax.vmap(axis_name=...), not by a "
            f"shard_map mesh; fo_jax overlaps a collective across the devices of a shard_map "
            f"mesh axis. Over a vmapped axis write the collective in JAX: "
            f"jax.lax.psum(x @ w, {axis_name!r}), jax.lax.psum_scatter(x @ w, {axis_name!r}, "
            f"tiled=True) or jax.lax.all_gather(x, {axis_name!r}, tiled=True) @ w")
    return size


def check_scatter_rows(fn: str, m: int, size: int, axis_name: str) -> None:
    if m % size:
        raise ValueError(
            f"{fn}: reduce_scatter scatters x's first dimension; it needs x.shape[0] ({m}) "
            f"divisible by the size of axis {axis_name!r} ({size}); got remainder {m % size}")


def check_config(fn: str, config, plain: bool = False) -> None:
    """A call's config: an OverlapConfig or None; k_splits > 1 only for a plain GEMM (`plain`:
    fo_jax.matmul), as the overlapped calls' GEMM signals whole tiles."""
    from fo_jax.config import OverlapConfig  # noqa: PLC0415 (config imports nothing of ours)

    if config is not None and not isinstance(config, OverlapConfig):
        raise TypeError(f"{fn}: config must be a fo_jax.OverlapConfig or None, got "
                        f"{type(config).__name__}")
    if not plain and config is not None and (config.k_splits or 1) > 1:
        raise ValueError(
            f"{fn}: OverlapConfig.k_splits applies to fo_jax.matmul only (an overlapped call's "
            f"GEMM signals whole tiles); got k_splits={config.k_splits}")


def trace_platform() -> str:
    """The platform the code being traced will run on: that of the enclosing shard_map's mesh
    (a CPU mesh on a GPU machine runs on CPU), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = getattr(mesh, "abstract_device", None)
    platform = getattr(device, "platform", None) if not mesh.empty else None
    return platform or jax.default_backend()

