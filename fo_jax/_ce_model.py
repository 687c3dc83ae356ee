"""Timing model of one copy-engine call (csrc/comm/copy_engine.h), to choose its group
partition and its sum passes before the call is lowered (docs/design.md, "Choosing the plan:
the timing model"; the measurements behind it: docs/performance.md, "Group partition and sum
passes" and "The ring reduce-scatter").

The GEMM finishes its output in visit order at a steady rate; the copy engine sends the groups
of every chunk but the own ones one after another, each starting when its group is done (plus a
latency) and the previous copy has ended (plus a turnaround); after the GEMM, the band sum adds
the received chunks to the own one, in one pass once the last copy has landed, in two (the
chunks already there first, the last one after it lands: "bands"), or in one pass per group of
the last chunk sent, each once its group has landed ("rows": the traffic of one pass, and only
the last group's rows after the last copy). Rates and delays were read off the device timeline
of 8192x8192x2048 on 4x H200: copies of 16-32 MiB at 347-377 GB/s, 15-22 us from a group's end
to its copy's start, 8-11 us between back-to-back copies, band sums at 3.8-4.2 TB/s of traffic.
There the model puts the rows form 13 us ahead of the bands form; measured: 9-17 us of device
period (the row passes ran slower than SUM_RATE, ~2.7-3 TB/s right after the GEMM).

The ring reduce-scatter (best_ring) sends the same chunks, all to one peer, and has no sums, but
its GEMM (slower, with the epilogue source) stalls whenever it reaches rows whose partial sum has
not landed: a group must be copied within one chunk's time of its own start, so the groups are
small and the copy chain, which runs at about the GEMM's pace, binds. So whether the ring or
the direct form finishes first depends on the GEMM's real pace, slower under sustained load than
the estimate (ring_first, GEMM_SUSTAINED).
"""

from __future__ import annotations

from dataclasses import dataclass

CE_RATE = 365e9  # bytes/s of one copy-engine write into a peer's memory over NVLink
CE_LATENCY = 18e-6  # a group's last tile -> its copy starts (counter seen, copy launched)
CE_TURNAROUND = 9e-6  # between back-to-back copies on the copy stream
SUM_RATE = 3.9e12  # bytes/s read + written by a band-sum pass
SUM_GAP = 4e-6  # between the GEMM (or the previous pass, or a flag) and a sum pass
STORE_RATE = 330e9  # bytes/s of the all-reduce's SM stores into the peers' outputs
# The ring's GEMM kernel (epilogue with a source, 3 of 4 bands reading it) against the plain
# one at 8192x8192x2048 on one H200: +4 to +11 us of ~415 with the source in shared memory of
# its own (+39 us with CUTLASS's builder's epilogue, which shares it with the output).
RING_GEMM_EXTRA = 0.025
RING_TAIL = 6e-6  # a group's flag landing -> the tiles that add it stored
# The GEMM's pace under sustained load against _plan.estimate_seconds (one H200, unloaded):
# gemm_only at 8192x8192x2048 reads 0.38-0.40 ms on 4x H200 against the estimate's 0.352 (the
# clock steps down under back-to-back GEMMs). Used by ring_first only (which says why and what
# it was checked against).
GEMM_SUSTAINED = 1.13

MAX_PARTS = 4  # groups per chunk tried


@dataclass(frozen=True)
class Prediction:
    bounds: tuple  # group boundaries, logical tile rows
    sum_split: str  # "one", "bands" or "rows" (GemmPlan.sum_split)
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


def copy_ends(bounds: tuple, rounds: int, size: int, tiles_chunk: int, chunk_bytes: int,
              t_gemm: float) -> list:
    """(group, end) of each copy in order, end in seconds from the GEMM's start."""
    total = bounds[-1]
    row_bytes = chunk_bytes / tiles_chunk
    free, ends = None, []
    for g in range(len(bounds) - 1):
        step = (bounds[g] // tiles_chunk) % size
        if step == size - 1:
            continue  # the own chunk stays here
        ready = t_gemm * bounds[g + 1] / total
        start = ready + CE_LATENCY if free is None else max(ready + CE_LATENCY,
                                                            free + CE_TURNAROUND)
        free = start + (bounds[g + 1] - bounds[g]) * row_bytes / CE_RATE
        ends.append((g, free))
    return ends


def last_copy_end(bounds: tuple, rounds: int, size: int, tiles_chunk: int, chunk_bytes: int,
                  t_gemm: float) -> float:
    """When the copy engine finishes the last copy (seconds from the GEMM's start)."""
    ends = copy_ends(bounds, rounds, size, tiles_chunk, chunk_bytes, t_gemm)
    return ends[-1][1] if ends else 0.0


def last_chunk_pieces(bounds: tuple, rounds: int, size: int, tiles_chunk: int) -> list:
    """Group indices of the last chunk sent (the last round's step P - 2)."""
    first = ((rounds - 1) * size + size - 2) * tiles_chunk
    return [g for g in range(len(bounds) - 1) if first <= bounds[g] < first + tiles_chunk]


def sum_finish(split: str, ends: list, bounds: tuple, t_gemm: float, size: int, tiles_chunk: int,
               chunk_bytes: int, all_reduce: bool, rounds: int = 1) -> float:
    """When the last round's sum ends (split: "one", "bands" or "rows"; ends: copy_ends). The
    passes that store (all-reduce) also move (P - 1) times their rows over NVLink."""
    last_copy = ends[-1][1] if ends else 0.0
    store_rate = STORE_RATE / (size - 1) if all_reduce else float("inf")
    reads = size  # chunks a pass reads: the own one and the received ones
    if split == "rows":
        landed = dict(ends)
        done = t_gemm
        for g in last_chunk_pieces(bounds, rounds, size, tiles_chunk):
            piece = (bounds[g + 1] - bounds[g]) * chunk_bytes / tiles_chunk
            start = max(done, landed.get(g, 0.0)) + SUM_GAP
            done = start + max((reads + 1) * piece / SUM_RATE, piece / store_rate)
        return done
    if split == "one" or reads <= 2:
        start = max(t_gemm, last_copy) + SUM_GAP
        return start + max((reads + 1) * chunk_bytes / SUM_RATE, chunk_bytes / store_rate)
    first = t_gemm + SUM_GAP + reads * chunk_bytes / SUM_RATE
    start = max(first, last_copy) + SUM_GAP
    return start + max(3 * chunk_bytes / SUM_RATE, chunk_bytes / store_rate)


def best(rounds: int, size: int, tiles_chunk: int, cluster_m: int, chunk_bytes: int,
         t_gemm: float, all_reduce: bool, max_groups: int, rows: bool = True) -> Prediction:
    """The partition (pieces per chunk, first chunk halved or not) and sum passes that the model
    says finish first (sums by rows only if `rows`); ties go to fewer groups (each costs a copy
    turnaround the model may underrate)."""
    found = None
    for parts in range(1, MAX_PARTS + 1):
        for first_half in ((False, True) if parts == 1 else (False,)):
            bounds = partition(rounds, size, tiles_chunk, cluster_m, parts, first_half)
            if bounds is None or len(bounds) - 1 > max_groups:
                continue
            ends = copy_ends(bounds, rounds, size, tiles_chunk, chunk_bytes, t_gemm)
            last = ends[-1][1] if ends else 0.0
            splits = ["one", "bands"]
            if rows and len(last_chunk_pieces(bounds, rounds, size, tiles_chunk)) > 1:
                splits.append("rows")
            for split in splits:
                finish = sum_finish(split, ends, bounds, t_gemm, size, tiles_chunk, chunk_bytes,
                                    all_reduce, rounds)
                if found is None or finish < found.finish_s - 1e-6:
                    found = Prediction(bounds, split, last, finish)
    return found


def ring_partition(size: int, tiles_chunk: int, cluster_m: int, parts: int, lead: int) -> tuple:
    """Boundaries of a ring call's groups: every chunk, the own one included, starts with a
    group of `lead` clusters (0: none) and splits the rest in `parts` pieces. The same pieces in
    every chunk, so that the GEMM visits each chunk's rows in the order (and the groups) in
    which the partial sums it adds were sent: within a group it visits the tiles by columns of
    up to 8 tile-rows, so a coarser group there would want a later piece sooner. None if a
    piece would be empty."""
    clusters = tiles_chunk // cluster_m
    rest = clusters - lead
    if lead >= clusters or parts > rest:
        return None
    inner = ([0] if lead else []) + [(lead + i * rest // parts) * cluster_m for i in range(parts)]
    bounds = [j * tiles_chunk + b for j in range(size) for b in inner]
    bounds.append(size * tiles_chunk)
    return tuple(bounds)


def ring_finish(bounds: tuple, ends: list, tiles_chunk: int, t_gemm: float) -> float:
    """When a ring call's GEMM ends (ends: copy_ends): its own pace, delayed by the latest
    partial sum (a group that lands after the GEMM reaches its first rows, one chunk later in
    the visit order, holds back every tile after them: the CTAs wait in their epilogues)."""
    total = bounds[-1]
    t_ring = t_gemm * (1 + RING_GEMM_EXTRA)
    late = 0.0
    for g, end in ends:
        wanted = t_ring * (bounds[g] + tiles_chunk) / total
        late = max(late, end + RING_TAIL - wanted)
    return t_ring + late


def best_ring(size: int, tiles_chunk: int, cluster_m: int, chunk_bytes: int, t_gemm: float,
              max_groups: int) -> Prediction:
    """The ring partition (pieces per chunk, a short first group or not) that the model says
    finishes first; ties go to fewer groups."""
    found = None
    for parts in range(1, 2 * MAX_PARTS + 1):
        for lead in (0, 1, 2, 4):
            bounds = ring_partition(size, tiles_chunk, cluster_m, parts, lead)
            if bounds is None or len(bounds) - 1 > max_groups:
                continue
            ends = copy_ends(bounds, 1, size, tiles_chunk, chunk_bytes, t_gemm)
            finish = ring_finish(bounds, ends, tiles_chunk, t_gemm)
            if found is None or finish < found.finish_s - 1e-6:
                found = Prediction(bounds, "one", ends[-1][1] if ends else 0.0, finish)
    return found


def finish_at(pred: Prediction, ring: bool, size: int, tiles_chunk: int, chunk_bytes: int,
              t_gemm: float) -> float:
    """When a reduce-scatter plan of one round (best's or best_ring's) finishes if its GEMM
    takes t_gemm."""
    ends = copy_ends(pred.bounds, 1, size, tiles_chunk, chunk_bytes, t_gemm)
    if ring:
        return ring_finish(pred.bounds, ends, tiles_chunk, t_gemm)
    return sum_finish(pred.sum_split, ends, pred.bounds, t_gemm, size, tiles_chunk, chunk_bytes,
                      False)


def ring_first(direct: Prediction, ring: Prediction, size: int, tiles_chunk: int,
               chunk_bytes: int, t_gemm: float) -> bool:
    """Whether the ring plan finishes before the direct one at the GEMM's sustained pace
    (GEMM_SUSTAINED; each plan's partition as chosen at t_gemm). The ring's copy chain runs at
    about the GEMM's pace, so that pace decides: at the estimate's the model put the direct form
    first at 8192x8192x2048 on 4 GPUs, where the ring won. Lowering SUM_RATE instead would move
    direct-form plans measured to be good. Measured on 4x H200 (ring against direct, ms):
    4096x8192x2048 0.281 / 0.279 against 0.264 / 0.262 (the model: direct, by 20 us),
    8192x8192x2048 0.448 / 0.448 against 0.471 / 0.466 (ring, by 9), 16384x8192x2048 0.858 /
    0.867 against 0.874 / 0.890 (ring), the long-K shapes within 1% either way (ring); on
    2x H200 the ring won or tied on every shape (the model: ring everywhere). The runs:
    docs/performance.md, "The ring reduce-scatter"."""
    t = t_gemm * GEMM_SUSTAINED
    return (finish_at(ring, True, size, tiles_chunk, chunk_bytes, t)
            < finish_at(direct, False, size, tiles_chunk, chunk_bytes, t))
