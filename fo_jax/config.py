"""Tuning knobs of one fo_jax call, as one frozen (hashable, trace-time static) object.

Every field defaults to None, meaning "let fo_jax choose": the entry of the tuning cache
(`python -m fo_jax.tune`) for the call when there is one, else a shape heuristic
(fo_jax/_plan.py). Fields that a path does not use are ignored by it; the reference path ignores
them all.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class OverlapConfig:
    """Configuration of `overlapped_matmul` / `matmul`.

    Attributes:
      gemm_config: name of a compiled GEMM tile configuration (see `fo_jax.gemm_configs()`), or
        None for the shape heuristic.
      num_groups: number of uniform output groups the collective is split into. Unset, the
        default is 4 or 8 groups; an all-reduce whose collective outlasts its GEMM gets 4 groups
        of relative sizes 1 : 2 : 2.5 : 2.5 (its first NCCL call starts sooner).
      group_tile_rows: an explicit partition of the output's tile-rows into groups (sizes in
        tile-rows, summing to the tile-row count); overrides `num_groups`.
      sm_budget: at most this many SMs for the persistent GEMM (the rest is left to NCCL).
      nccl_max_ctas: bound on NCCL's CTAs for the overlapped collective.
      force_reference: always take the XLA reference path (same as FO_JAX_FORCE_REFERENCE=1).
      allow_fallback: let overlapped_matmul take the plain XLA path for calls too small to gain
        from overlap (estimated GEMM time under 250 us with the NCCL transport, 100 us with the
        copy engine, on H100/H200-class GPUs), and let a plain GEMM (`matmul`, an overlapped call
        over one device) run as XLA's dot where the measured table says it is faster (unless
        `gemm_config` is set); False always runs the CUDA pipeline on CUDA.
      transport: how the collective's bytes move: "copy_engine" (copy-engine writes into the
        other GPUs' memory, plus, for an all-reduce, SM stores of the summed bands into the
        peers' outputs; every rank in one process, peer access between the GPUs; see
        fo_jax/_transport.py) or "nccl" (NCCL collectives; any topology). None: the copy engine
        where it can run, else NCCL.
      copy_engine_rounds: copy-engine all-reduce only: the output is reduced and gathered in
        this many rounds, each round's all-gather overlapping the GEMM's later rounds on the SMs
        the GEMM leaves free (`sm_budget`; default all but 8 when rounds > 1). None: fo_jax
        chooses (benchmarks/NOTES.md §8). Rows per rank must divide into rounds chunks of
        whole GEMM tiles.
    """

    gemm_config: Optional[str] = None
    num_groups: Optional[int] = None
    group_tile_rows: Optional[Tuple[int, ...]] = None
    sm_budget: Optional[int] = None
    nccl_max_ctas: Optional[int] = None
    force_reference: bool = False
    allow_fallback: bool = True
    transport: Optional[str] = None
    copy_engine_rounds: Optional[int] = None

    def __post_init__(self):
        for name in ("num_groups", "sm_budget", "nccl_max_ctas", "copy_engine_rounds"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"OverlapConfig.{name} must be a positive int or None, got {value!r}")
        if self.group_tile_rows is not None:
            rows = tuple(self.group_tile_rows)
            if not rows or any((not isinstance(r, int)) or r < 1 for r in rows):
                raise ValueError(
                    "OverlapConfig.group_tile_rows must be a non-empty tuple of positive ints, "
                    f"got {self.group_tile_rows!r}")
            object.__setattr__(self, "group_tile_rows", rows)
        if self.transport not in (None, "nccl", "copy_engine"):
            raise ValueError(
                "OverlapConfig.transport must be 'nccl', 'copy_engine' or None, got "
                f"{self.transport!r}")
        if self.gemm_config is not None and not isinstance(self.gemm_config, str):
            raise ValueError(
                f"OverlapConfig.gemm_config must be a str or None, got {self.gemm_config!r}")
