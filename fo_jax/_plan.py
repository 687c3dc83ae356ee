"""Trace-time planning of a CUDA call: GEMM tile configuration, group partition, SM budget.

The defaults here are the "measured defaults" of the overlap issue (see benchmarks/NOTES.md); an
`OverlapConfig` overrides each of them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax.numpy as jnp

from fo_jax import _cuda
from fo_jax.config import OverlapConfig

DTYPE_CODES = {jnp.dtype(jnp.bfloat16): 0, jnp.dtype(jnp.float16): 1}

# Overlap defaults: leave this many SMs to NCCL, bound NCCL to as many CTAs, split the output
# into this many groups (fewer if it has fewer tile-rows).
DEFAULT_SMS_FOR_NCCL = 16
DEFAULT_NCCL_MAX_CTAS = 16
DEFAULT_NUM_GROUPS = 8


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    config_index: int
    config_name: str
    tile_m: int
    tile_n: int
    group_begin: tuple  # tile-row boundaries of the groups, within one batch
    sm_budget: int  # > 0: SMs; 0: all; < 0: all but that many (resolved on the device)

    @property
    def num_groups(self) -> int:
        return len(self.group_begin) - 1


@functools.lru_cache(maxsize=None)
def gemm_configs() -> tuple:
    """The compiled GEMM configurations (dicts: name, tile_m, tile_n, ...)."""
    return tuple(dict(c) for c in _cuda.module().gemm_configs())


def uniform_groups(tile_rows: int, num_groups: int) -> tuple:
    """Boundaries splitting `tile_rows` tile-rows into min(num_groups, tile_rows) near-equal
    groups (earlier groups take the remainder)."""
    g = max(1, min(num_groups, tile_rows))
    base, extra = divmod(tile_rows, g)
    bounds = [0]
    for i in range(g):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return tuple(bounds)


def explicit_groups(tile_rows: int, sizes: Sequence[int], fn: str) -> tuple:
    if sum(sizes) != tile_rows:
        raise ValueError(
            f"{fn}: OverlapConfig.group_tile_rows {tuple(sizes)} sums to {sum(sizes)}, but the "
            f"output has {tile_rows} tile-rows per rank")
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    return tuple(bounds)


def plan_gemm(fn: str, dtype, m: int, n: int, k: int, batch: int,
              config: Optional[OverlapConfig], default_groups: int,
              default_sm_budget: int) -> GemmPlan:
    """Chooses the tile configuration and group table of one call (m is per batch)."""
    mod = _cuda.module()
    table = gemm_configs()
    sm_budget = default_sm_budget
    if config is not None and config.sm_budget is not None:
        sm_budget = config.sm_budget
    if config is not None and config.gemm_config is not None:
        names = [c["name"] for c in table]
        if config.gemm_config not in names:
            raise ValueError(f"{fn}: unknown gemm_config {config.gemm_config!r}; compiled: {names}")
        index = names.index(config.gemm_config)
    else:
        index = int(mod.select_gemm_config(DTYPE_CODES[jnp.dtype(dtype)], m, n, k, batch,
                                           max(sm_budget, 0)))
    c = table[index]
    tile_rows = -(-m // c["tile_m"])
    max_groups = int(mod.max_gemm_groups())
    if config is not None and config.group_tile_rows is not None:
        bounds = explicit_groups(tile_rows, config.group_tile_rows, fn)
    else:
        groups = default_groups
        if config is not None and config.num_groups is not None:
            groups = config.num_groups
        bounds = uniform_groups(tile_rows, groups)
    if len(bounds) - 1 > max_groups:
        raise ValueError(f"{fn}: {len(bounds) - 1} groups requested, at most {max_groups}")
    return GemmPlan(index, c["name"], c["tile_m"], c["tile_n"], bounds, sm_budget)
