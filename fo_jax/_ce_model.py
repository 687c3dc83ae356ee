"""Timing model of one copy-engine call (csrc/comm/peer_transport.h), to choose its group
partition and its sum passes before the call is lowered.

The GEMM finishes its output in visit order at a steady rate; the copy engine sends the groups
of every chunk but the own ones one after another, each starting when its group is done (plus a
latency) and the previous copy has ended (plus a turnaround); after the GEMM, the band sum adds
the received chunks to the own one, in one pass once the last copy has landed, or in two (the
chunks already there first, the last one after it lands). Rates and delays were read off the
device timeline of 8192x8192x2048 on 4x H200 (results/overlap_profile_tp4_2026-11-21_fe573db.log,
benchmarks/NOTES.md §9): copies of 16-32 MiB at 347-377 GB/s, 15-22 us from a group's end to its
copy's start, 8-11 us between back-to-back copies, band sums at 3.8-4.2 TB/s of traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

CE_RATE = 365e9  # bytes/s of one copy-engine write into a peer's memory over NVLink
CE_LATENCY = 18e-6  # a group's last tile -> its copy starts (counter seen, copy launched)
CE_TURNAROUND = 9e-6  # between back-to-back copies on the copy stream
SUM_RATE = 3.9e12  # bytes/s read + written by a band-sum pass
SUM_GAP = 4e-6  # between the GEMM (or the previous pass, or a flag) and a sum pass
STORE_RATE = 330e9  # bytes/s of the all-reduce's SM stores into the peers' outputs

MAX_PARTS = 4  # groups per chunk tried


@dataclass(frozen=True)
class Prediction:
    bounds: tuple  # group boundaries, logical tile rows
    split_sum: bool
    last_copy_s: float  # when the last copy ends, from the GEMM's start
    finish_s: float  # when the last sum pass ends


def chunk_bounds(tiles_chunk: int, cluster_m: int, parts: int, first_half: bool) -> list:
    """Group boundaries inside one chunk (relative tile rows), `parts` near-equal pieces of
    whole clusters; with first_half and parts == 1, two halves. None if a piece would be empty."""
    pieces = 2 if first_half and parts == 1 else parts
    clusters = tiles_chunk // cluster_m
    if pieces > clusters:
        return None
    return [(i * clusters // pieces) * cluster_m for i in range(pieces)]


def partition(rounds: int, size: int, tiles_chunk: int, cluster_m: int, parts: int,
              first_half: bool) -> tuple:
    """Boundaries of all groups: every chunk sent to a peer in `parts` pieces (the very first
    in two halves if first_half and parts == 1); the own chunks one group each."""
    bounds = []
    for h in range(rounds):
        for j in range(size):
            base = (h * size + j) * tiles_chunk
            own = j == size - 1
            inner = [0] if own else chunk_bounds(tiles_chunk, cluster_m, parts,
                                                 first_half and h == 0 and j == 0)
            if inner is None:
                return None
            bounds.extend(base + b for b in inner)
    bounds.append(rounds * size * tiles_chunk)
    return tuple(bounds)


def last_copy_end(bounds: tuple, rounds: int, size: int, tiles_chunk: int, chunk_bytes: int,
                  t_gemm: float) -> float:
    """When the copy engine finishes the last copy (seconds from the GEMM's start)."""
    total = bounds[-1]
    row_bytes = chunk_bytes / tiles_chunk
    free = None
    for g in range(len(bounds) - 1):
        step = (bounds[g] // tiles_chunk) % size
        if step == size - 1:
            continue  # the own chunk stays here
        ready = t_gemm * bounds[g + 1] / total
        start = ready + CE_LATENCY if free is None else max(ready + CE_LATENCY,
                                                            free + CE_TURNAROUND)
        free = start + (bounds[g + 1] - bounds[g]) * row_bytes / CE_RATE
    return free if free is not None else 0.0


def sum_finish(split: bool, last_copy: float, t_gemm: float, size: int, chunk_bytes: int,
               all_reduce: bool) -> float:
    """When the last round's sum ends. The pass that stores (all-reduce) also moves (P - 1)
    chunks over NVLink."""
    stores = (size - 1) * chunk_bytes / STORE_RATE if all_reduce else 0.0
    if not split or size <= 2:
        start = max(t_gemm, last_copy) + SUM_GAP
        return start + max((size + 1) * chunk_bytes / SUM_RATE, stores)
    first = t_gemm + SUM_GAP + size * chunk_bytes / SUM_RATE
    start = max(first, last_copy) + SUM_GAP
    return start + max(3 * chunk_bytes / SUM_RATE, stores)


def best(rounds: int, size: int, tiles_chunk: int, cluster_m: int, chunk_bytes: int,
         t_gemm: float, all_reduce: bool, max_groups: int) -> Prediction:
    """The partition (pieces per chunk, first chunk halved or not) and sum passes that the model
    says finish first; ties go to fewer groups (each costs a copy turnaround the model may
    underrate)."""
    found = None
    for parts in range(1, MAX_PARTS + 1):
        for first_half in ((False, True) if parts == 1 else (False,)):
            bounds = partition(rounds, size, tiles_chunk, cluster_m, parts, first_half)
            if bounds is None or len(bounds) - 1 > max_groups:
                continue
            last = last_copy_end(bounds, rounds, size, tiles_chunk, chunk_bytes, t_gemm)
            for split in (False, True):
                finish = sum_finish(split, last, t_gemm, size, chunk_bytes, all_reduce)
                if found is None or finish < found.finish_s - 1e-6:
                    found = Prediction(bounds, split, last, finish)
    return found
