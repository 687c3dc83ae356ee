"""Planning of a CUDA call, once, at trace time: the one place that decides every value the FFI
handler receives (GEMM tile configuration, group partition, SM budget, batch, transport
program, NCCL CTA bound). `plan_overlap` and `plan_matmul` are the entry points; the handler
validates the plan and derives addresses and counts from it, it never chooses.

The defaults are measured (docs/performance.md); an `OverlapConfig` overrides each of them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax.numpy as jnp

from fo_jax import _cuda, _fp8_fast_choice, _gemm_choice, _transport
from fo_jax.config import OverlapConfig

# Overlap defaults, measured on 4x H200 (docs/performance.md, "Smaller decisions"). The GEMM
# leaves SMs to NCCL; how many pays depends on how long the GEMM runs against the collective:
# when they take about as long (r = T_gemm / T_comm < 1.5), NCCL needs 32 free SMs and 32 CTAs to
# keep pace and 4 groups keep per-call NCCL overhead low. When the GEMM dominates, every SM taken
# from it costs more than the collective's speed gains: a reduce-scatter runs best on 8 SMs /
# 8 CTAs in 8 groups (slow, but hidden behind the GEMM); an all-reduce, with twice the traffic,
# on 16 SMs / 32 CTAs. When the collective is the critical path (short GEMMs), an all-reduce
# gains from a small first group (its NCCL call starts sooner): relative group sizes
# 1 : 2 : 2.5 : 2.5 measured 3-7% faster than equal groups on 8192 and 16384 x 8192 x 2048; a
# reduce-scatter did not gain.
# The all-gather moves as many bytes per GPU as a reduce-scatter of the same rows and takes the
# reduce-scatter's SMs and CTAs until its own are measured (num_groups there: the bands of each
# rank's rows, see plan_all_gather).
_SHORT = dict(num_groups=4, sms_for_nccl=32, nccl_max_ctas=32)
SHORT_GEMM = {"reduce_scatter": _SHORT,
              "all_reduce": dict(_SHORT, group_weights=(1.0, 2.0, 2.5, 2.5)),
              "all_gather": dict(_SHORT, num_groups=1)}
LONG_GEMM = {"reduce_scatter": dict(num_groups=8, sms_for_nccl=8, nccl_max_ctas=8),
             "all_reduce": dict(num_groups=4, sms_for_nccl=16, nccl_max_ctas=32),
             "all_gather": dict(num_groups=1, sms_for_nccl=8, nccl_max_ctas=8)}
RATIO_THRESHOLD = 1.5
# Rough H100/H200 rates for the ratio only (bf16 GEMM; NCCL algorithm bandwidth over NVLink).
GEMM_FLOPS = 780e12  # fo_jax's ping-pong 128x192 kernel on the TP shapes
ALGBW = {"reduce_scatter": 330e9, "all_reduce": 180e9, "all_gather": 330e9}
# Below this estimated GEMM time the overlap does not repay its costs (SMs given to NCCL, the last
# group's tail, per-group NCCL calls): take the plain XLA path. Measured on 4x H200:
# 4096x8192x2048 (estimated 0.21 ms) ran 1.00x (reduce-scatter) and 0.94x (all-reduce) of plain
# JAX; 8192x8192x2048 (0.42 ms) and larger gained.
MIN_GEMM_SECONDS = 250e-6
# With the copy-engine transport the GEMM keeps every SM and no collective tail follows it: the
# standalone probe measured 4096x8192x2048 reduce-scatter (estimated GEMM 0.18 ms)
# at ~1.5x of plain JAX. Smaller calls were not measured; below this, plain XLA.
MIN_GEMM_SECONDS_COPY_ENGINE = 100e-6


def estimate_seconds(collective: str, m: int, n: int, k: int, itemsize: int = 2) -> tuple:
    """(T_gemm, T_comm) rough estimates for a per-GPU x[m, k] @ w[k, n] and its collective (an
    all-gather's m: the gathered rows; it moves x, the others the product)."""
    moved = m * k if collective == "all_gather" else m * n
    return 2.0 * m * n * k / GEMM_FLOPS, moved * itemsize / ALGBW[collective]


def heuristic_defaults(collective: str, m: int, n: int, k: int) -> dict:
    """The shape heuristic: groups / SMs left to NCCL / NCCL CTAs (m: rows of x per GPU)."""
    t_gemm, t_comm = estimate_seconds(collective, m, n, k)
    table = SHORT_GEMM if t_gemm < RATIO_THRESHOLD * t_comm else LONG_GEMM
    return dict(table[collective])


def _tuned(collective: str, m: int, n: int, k: int, dtype, tp: int) -> Optional[dict]:
    """The entry of `python -m fo_jax.tune` for this call on this GPU model, or None."""
    try:
        import jax  # noqa: PLC0415

        dev = jax.devices()[0]
        if dev.platform != "gpu":
            return None
        from fo_jax.tuning import cache  # noqa: PLC0415 (fo_jax.tuning imports this module)

        return cache.lookup(dev.device_kind, collective, m, n, k, dtype, tp)
    except Exception:  # noqa: BLE001 (planning must not fail on a cache problem)
        return None


def overlap_defaults(collective: str, m: int, n: int, k: int, dtype=None,
                     tp: Optional[int] = None) -> dict:
    """Default groups / SMs left to NCCL / NCCL CTAs for this shape (m: rows of x per GPU).

    With `dtype` and `tp` (the axis size) the tuning cache is consulted first (read-only; see
    fo_jax.tuning); without an entry, or without them, the shape heuristic decides.
    """
    if dtype is not None and tp is not None:
        tuned = _tuned(collective, m, n, k, dtype, tp)
        if tuned is not None:
            return tuned
    return heuristic_defaults(collective, m, n, k)


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """The signaling GEMM of one call (csrc/kernels/signaling_gemm.h, SignalingGemmArgs)."""

    config_index: int  # into gemm_configs(), the compiled tile configurations
    config_name: str
    tile_m: int
    tile_n: int
    group_begin: tuple  # tile-row boundaries of the groups, within one batch
    sm_budget: int  # > 0: SMs; 0: all; < 0: all but that many (resolved on the device)
    batch: int = 1  # > 1: the NCCL reduce-scatter's group-major layout of `batch` bands
    cluster_m: int = 1
    # Split K (fo_jax.matmul only): units of work each output tile's K is divided among
    # (SignalingGemmArgs::k_splits; cooperative configurations); 1: none.
    k_splits: int = 1

    @property
    def num_groups(self) -> int:
        return len(self.group_begin) - 1


@dataclasses.dataclass(frozen=True)
class OverlapPlan:
    """Everything the overlap handler receives about one call but its operands and the mesh:
    one immutable value (hashable: it travels through jit as a static parameter) that becomes
    the custom call's `plan` attribute (fo_jax/_cuda_ops.py) and csrc/comm/overlap_plan.h's
    OverlapPlan on the other side."""

    collective: str  # "reduce_scatter" | "all_reduce" | "all_gather"
    transport: str  # "nccl" | "copy_engine"
    axis_size: int  # ranks of the reduced axis
    gemm: GemmPlan
    # The NCCL communicator's CTA bound: on the NCCL transport part of the communicator's
    # identity (one communicator per bound); the copy engine keys its communicator with 0, so a
    # group has one whatever the shapes' NCCL settings (fo_jax/_bootstrap.py, communicator_ctas).
    nccl_max_ctas: int
    # The copy-engine program (docs/design.md, "The copy-engine transport"); the NCCL transport's
    # plan keeps these neutral values.
    rounds: int = 1  # the all-reduce's rounds: each band is `rounds` chunks
    ring: bool = False  # the ring reduce-scatter (no sums after the GEMM)
    sum_split: str = "one"  # the direct form's last-round sums: "one", "bands" or "rows"
    tiles_chunk: int = 0  # GEMM tile-rows per chunk (an all-gather's: per band)

    @property
    def num_groups(self) -> int:
        return self.gemm.num_groups

    def describe(self) -> str:
        text = (f"{self.transport} transport, {self.collective} over {self.axis_size} ranks, GEMM "
                f"{self.gemm.config_name} batch {self.gemm.batch}, groups {self.gemm.group_begin}, "
                f"sm_budget {self.gemm.sm_budget}, nccl_max_ctas {self.nccl_max_ctas}")
        if self.collective == "all_gather":
            rows = self.tiles_chunk * self.gemm.tile_m
            text += (f", consumer GEMM on bands of {rows} rows "
                     f"({self.num_groups // self.axis_size} per rank)")
        elif self.transport == "copy_engine":
            text += (f", rounds {self.rounds}, {'ring' if self.ring else 'direct'}, sums "
                     f"{self.sum_split}, {self.tiles_chunk} tile-rows per chunk")
        return text


def output_dtype(dtype):
    """The dtype of the GEMM's output for operands of `dtype`, which the collective moves and
    sums: the operands' own for 16-bit operands, bfloat16 for float8_e4m3fn (the fp8 kernel
    writes bfloat16 only)."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(jnp.bfloat16) if dtype == jnp.float8_e4m3fn else dtype


def split_k_sizes(plan: GemmPlan, m: int, n: int, sms: Optional[int] = None) -> tuple:
    """(flag words, partial floats) that suffice for a split-K launch of `plan` on
    x[batch * m, k] @ w[k, n] on a device of `sms` SMs (default: the first GPU's,
    _gemm_choice.device_sms): one flag and k_splits - 1 partial tiles per tile of the last
    partial wave, which has fewer cluster tiles than the clusters the SM budget lets run at once
    and no more than the problem has (SplitKFlagWords / SplitKPartialFloats in
    csrc/kernels/signaling_gemm.h, which the launcher checks the exact need against); (0, 0)
    without a split."""
    if plan.k_splits <= 1:
        return 0, 0
    cm = plan.cluster_m
    row_tiles = -(-m // plan.tile_m)
    units = plan.batch * -(-row_tiles // cm) * -(-n // plan.tile_n)
    slots = _gemm_choice.resolve_sms(plan.sm_budget, sms or _gemm_choice.device_sms()) // cm
    tiles = min(units, max(slots - 1, 0)) * cm
    return tiles, tiles * (plan.k_splits - 1) * plan.tile_m * plan.tile_n


@functools.lru_cache(maxsize=None)
def gemm_configs() -> tuple:
    """The compiled GEMM configurations (dicts: name, tile_m, tile_n, ...)."""
    return tuple(dict(c) for c in _cuda.module().gemm_configs())


def gemm_configs_for(dtype, fast_accum: Optional[bool] = False) -> tuple:
    """The compiled GEMM configurations with kernels for operands of `dtype` (the fp8 rows take
    float8_e4m3fn only, the others bfloat16 and float16). fp8 rows accumulate in float32 or
    with fast accumulation (OverlapConfig.fp8_fast_accumulation): `fast_accum` picks which,
    None both."""
    name = jnp.dtype(dtype).name
    return tuple(c for c in gemm_configs() if name in c.get("dtypes", ("bfloat16", "float16"))
                 and (fast_accum is None or bool(c.get("fast_accum")) == fast_accum))


def row_config(name: str, **fields) -> OverlapConfig:
    """OverlapConfig(gemm_config=name, **fields) with fp8_fast_accumulation set to the compiled
    row's own accumulation: what benchmarks and tests that force each row pass."""
    fast = any(c["name"] == name and c.get("fast_accum") for c in gemm_configs())
    return OverlapConfig(gemm_config=name, fp8_fast_accumulation=fast, **fields)


def fast_accumulation(dtype, config: Optional[OverlapConfig]) -> bool:
    """Whether a call's GEMMs take the fast-accumulation fp8 rows: fp8 operands and
    config.fp8_fast_accumulation."""
    return (jnp.dtype(dtype) == jnp.float8_e4m3fn and config is not None
            and config.fp8_fast_accumulation)


def uniform_groups(tile_rows: int, num_groups: int) -> tuple:
    """Boundaries splitting `tile_rows` tile-rows into min(num_groups, tile_rows) near-equal
    groups (earlier groups take the remainder)."""
    g = max(1, min(num_groups, tile_rows))
    base, extra = divmod(tile_rows, g)
    bounds = [0]
    for i in range(g):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return tuple(bounds)


def weighted_groups(tile_rows: int, weights: Sequence[float]) -> tuple:
    """Boundaries splitting `tile_rows` tile-rows into len(weights) groups of sizes proportional
    to `weights` (each at least one tile-row); near-equal groups when there are too few rows."""
    g = len(weights)
    if tile_rows < 2 * g:
        return uniform_groups(tile_rows, g)
    total = float(sum(weights))
    bounds, acc = [0], 0.0
    for i, wt in enumerate(weights[:-1]):
        acc += wt
        b = int(round(acc / total * tile_rows))
        b = max(b, bounds[-1] + 1)            # at least one row in this group
        b = min(b, tile_rows - (g - 1 - i))   # and one for each later group
        bounds.append(b)
    bounds.append(tile_rows)
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


def gemm_config_index(fn: str, dtype, m: int, n: int, k: int, batch: int,
                      config: Optional[OverlapConfig], sm_budget: int,
                      require_addends: bool = False) -> int:
    """config.gemm_config if set (ValueError if not compiled), else the measured choice of
    fo_jax/_gemm_choice.py (require_addends: among configurations with a kernel that adds a
    source; fp8: among the rows of the call's accumulation), else (no table fitted for the dtype
    or, for fp8, the shape) the kernel library's shape heuristic (m is per batch)."""
    dtype_name = jnp.dtype(dtype).name
    fast = fast_accumulation(dtype, config)
    if config is not None and config.gemm_config is not None:
        names = [c["name"] for c in gemm_configs_for(dtype, fast)]
        if config.gemm_config not in names:
            other = [c["name"] for c in gemm_configs_for(dtype, not fast)]
            if config.gemm_config in other:
                raise ValueError(
                    f"{fn}: gemm_config {config.gemm_config!r} is an fp8 configuration "
                    f"{'without' if fast else 'with'} fast accumulation, but "
                    f"OverlapConfig.fp8_fast_accumulation is {fast}, which takes {names}")
            raise ValueError(f"{fn}: unknown gemm_config {config.gemm_config!r} for {dtype_name} "
                             f"operands; compiled: {names}")
        return [c["name"] for c in gemm_configs()].index(config.gemm_config)
    if dtype_name == "float8_e4m3fn":
        index = _gemm_choice.select_fp8_config(m, n, k, batch, sm_budget, gemm_configs(), fast)
        if index is not None:
            return index
        # No fitted fp8 tile model for this shape: the library's fp8 rules.
        if fast:
            return _fp8_fast_choice.select(m * max(batch, 1), n, sm_budget, gemm_configs())
        mod = _cuda.module()
        return int(mod.select_gemm_config(mod.GemmDtype[dtype_name], m, n, k, batch,
                                          max(sm_budget, 0)))
    index = _gemm_choice.select_gemm_config(dtype, m, n, k, batch, sm_budget, gemm_configs(),
                                            require_addends=require_addends)
    if index is not None:
        return index
    mod = _cuda.module()
    return int(mod.select_gemm_config(mod.GemmDtype[jnp.dtype(dtype).name], m, n, k, batch,
                                      max(sm_budget, 0)))


def plan_gemm(fn: str, dtype, m: int, n: int, k: int, batch: int,
              config: Optional[OverlapConfig], default_groups: int,
              default_sm_budget: int, default_weights: Optional[Sequence[float]] = None
              ) -> GemmPlan:
    """Chooses the tile configuration and group table of one call (m is per batch). Groups:
    config.group_tile_rows, else config.num_groups equal groups, else `default_weights`
    (relative sizes) when given, else `default_groups` equal groups. The plan does not split K
    (plan_matmul adds that; the overlapped calls refuse config.k_splits > 1 when they check
    their arguments, _checks.check_config)."""
    mod = _cuda.module()
    sm_budget = default_sm_budget
    if config is not None and config.sm_budget is not None:
        sm_budget = config.sm_budget
    index = gemm_config_index(fn, dtype, m, n, k, batch, config, sm_budget)
    c = gemm_configs()[index]
    tile_rows = -(-m // c["tile_m"])
    max_groups = int(mod.max_gemm_groups())
    if config is not None and config.group_tile_rows is not None:
        bounds = explicit_groups(tile_rows, config.group_tile_rows, fn)
    elif config is not None and config.num_groups is not None:
        bounds = uniform_groups(tile_rows, config.num_groups)
    elif default_weights:
        bounds = weighted_groups(tile_rows, default_weights)
    else:
        bounds = uniform_groups(tile_rows, default_groups)
    if len(bounds) - 1 > max_groups:
        raise ValueError(f"{fn}: {len(bounds) - 1} groups requested, at most {max_groups}")
    return GemmPlan(index, c["name"], c["tile_m"], c["tile_n"], bounds, sm_budget, batch,
                    c["cluster_m"])


def plan_matmul(fn: str, dtype, m: int, n: int, k: int,
                config: Optional[OverlapConfig]) -> GemmPlan:
    """The plan of `fo_jax.matmul`: one group, every SM unless config says otherwise, and
    config.k_splits (checked here: a cooperative configuration named by gemm_config; at most
    one split per k-tile, fewer where K is shorter), else the measured choice's split
    (fo_jax/_gemm_choice.py)."""
    requested = config.k_splits if config is not None else None
    if requested is None and (config is None or config.gemm_config is None):
        budget = config.sm_budget if config is not None and config.sm_budget is not None else 0
        pick = _gemm_choice.select_matmul(dtype, m, n, k, budget, gemm_configs())
        if pick is not None:  # the choice names the configuration, split or not
            chosen = dataclasses.replace(config or OverlapConfig(),
                                         gemm_config=gemm_configs()[pick[0]]["name"])
            plan = plan_gemm(fn, dtype, m, n, k, 1, chosen, 1, 0)
            return dataclasses.replace(plan, k_splits=pick[1])
    plan = plan_gemm(fn, dtype, m, n, k, 1, config, 1, 0)
    c = gemm_configs()[plan.config_index]
    if requested is not None and requested > 1:
        if config.gemm_config is None:
            raise ValueError(
                f"{fn}: OverlapConfig.k_splits={requested} needs gemm_config to name a "
                f"cooperative configuration (one of {split_config_names(dtype, config)})")
        if c.get("pingpong"):
            raise ValueError(
                f"{fn}: gemm_config {c['name']!r} is a ping-pong configuration, which cannot "
                f"split K; k_splits > 1 takes one of {split_config_names(dtype, config)}")
        # At most one split per k-tile: a shorter K splits less.
        return dataclasses.replace(plan, k_splits=min(requested, -(-k // int(c["tile_k"]))))
    return plan


def split_config_names(dtype, config: Optional[OverlapConfig]) -> list:
    """The compiled configurations whose kernels split K for operands of `dtype` (the
    cooperative ones of the call's accumulation)."""
    return [c["name"] for c in gemm_configs_for(dtype, fast_accumulation(dtype, config))
            if not c.get("pingpong")]


def consumer_config_index(fn: str, dtype, m: int, n: int, k: int, band_rows: int,
                          config: Optional[OverlapConfig], sm_budget: int) -> int:
    """The consumer GEMM's configuration for x[m, k] @ w[k, n] read in bands of band_rows rows:
    config.gemm_config if set (ValueError if it has no consumer kernel), else the kernel
    library's consumer pick (SelectConsumerGemmConfig), or with fp8 fast accumulation the
    fast rows' pick where its bands fit, else the fast 128x128 row (as the library falls back
    to its 128x128 row)."""
    if config is not None and config.gemm_config is not None:
        index = gemm_config_index(fn, dtype, m, n, k, 1, config, sm_budget)
        if not gemm_configs()[index].get("has_consumer"):
            raise ValueError(f"{fn}: gemm_config {config.gemm_config!r} has no consumer kernel "
                             f"(the all-gather's GEMM needs one); these have: "
                             f"{consumer_config_names()}")
        return index
    if fast_accumulation(dtype, config):
        index = gemm_config_index(fn, dtype, m, n, k, 1, config, sm_budget)
        c = gemm_configs()[index]
        if c.get("has_consumer") and band_rows % (c["tile_m"] * c["cluster_m"]) == 0:
            return index
        return [c["name"] for c in gemm_configs()].index(_fp8_fast_choice.SMALL)
    mod = _cuda.module()
    return int(mod.select_consumer_gemm_config(mod.GemmDtype[jnp.dtype(dtype).name], m, n, k,
                                               band_rows, max(sm_budget, 0)))


def consumer_config_names() -> list:
    return [c["name"] for c in gemm_configs() if c.get("has_consumer")]


def all_gather_bands_per_rank(config: Optional[OverlapConfig]) -> int:
    """Bands each rank's rows are sent in: config.num_groups, else the heuristic's (1)."""
    if config is not None and config.num_groups is not None:
        return config.num_groups
    return SHORT_GEMM["all_gather"]["num_groups"]


def all_gather_problem(dtype, rows: int, n: int, k: int, axis_size: int,
                       config: Optional[OverlapConfig]) -> Optional[str]:
    """Why the overlapped all-gather cannot take x[rows, k] per rank (gathered over axis_size
    ranks) @ w[k, n], or None: its bands must be whole clusters of a consumer config's tiles,
    at most max_gemm_groups of them."""
    bands_per_rank = all_gather_bands_per_rank(config)
    if rows % bands_per_rank:
        return (f"rows per rank ({rows}) do not split into {bands_per_rank} bands "
                "(OverlapConfig.num_groups)")
    band_rows = rows // bands_per_rank
    sm_budget = config.sm_budget if config is not None and config.sm_budget is not None else 0
    index = consumer_config_index("fo_jax.all_gather_matmul", dtype, rows * axis_size, n, k,
                                  band_rows, config, sm_budget)
    c = gemm_configs()[index]
    unit = c["tile_m"] * c["cluster_m"]
    if band_rows % unit:
        return (f"bands of {band_rows} rows (rows per rank {rows} / {bands_per_rank}) are not a "
                f"multiple of {unit} (tile rows x cluster of the consumer GEMM config "
                f"{c['name']})")
    bands = bands_per_rank * axis_size
    if bands > int(_cuda.module().max_gemm_groups()):
        return f"{bands} bands, more than the GEMM's {int(_cuda.module().max_gemm_groups())}"
    return None


def plan_all_gather(fn: str, axis_size: int, dtype, rows: int, n: int, k: int,
                    config: Optional[OverlapConfig], transport: str) -> OverlapPlan:
    """The plan of an overlapped all_gather(x) @ w, x[rows, k] per rank (all_gather_problem
    says None): the consumer GEMM over the rows * axis_size gathered rows, one group per band
    (each rank's rows in all_gather_bands_per_rank bands), on the SMs NCCL leaves it (every SM
    on the copy engine)."""
    if transport not in ("nccl", "copy_engine"):
        raise ValueError(f"{fn}: unknown transport {transport!r}")
    m = rows * axis_size
    d = overlap_defaults("all_gather", m, n, k, dtype=dtype, tp=axis_size)
    max_ctas = d["nccl_max_ctas"]
    if config is not None and config.nccl_max_ctas is not None:
        max_ctas = config.nccl_max_ctas
    # The copy engine moves the rows without SMs: the GEMM keeps them all.
    sm_budget = 0 if transport == "copy_engine" else -d["sms_for_nccl"]
    if config is not None and config.sm_budget is not None:
        sm_budget = config.sm_budget
    per_rank = all_gather_bands_per_rank(config)
    band_rows = rows // per_rank
    index = consumer_config_index(fn, dtype, m, n, k, band_rows, config, sm_budget)
    c = gemm_configs()[index]
    tiles = band_rows // c["tile_m"]
    bounds = tuple(i * tiles for i in range(per_rank * axis_size + 1))
    gemm = GemmPlan(index, c["name"], c["tile_m"], c["tile_n"], bounds, sm_budget, 1,
                    c["cluster_m"])
    return OverlapPlan("all_gather", transport, axis_size, gemm, max_ctas, tiles_chunk=tiles)


def plan_overlap(fn: str, collective: str, axis_size: int, dtype, rows: int, n: int, k: int,
                 config: Optional[OverlapConfig], transport: str) -> OverlapPlan:
    """The whole plan of one overlapped call on `transport` (as chosen by
    fo_jax/_transport.py's `choose`): x[rows, k] @ w[k, n] per rank, reduced over `axis_size`
    ranks. Defaults come from the tuning cache or the shape heuristic (`overlap_defaults`), the
    copy engine's program from its timing model (fo_jax/_transport.py, fo_jax/_ce_model.py);
    `config` overrides them. An all-gather's rows are this rank's x (plan_all_gather).
    float8_e4m3fn operands get an fp8 tile configuration (gemm_config_index) and the direct
    copy-engine form (no fp8 kernel takes the ring's addend); their collective moves the
    bfloat16 output (output_dtype), their all-gather the fp8 x (the fp8 consumer configs)."""
    fp8 = jnp.dtype(dtype) == jnp.float8_e4m3fn
    if fp8 and config is not None and config.copy_engine_ring:
        raise ValueError(f"{fn}: OverlapConfig(copy_engine_ring=True) with float8_e4m3fn "
                         "operands: the ring adds partial sums in the GEMM's epilogue and no fp8 "
                         "kernel takes an addend; leave copy_engine_ring unset (the direct form)")
    if collective == "all_gather":
        return plan_all_gather(fn, axis_size, dtype, rows, n, k, config, transport)
    d = overlap_defaults(collective, rows, n, k, dtype=dtype, tp=axis_size)
    max_ctas = d["nccl_max_ctas"]
    if config is not None and config.nccl_max_ctas is not None:
        max_ctas = config.nccl_max_ctas
    if transport == "copy_engine":
        gemm, program = _transport.copy_engine_program(fn, collective, dtype, rows, n, k,
                                                       axis_size, config)
        return OverlapPlan(collective, transport, axis_size, gemm, max_ctas, **program)
    if transport != "nccl":
        raise ValueError(f"{fn}: unknown transport {transport!r}")
    batch = axis_size if collective == "reduce_scatter" else 1
    gemm = plan_gemm(fn, dtype, rows // batch, n, k, batch, config, d["num_groups"],
                     -d["sms_for_nccl"], d.get("group_weights"))
    return OverlapPlan(collective, transport, axis_size, gemm, max_ctas)
