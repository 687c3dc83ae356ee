"""Tuning knobs of one fo_jax call, as one frozen (hashable, trace-time static) object.

Every field defaults to None, meaning "let fo_jax choose": the entry of the tuning cache
(`python -m fo_jax.tune`) for the call when there is one, else a shape heuristic
(fo_jax/_plan.py). Fields that a path does not use are ignored by it; the reference path ignores
them all.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

# How a copy-engine call sums its last round (OverlapConfig.copy_engine_sum_split).
SUM_SPLITS = ("one", "bands", "rows")
# How a CUDA device runs an all-gather feeding a GEMM (OverlapConfig.all_gather).
ALL_GATHER_PATHS = ("xla", "overlap")
# Most splits of one output tile's K (OverlapConfig.k_splits; csrc/kernels/signaling_gemm.h's
# kMaxKSplits, which a test compares).
MAX_K_SPLITS = 16


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(value) -> tuple:
    """`value` as a tuple; () (refused by the callers' checks) when it is not a sequence."""
    try:
        return tuple(value)
    except TypeError:
        return ()


@dataclasses.dataclass(frozen=True)
class OverlapConfig:
    """Configuration of `overlapped_matmul` / `matmul`.

    Attributes:
      gemm_config: name of a compiled GEMM tile configuration (listed in docs/configuration.md;
        an unknown name raises ValueError, listing the compiled ones, when the call takes
        fo_jax's kernels: the reference path runs none and ignores it), or None for fo_jax's
        choice.
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
        `gemm_config` is set); False runs the CUDA pipeline on CUDA devices whatever the size.
        A call the CUDA kernels cannot take at all (its dtype or shape, or no CUDA module, which
        warns once) still runs on the reference path either way; `describe()` says which.
      transport: how the collective's bytes move: "copy_engine" (copy-engine writes into the
        other GPUs' memory, plus, for an all-reduce, SM stores of the summed bands into the
        peers' outputs; every rank in one process, or one host with `copy_engine_multiprocess`;
        peer access between the GPUs; see
        fo_jax/_transport.py) or "nccl" (NCCL collectives; any topology). None: the copy engine
        where it can run, else NCCL.
      copy_engine_rounds: copy-engine all-reduce only: the output is reduced and gathered in
        this many rounds, each round's all-gather overlapping the GEMM's later rounds on the SMs
        the GEMM leaves free (`sm_budget`; default all but `copy_engine_sum_sms` when
        rounds > 1). None: fo_jax chooses (docs/performance.md, "The all-reduce's way back").
        Rows per rank must divide into rounds chunks of whole GEMM tiles.
      copy_engine_ring: copy-engine reduce-scatter only: True runs it as the ring (each rank's
        GEMM adds the partial sum the next rank sent, in its epilogue; nothing is summed after
        it; needs a GEMM config with a ping-pong kernel that takes addends), False as the direct
        form (every rank sends each band to its owner, which sums them after its GEMM). None:
        the timing model chooses (docs/design.md, "Ring reduce-scatter").
      copy_engine_chunk_groups: copy engine: each chunk sent to a peer is split into this many
        groups of near-equal whole clusters, each copied as soon as the GEMM has finished it
        (the own chunk stays one group). None: the timing model chooses. Refused when a chunk
        has fewer clusters than that.
      copy_engine_group_bounds: copy engine: the group boundaries themselves, in tile-rows of the
        GEMM's visit order (e.g. (0, 4, 10, 16, 22, 32, 36, 48, 64)): rising from 0 to the
        output's tile-rows, on cluster boundaries, including every chunk boundary. Overrides
        `copy_engine_chunk_groups`. Checked against the call's shape at trace time.
      copy_engine_sum_split: copy engine, direct form: how the last round's received chunks
        are summed after the GEMM: "one" pass once every chunk has landed, "bands" (the chunks
        already there first, then the last one), or "rows" (one pass per group of the last
        chunk sent, each once it has landed; at most 16 such groups). None: the timing model
        chooses. Ignored by the ring, which sums nothing after its GEMM.
      copy_engine_sum_sms: copy-engine all-reduce in more than one round: the GEMM leaves this
        many SMs to the sums of the rounds before the last (default 8), unless `sm_budget` is
        set.
      all_gather: the all-gather feeding a GEMM (`all_gather_matmul`,
        `overlapped_matmul(collective="all_gather")`, and the all-gather of a reduce-scatter's
        backward) on CUDA devices: "overlap" runs the overlapped pipeline (the GEMM consumes
        the gathered rows as they arrive, on the copy engine or NCCL by `transport`'s rule;
        docs/design.md, "The all-gather"), "xla" (and
        None, today's default) XLA's all_gather then its dot. Opt-in: on the copy-engine
        transport the overlap is faster than XLA's all_gather + dot, on the NCCL transport
        not (docs/performance.md, "Overlapped calls"). With "overlap",
        `num_groups` is the bands each rank's rows are sent in (default 1).
      fp8_fast_accumulation: float8_e4m3fn operands only (ignored for 16-bit ones): run the
        fp8 GEMMs with fast accumulation, the whole K sum kept in the tensor cores' accumulator,
        whose additions keep fewer mantissa bits than float32 (what XLA's fp8 dot does at
        default precision, and TransformerEngine's forward GEMM). Faster (1.1-1.5x fo_jax's
        default fp8 GEMM on one H100, docs/gemm_performance.md "fp8"), less accurate as K grows.
        False (the default): partial sums of 256 products (every 256 of K) are added into
        float32. The reference path always accumulates in float32.
      copy_engine_multiprocess: with one JAX process per GPU (jax.distributed), let the
        copy-engine transport take reduce-scatter calls (and all-reduce calls that request it
        with transport="copy_engine"), its peer memory shared through CUDA IPC (every process
        on one host). The first such lowering probes CUDA IPC between all the
        processes (each maps the others' memory and writes into it); where any pair cannot,
        every process takes NCCL instead (warned once; `describe()` says why). True (the
        default): the copy engine wherever the probe passes; False: NCCL whenever the program
        runs several processes. Unrequested, the all-reduce and the overlapped all-gather keep
        NCCL with several processes; requested, they need JAX's preallocated memory pool (the
        default), which each process maps in its peers (docs/design.md, "Copy engine across
        processes").
      k_splits: `matmul` only (its forward GEMM, as `gemm_config`): divide each output tile's K
        among this many units of work on different SMs, the last adding the others' float32
        partial sums in a fixed order (deterministic), for GEMMs of few output tiles and long K.
        Needs `gemm_config` naming a cooperative configuration (e.g. "coop_128x128x64_c1");
        at most 16, and at most one split per k-tile of the configuration (a shorter K splits
        less). None: fo_jax chooses (docs/gemm_performance.md, "Split K"); 1: never. Refused by the
        overlapped calls, whose GEMM signals whole tiles.
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
    copy_engine_ring: Optional[bool] = None
    copy_engine_chunk_groups: Optional[int] = None
    copy_engine_group_bounds: Optional[Tuple[int, ...]] = None
    copy_engine_sum_split: Optional[str] = None
    copy_engine_sum_sms: Optional[int] = None
    all_gather: Optional[str] = None
    copy_engine_multiprocess: bool = True
    fp8_fast_accumulation: bool = False
    k_splits: Optional[int] = None

    def __post_init__(self):
        for name in ("num_groups", "sm_budget", "nccl_max_ctas", "copy_engine_rounds",
                     "copy_engine_chunk_groups", "copy_engine_sum_sms", "k_splits"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(
                    f"OverlapConfig.{name} must be a positive int or None, got {value!r}")
        if self.k_splits is not None and self.k_splits > MAX_K_SPLITS:
            raise ValueError(
                f"OverlapConfig.k_splits must be at most {MAX_K_SPLITS}, got {self.k_splits!r}")
        if self.group_tile_rows is not None:
            rows = _int_tuple(self.group_tile_rows)
            if not rows or any((not _is_int(r)) or r < 1 for r in rows):
                raise ValueError(
                    "OverlapConfig.group_tile_rows must be a non-empty tuple of positive ints, "
                    f"got {self.group_tile_rows!r}")
            object.__setattr__(self, "group_tile_rows", rows)
        if self.copy_engine_group_bounds is not None:
            bounds = _int_tuple(self.copy_engine_group_bounds)
            if (len(bounds) < 2 or any(not _is_int(b) for b in bounds) or bounds[0] != 0
                    or any(a >= b for a, b in zip(bounds, bounds[1:]))):
                raise ValueError(
                    "OverlapConfig.copy_engine_group_bounds must be a tuple of rising ints "
                    f"from 0 (tile-rows), at least two, got {self.copy_engine_group_bounds!r}")
            object.__setattr__(self, "copy_engine_group_bounds", bounds)
        if self.copy_engine_ring is not None and not isinstance(self.copy_engine_ring, bool):
            raise ValueError(
                f"OverlapConfig.copy_engine_ring must be True, False or None, got "
                f"{self.copy_engine_ring!r}")
        for name in ("force_reference", "allow_fallback", "fp8_fast_accumulation",
                     "copy_engine_multiprocess"):
            # A str such as "false" would read as True.
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"OverlapConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.copy_engine_sum_split not in (None,) + SUM_SPLITS:
            raise ValueError(
                f"OverlapConfig.copy_engine_sum_split must be one of {SUM_SPLITS} or None, got "
                f"{self.copy_engine_sum_split!r}")
        if self.all_gather not in (None,) + ALL_GATHER_PATHS:
            raise ValueError(
                f"OverlapConfig.all_gather must be one of {ALL_GATHER_PATHS} or None, got "
                f"{self.all_gather!r}")
        if self.transport not in (None, "nccl", "copy_engine"):
            raise ValueError(
                "OverlapConfig.transport must be 'nccl', 'copy_engine' or None, got "
                f"{self.transport!r}")
        if self.gemm_config is not None and not isinstance(self.gemm_config, str):
            raise ValueError(
                f"OverlapConfig.gemm_config must be a str or None, got {self.gemm_config!r}")
