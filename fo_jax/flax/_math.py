"""The forward math shared by the linen and nnx layers (local shards, inside jax.shard_map)."""

from __future__ import annotations

import jax

from fo_jax import _checks
from fo_jax.config import OverlapConfig
from fo_jax.overlap import all_gather_matmul, overlapped_matmul


def check_config(fn: str, config) -> None:
    if config is not None and not isinstance(config, OverlapConfig):
        raise TypeError(f"{fn}: config must be a fo_jax.OverlapConfig or None, got "
                        f"{type(config).__name__}")


def row_parallel(fn: str, x: jax.Array, kernel: jax.Array, bias: jax.Array | None, *,
                 axis_name: str, collective: str, config: OverlapConfig | None) -> jax.Array:
    """y = collective(x @ kernel) + bias over x's last axis; kernel is the local [K_local, N] shard
    and x, kernel, bias already share the compute dtype.

    reduce_scatter scatters x's leading axis (rows are flattened in order, so scattering the
    flattened rows is scattering the leading axis when it divides evenly)."""
    _checks.check_collective(fn, collective)
    check_config(fn, config)
    if x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"{fn}: the input's last axis ({x.shape[-1]}) differs from the kernel's local rows "
            f"({kernel.shape[0]}); inside shard_map the input holds this device's slice of the "
            f"contracted features and the kernel the matching rows (shard both over "
            f"{axis_name!r})")
    lead = x.shape[:-1]
    if collective == "reduce_scatter":
        n = _checks.axis_size(fn, axis_name)
        if not lead or lead[0] % n:
            raise ValueError(
                f"{fn}: reduce_scatter scatters the leading axis of the input over "
                f"{axis_name!r} (size {n}); it must exist and be divisible by {n}, got input "
                f"shape {tuple(x.shape)}")
        lead = (lead[0] // n, *lead[1:])
    y = overlapped_matmul(x.reshape(-1, x.shape[-1]), kernel, axis_name=axis_name,
                          collective=collective, config=config)
    y = y.reshape(*lead, kernel.shape[-1])
    return y if bias is None else y + bias  # after the collective: added once, to own rows


def column_parallel(fn: str, x: jax.Array, kernel: jax.Array, bias: jax.Array | None, *,
                    gather_axis: str | None = None,
                    config: OverlapConfig | None = None) -> jax.Array:
    """y = x @ kernel + bias with this device's columns [K, N_local]; x, kernel, bias already
    share the compute dtype.

    gather_axis=None: a local GEMM, no collective. gather_axis=name: x holds this device's rows
    of the sequence-parallel layout and y = all_gather(x, name, axis=0, tiled=True) @ kernel
    through `fo_jax.all_gather_matmul` (its backward pairs the gather with a GEMM +
    reduce-scatter)."""
    check_config(fn, config)
    if x.shape[-1] != kernel.shape[0]:
        raise ValueError(f"{fn}: the input's last axis ({x.shape[-1]}) differs from the kernel's "
                         f"rows ({kernel.shape[0]})")
    if gather_axis is not None:
        if x.ndim < 2:
            raise ValueError(f"{fn}: gather_input=True all-gathers the input's leading axis over "
                             f"{gather_axis!r}; the input needs one besides the features, got "
                             f"shape {tuple(x.shape)}")
        y, _ = all_gather_matmul(x, kernel, axis_name=gather_axis, config=config)
    else:
        # Like nn.Dense: output in the compute dtype (16-bit GEMMs accumulate in float32 inside
        # XLA's GEMM); a float32 output plus a cast would add a conversion pass each way.
        y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    return y if bias is None else y + bias  # after the gather: the bias of own columns
