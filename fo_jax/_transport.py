"""Which transport carries an overlapped collective: NCCL's collectives, or copy-engine copies
straight between the GPUs' memories (csrc/comm/copy_engine.h; docs/design.md, "The copy-engine
transport"), and the copy engine's program for a call (`copy_engine_program`).

The copy-engine transport lets the GEMM keep every SM and, with the GEMM visiting its output by
destination band (own band last), leaves only the band sums after the GEMM; an all-reduce
adds an all-gather of the summed bands (SM stores into the peers' outputs), overlapped with the
GEMM by visiting the output in rounds (`copy_engine_rounds`). It needs: every rank of the
axis in this process (JAX's one-process-per-host mode), or, with one process per GPU, every
process on this host (the reduce-scatter by default, the all-reduce and all-gather on request:
fo_jax/_process_layout.py); peer access between every pair of this
process's GPUs (NVLink / NVSwitch machines); 2 to 16 ranks; rows of the output band of each rank
(M / P) a multiple of the GEMM tile's rows times its cluster; fo_jax's own group partition (no
user partition: fo_jax/_ce_model.py chooses how many groups each band is).
`OverlapConfig.transport` forces either; unset, the copy engine is used where it can be, NCCL
elsewhere.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import numpy as np

from fo_jax import _ce_model, _cuda, _hw_queues, _plan, _process_layout
from fo_jax.config import OverlapConfig

MAX_RANKS = 16  # kMaxCopyEngineRanks in csrc/comm/copy_engine_flags.h


@functools.lru_cache(maxsize=None)
def _peer_access_problem(ordinals: tuple) -> str:
    return str(_cuda.module().peer_access_problem(list(ordinals)))


def _local_gpu_ordinals() -> tuple:
    return tuple(sorted(d.local_hardware_id for d in jax.local_devices()
                        if d.platform == "gpu"))


FN = "fo_jax.overlapped_matmul"


def _sm_budget(config: Optional[OverlapConfig]) -> int:
    return config.sm_budget if config is not None and config.sm_budget is not None else 0


def _config_index(collective: str, dtype, m_total: int, n: int, k: int,
                  config: Optional[OverlapConfig]) -> int:
    # A reduce-scatter keeps a configuration with an addend kernel, so that it can run as the
    # ring (_ring_allowed), even where the measured choice ranks another configuration first.
    return _plan.gemm_config_index(FN, dtype, m_total, n, k, 1, config, _sm_budget(config),
                                   require_addends=collective == "reduce_scatter")


def copy_engine_problem(collective: str, size: int, dtype, m_total: int, n: int, k: int,
                        config: Optional[OverlapConfig]) -> Optional[str]:
    """Why the copy-engine transport cannot take this call (m_total: rows of x), or None."""
    if not 2 <= size <= MAX_RANKS:
        return f"the copy-engine transport needs 2 to {MAX_RANKS} ranks, the axis has {size}"
    problem = _process_layout.multiprocess_problem(collective, jax.process_count(), config)
    if problem is not None:
        return problem
    if config is not None and (config.num_groups is not None or config.group_tile_rows is not None):
        return "a group partition was given (the copy-engine transport uses one group per rank)"
    if m_total % size:
        return f"rows of x ({m_total}) are not divisible into {size} bands, one per rank"
    c = _plan.gemm_configs()[_config_index(collective, dtype, m_total, n, k, config)]
    unit = c["tile_m"] * c["cluster_m"]
    if (m_total // size) % unit:
        return (f"rows per band ({m_total // size}) are not a multiple of {unit} (tile rows x "
                f"cluster of GEMM config {c['name']})")
    rounds = config.copy_engine_rounds if config is not None else None
    if collective == "all_reduce" and rounds is not None and not _rounds_fit(
            rounds, m_total // size, unit, size):
        return (f"rows per band ({m_total // size}) do not split into copy_engine_rounds={rounds} "
                f"chunks of whole {unit}-row units (GEMM config {c['name']}), or too many rounds")
    problem = _peer_access_problem(_local_gpu_ordinals())
    if problem:
        return f"no peer access between this process's GPUs ({problem})"
    return None


MAX_RECEIVE_SLOTS = 4 * MAX_RANKS  # kMaxReceiveSlots (csrc/comm/copy_engine_flags.h)
# The all-reduce's rounds before the last are summed next to the GEMM on this many SMs that the
# GEMM leaves free (OverlapConfig.copy_engine_sum_sms overrides it).
ROUND_SUM_SMS = 8
# Default rounds of a copy-engine all-reduce (tried in order, the first that fits the shape),
# measured on 4x H200: where the GEMM dominates, 4 rounds hide most of the
# all-gather behind it (8192x8192x7168: 1.642 ms against 1.749 in one round and 1.739 on NCCL);
# where the collective dominates the GEMM is too short to hide much and loses the round sums'
# SMs: 2 rounds for bands of 32 MiB and more (8192x8192x2048: 0.796 against 0.834), one below
# (4096x8192x2048: 0.479 against 0.515 in 2 rounds).
ROUNDS_LONG_GEMM = (4, 2)
ROUNDS_LARGE_BAND = (2,)
LARGE_BAND_BYTES = 32 << 20


def _rounds_fit(rounds: int, band_rows: int, unit: int, size: int) -> bool:
    return (band_rows % (rounds * unit) == 0
            and rounds * size <= int(_cuda.module().max_gemm_groups())
            and rounds * (size - 1) <= MAX_RECEIVE_SLOTS)


def copy_engine_rounds(collective: str, m_total: int, n: int, k: int, unit: int, size: int,
                       config: Optional[OverlapConfig]) -> int:
    """Rounds of a copy-engine call: 1 for a reduce-scatter; for an all-reduce
    config.copy_engine_rounds (copy_engine_problem checked that it fits), else the first of
    ROUNDS_LONG_GEMM (the GEMM outlasts the collective) or ROUNDS_LARGE_BAND (bands of
    LARGE_BAND_BYTES or more) that fits (whole tile units per chunk), else 1."""
    if collective != "all_reduce":
        return 1
    if config is not None and config.copy_engine_rounds is not None:
        return config.copy_engine_rounds
    band_rows = m_total // size
    t_gemm, t_comm = _plan.estimate_seconds("all_reduce", m_total, n, k)
    if t_gemm >= _plan.RATIO_THRESHOLD * t_comm:
        candidates = ROUNDS_LONG_GEMM
    elif band_rows * n * 2 >= LARGE_BAND_BYTES:
        candidates = ROUNDS_LARGE_BAND
    else:
        candidates = ()
    for rounds in candidates:
        if _rounds_fit(rounds, band_rows, unit, size):
            return rounds
    return 1


def choose(fn: str, collective: str, size: int, dtype, m_total: int, n: int, k: int,
           config: Optional[OverlapConfig]) -> tuple:
    """("copy_engine" | "nccl", why). Raises ValueError when the copy engine is requested but
    cannot take the call."""
    requested = config.transport if config is not None else None
    if requested == "nccl":
        return "nccl", "NCCL transport (requested)"
    problem = copy_engine_problem(collective, size, dtype, m_total, n, k, config)
    if requested == "copy_engine":
        if problem is not None:
            raise ValueError(f"{fn}: OverlapConfig(transport='copy_engine'): {problem}")
        return "copy_engine", "copy-engine transport (requested)" + _hw_queues.caution(fn)
    if problem is None:
        tail = ("no collective tail" if collective == "reduce_scatter"
                else "an all-gather of the summed bands after it")
        return ("copy_engine",
                f"copy-engine transport (GEMM on every SM, {tail})" + _hw_queues.caution(fn))
    return "nccl", f"NCCL transport ({problem})"


def all_gather_copy_engine_problem(size: int, config: Optional[OverlapConfig] = None
                                   ) -> Optional[str]:
    """Why the copy-engine all-gather cannot take a call over `size` ranks, or None: the other
    collectives' rule (with several processes, fo_jax/_process_layout.py: opt-in, as the
    all-reduce, since it writes into the peers' XLA memory; peer access between every pair of
    this process's GPUs; its bands were checked by the planner)."""
    if not 2 <= size <= MAX_RANKS:
        return f"the copy-engine transport needs 2 to {MAX_RANKS} ranks, the axis has {size}"
    problem = _process_layout.multiprocess_problem("all_gather", jax.process_count(), config)
    if problem is not None:
        return problem
    problem = _peer_access_problem(_local_gpu_ordinals())
    if problem:
        return f"no peer access between this process's GPUs ({problem})"
    return None


def choose_all_gather(fn: str, size: int, config: Optional[OverlapConfig]) -> tuple:
    """The overlapped all-gather's transport, by the other collectives' rule: ("copy_engine" |
    "nccl", why). Raises ValueError when the copy engine is requested but cannot take the
    call."""
    requested = config.transport if config is not None else None
    if requested == "nccl":
        return "nccl", "NCCL transport (requested)"
    problem = all_gather_copy_engine_problem(size, config)
    if requested == "copy_engine":
        if problem is not None:
            raise ValueError(f"{fn}: OverlapConfig(transport='copy_engine'): {problem}")
        return "copy_engine", "copy-engine transport (requested)" + _hw_queues.caution(fn)
    if problem is None:
        return ("copy_engine", "copy-engine transport (GEMM on every SM, the rows pushed into "
                "the peers' gathered outputs)" + _hw_queues.caution(fn))
    return "nccl", f"NCCL transport ({problem})"


def _explicit_bounds(fn: str, bounds: tuple, chunks: int, tiles_chunk: int, cluster_m: int,
                     max_groups: int) -> tuple:
    """OverlapConfig.copy_engine_group_bounds, checked against the call: group boundaries in
    tile-rows of the visit order, e.g. (0, 4, 10, 16, 22, 32, 36, 48, 64); they must start at 0,
    end at the last tile-row, rise, fall on cluster boundaries and include every chunk
    boundary."""
    b = tuple(bounds)
    ok = (len(b) >= 2 and b[0] == 0 and b[-1] == chunks * tiles_chunk and len(b) - 1 <= max_groups
          and all(x < y for x, y in zip(b, b[1:])) and all(x % cluster_m == 0 for x in b)
          and set(range(0, chunks * tiles_chunk + 1, tiles_chunk)) <= set(b))
    if not ok:
        raise ValueError(f"{fn}: OverlapConfig.copy_engine_group_bounds={b}: this call needs "
                         f"rising tile-row boundaries from 0 to {chunks * tiles_chunk}, multiples "
                         f"of {cluster_m}, including every multiple of {tiles_chunk}, at most "
                         f"{max_groups} groups")
    return b


MAX_ROW_PIECES = 16  # sums by rows: groups of the last chunk sent (one flag each)


def _check_sum_split(fn: str, split: str, bounds: tuple, rounds: int, size: int,
                     tiles_chunk: int) -> str:
    """OverlapConfig.copy_engine_sum_split, checked against the groups: sums by rows take at
    most MAX_ROW_PIECES groups in the last chunk sent."""
    if split == "rows":
        pieces = len(_ce_model.last_chunk_pieces(bounds, rounds, size, tiles_chunk))
        if pieces > MAX_ROW_PIECES:
            raise ValueError(f"{fn}: OverlapConfig.copy_engine_sum_split='rows': {pieces} groups "
                             f"in the last chunk sent, at most {MAX_ROW_PIECES}")
    return split


def _ring_allowed(c: dict, collective: str, config: Optional[OverlapConfig]) -> bool:
    """Whether a copy-engine call can run as the ring reduce-scatter (csrc/comm/copy_engine.h):
    a reduce-scatter (always one round) whose GEMM config has a ping-pong kernel with an epilogue
    source (gemm_configs' takes_addends), unless config.copy_engine_ring is False."""
    return (collective == "reduce_scatter" and bool(c["takes_addends"])
            and bool(c["pingpong"])
            and (config is None or config.copy_engine_ring is not False))


# Ranks up to which the ring is taken by default where the timing model puts it first
# (_ce_model.ring_first, with the measurements it was checked against): the sizes it has run
# at, 2 and 4 GPUs. OverlapConfig.copy_engine_ring=True forces the ring, False keeps it off.
RING_DEFAULT_MAX_RANKS = 4


def _field(config: Optional[OverlapConfig], name: str):
    return None if config is None else getattr(config, name)


def copy_engine_program(fn: str, collective: str, dtype, m_total: int, n: int, k: int,
                        size: int, config: Optional[OverlapConfig]) -> tuple:
    """(GemmPlan, program) of a copy-engine call; the program (rounds, ring, sum_split,
    tiles_chunk) completes fo_jax/_plan.py's OverlapPlan. All M rows in one batch, visited by
    chunk (rounds x ranks; a reduce-scatter has one round, so one chunk per rank's band)
    rotated so that each round's own chunk comes last. Each chunk sent to a peer is one or more
    groups (each copied as soon as it is done) and the last round is summed in one or more
    passes, as the timing model of fo_jax/_ce_model.py says finishes first; a reduce-scatter
    runs as the ring (_ring_allowed; its partition from _ce_model.best_ring, no sums) where the
    model puts it first (_ce_model.ring_first) on up to RING_DEFAULT_MAX_RANKS GPUs. Every SM
    for one round; with more, all but ROUND_SUM_SMS for the round sums next to the GEMM. The
    copy_engine_* fields of `config` and its sm_budget override each choice."""
    index = _config_index(collective, dtype, m_total, n, k, config)
    c = _plan.gemm_configs()[index]
    unit = c["tile_m"] * c["cluster_m"]
    band_rows = m_total // size
    rounds = copy_engine_rounds(collective, m_total, n, k, unit, size, config)
    tiles_chunk = band_rows // rounds // c["tile_m"]
    chunk_bytes = band_rows // rounds * n * np.dtype(_plan.output_dtype(dtype)).itemsize
    t_gemm = _plan.estimate_seconds(collective, m_total, n, k)[0]
    all_reduce = collective == "all_reduce"
    max_groups = int(_cuda.module().max_gemm_groups())
    pred = _ce_model.best(rounds, size, tiles_chunk, c["cluster_m"], chunk_bytes, t_gemm,
                          all_reduce, max_groups)
    if pred is None:  # choose() takes the copy engine only where copy_engine_problem is None
        problem = copy_engine_problem(collective, size, dtype, m_total, n, k, config)
        raise ValueError(f"{fn}: the copy-engine transport cannot take this call: " + (
            problem or f"its {rounds * size} chunks of {tiles_chunk} tile rows (GEMM config "
                       f"{c['name']}) do not split into at most {max_groups} groups"))
    ring = False
    if _ring_allowed(c, collective, config):
        forced = _field(config, "copy_engine_ring") is True
        ring_pred = _ce_model.best_ring(size, tiles_chunk, c["cluster_m"], chunk_bytes, t_gemm,
                                        max_groups)
        ring = ring_pred is not None and (
            forced or (size <= RING_DEFAULT_MAX_RANKS and _ce_model.ring_first(
                pred, ring_pred, size, tiles_chunk, chunk_bytes, t_gemm)))
        pred = ring_pred if ring else pred
    bounds, sum_split = pred.bounds, pred.sum_split
    parts = _field(config, "copy_engine_chunk_groups")
    if parts is not None:
        forced = _ce_model.partition(rounds, size, tiles_chunk, c["cluster_m"], parts, False)
        if forced is None or len(forced) - 1 > max_groups:
            raise ValueError(
                f"{fn}: OverlapConfig.copy_engine_chunk_groups={parts}: chunks of "
                f"{tiles_chunk // c['cluster_m']} clusters (GEMM config {c['name']}) in "
                f"{rounds * size} chunks do not split into {parts} groups each within "
                f"{max_groups} groups")
        bounds = forced
    explicit = _field(config, "copy_engine_group_bounds")
    if explicit is not None:
        bounds = _explicit_bounds(fn, explicit, rounds * size, tiles_chunk, c["cluster_m"],
                                  max_groups)
    split = _field(config, "copy_engine_sum_split")
    if split is not None and not ring:
        sum_split = _check_sum_split(fn, split, bounds, rounds, size, tiles_chunk)
    sm_budget = _sm_budget(config)
    if rounds > 1 and _field(config, "sm_budget") is None:
        sm_budget = -(_field(config, "copy_engine_sum_sms") or ROUND_SUM_SMS)
    gemm = _plan.GemmPlan(index, c["name"], c["tile_m"], c["tile_n"], bounds, sm_budget, 1,
                          c["cluster_m"])
    return gemm, dict(rounds=rounds, ring=ring, sum_split=sum_split, tiles_chunk=tiles_chunk)
