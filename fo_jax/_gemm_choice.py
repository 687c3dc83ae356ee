"""Which compiled GEMM tile configuration a call runs, and where fo_jax.matmul leaves the GEMM
to XLA: both decided from a table measured on the GPU model the call runs on (`table`: a module of
fo_jax/_gemm_tables/, written by dev/fit_gemm_table.py from benchmarks/bench_gemm_sweep.py
--configs all).

Tile configuration: the persistent kernel runs a grid of min(SMs, cluster tiles) CTAs over
`units` cluster tiles (cluster_m tile-rows of one batch by one column tile), so it runs
ceil(units / slots) waves, slots = SMs // cluster_m: a last partial wave costs nearly a whole
one. Predicted time of a configuration, from its fitted coefficients (a, b, b_avg, g), in us:

    t = a * waves + b * waves * k_tiles + b_avg * (units / slots) * k_tiles + g

k_tiles = ceil(k / tile_k). `a` is a wave's fixed cost (pipeline fill, an exposed epilogue),
`b` a tile's k-step when every wave is as slow as a full one, `b_avg` the part of the k-step
that only the average load pays (a partial wave of memory-bound tiles runs faster per tile) and
`g` the launch; all are >= 0, fitted per configuration and dtype. The configuration with the
least predicted time wins; within TIE of it, one that can also run the copy-engine ring (a
kernel with an addend), then the earlier in the compiled table, so near-ties do not move the
overlap off its ring. The SM budget enters through `slots`, so the same table serves the
overlap's producer, which leaves SMs to NCCL. Without a fitted table for the dtype the caller
keeps the kernel library's rule (SelectGemmConfig, csrc/kernels/signaling_gemm.cu). fp8 has a
model per accumulation (`select_fp8_config`: its rows only), fitted where the fp8 sweeps timed
every row (MODEL_MIN_M up); below that, and without one, the library's fp8 rules pick.

Split K (fo_jax.matmul only, `select_matmul`): the same model with the last partial wave's tiles
split along K, for problems of few tiles and long K (predicted_split_us below).

XLA's dot: `prefer_xla_dot(m, n, k, dtype)` is true where the sweep measured fo_jax's chosen
configuration slower than XLA's dot around this shape: the measured ratios xla / fo_jax of the
sweep shapes within RADIUS (Euclidean, in log2 of M, N and K) are averaged (geometric mean,
nearer shapes weigh more) and compared with the table's XLA_THRESHOLD; at a measured shape whose
own ratio lies outside CLEAR (beyond the runs' noise) that ratio decides alone. Outside every
measured neighbourhood fo_jax keeps its own GEMM. Only fo_jax.matmul may hand a GEMM to XLA: the
overlap's producer must be fo_jax's kernel (it signals its tiles). fp8 GEMMs have points per
accumulation (`points_key`): fo_jax's fp32-promoting kernel against XLA's fp8 dot at precision
HIGHEST (which promotes too), its fast-accumulating kernel against XLA's default (fast) one, so
a handover never changes the accumulation a call asked for.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax.numpy as jnp

from fo_jax import _cuda, _gemm_tables

DEFAULT_SMS = 132  # H100 SXM / H200: when no GPU is visible at trace time
TIE = 0.01  # relative: predictions this close to the fastest count as ties
# log2 units: a measured shape informs queries up to a factor 4 away in one of M, N, K (less in
# several). Chosen by cross-validating the predicate on the sweep (docs/gemm_performance.md, 'The
# choice'): with all shapes of one (N, K) held out, a radius of 1 finds no neighbour for half
# of them and keeps fo_jax's GEMM where XLA's is faster; 2 predicts them about as well as shapes
# of a measured (N, K).
RADIUS = 2.0
# A measured shape's own ratio outside this band decides it, whatever its neighbours say: one
# kernel's ratio moves by up to 5% from run to run (docs/gemm_performance.md, 'The choice'), so
# inside the band the neighbours' average is the better estimate, outside it the reading is.
CLEAR = (0.90, 1.05)
DTYPE_NAMES = {jnp.dtype(jnp.bfloat16): "bfloat16", jnp.dtype(jnp.float16): "float16"}


def device_sms() -> int:
    """SMs of the first GPU JAX sees, else DEFAULT_SMS."""
    gpus = _cuda.gpu_devices()
    return (int(getattr(gpus[0], "core_count", 0)) if gpus else 0) or DEFAULT_SMS


def device_kind() -> Optional[str]:
    """The model of the first GPU JAX sees (its device_kind), else None."""
    gpus = _cuda.gpu_devices()
    return gpus[0].device_kind if gpus else None


def table():
    """The choice table of this GPU model (fo_jax/_gemm_tables; a model without one, or a
    machine without a GPU that only lowers, gets the default model's)."""
    return _gemm_tables.for_device(device_kind())


def resolve_sms(sm_budget: int, num_sms: int) -> int:
    """SMs the kernel may use: sm_budget > 0 of them (at most all), 0 all, < 0 all but that
    many (GemmPlan's convention), at least 1."""
    if sm_budget > 0:
        return min(sm_budget, num_sms)
    return max(1, num_sms + min(sm_budget, 0))


def waves(cfg: dict, m: int, n: int, batch: int, sms: int) -> tuple:
    """(cluster tiles, co-resident cluster slots, waves) of config `cfg` on the problem."""
    cm = int(cfg["cluster_m"])
    tiles_m = -(-m // int(cfg["tile_m"]))
    units = batch * (-(-tiles_m // cm)) * (-(-n // int(cfg["tile_n"])))
    slots = max(1, sms // cm)
    return units, slots, -(-units // slots)


def features(cfg: dict, m: int, n: int, k: int, batch: int, sms: int) -> tuple:
    """The model's features (waves, waves * k_tiles, units / slots * k_tiles, 1): the time is
    their dot product with the configuration's coefficients (dev/fit_gemm_table.py fits them
    on exactly these)."""
    units, slots, w = waves(cfg, m, n, batch, sms)
    k_tiles = -(-k // int(cfg["tile_k"]))
    return (float(w), float(w * k_tiles), units / slots * k_tiles, 1.0)


def _dtype_name(dtype) -> str:
    return DTYPE_NAMES.get(jnp.dtype(dtype), str(jnp.dtype(dtype)))


def _params(dtype_name: str) -> dict:
    """{config name: coefficients} for the dtype; float16 borrows bfloat16's when it has none
    (the same kernels, the same tensor-core rate)."""
    model = table().MODEL
    return model.get(dtype_name) or model.get("bfloat16", {})


def predicted_us(cfg: dict, coef: Sequence[float], m: int, n: int, k: int, batch: int,
                 sms: int) -> float:
    return sum(c * f for c, f in zip(coef, features(cfg, m, n, k, batch, sms)))


def choose(configs: Sequence[dict], params: dict, m: int, n: int, k: int, batch: int,
           sms: int, require_addends: bool = False) -> Optional[int]:
    """Index into `configs` of the configuration with the least predicted time under `params`
    ({name: coefficients}; configurations without any are skipped), ties as the module
    docstring says; None if no configuration qualifies."""
    times = {}
    for i, cfg in enumerate(configs):
        coef = params.get(cfg["name"])
        if coef is None or (require_addends and not cfg.get("takes_addends")):
            continue
        times[i] = predicted_us(cfg, coef, m, n, k, batch, sms)
    if not times:
        return None
    fastest = min(times.values())
    near = [i for i, t in times.items() if t <= fastest * (1.0 + TIE)]
    return min(near, key=lambda i: (not configs[i].get("takes_addends"), i))


def select_gemm_config(dtype, m: int, n: int, k: int, batch: int, sm_budget: int,
                       configs: Sequence[dict], num_sms: Optional[int] = None,
                       require_addends: bool = False) -> Optional[int]:
    """Index (into `configs`, the compiled table) of the configuration predicted fastest for
    x[batch * m, k] @ w[k, n] on sm_budget SMs (GemmPlan's convention), or None when the table
    has no fitted configuration for the dtype (the caller then keeps the kernel library's
    rule). require_addends: only configurations with a kernel that adds a source (the
    copy-engine ring)."""
    params = _params(_dtype_name(dtype))
    if not params:
        return None
    sms = resolve_sms(sm_budget, num_sms or device_sms())
    return choose(configs, params, m, n, k, batch, sms, require_addends)


def select_fp8_config(m: int, n: int, k: int, batch: int, sm_budget: int,
                      configs: Sequence[dict], fast: bool, num_sms: Optional[int] = None
                      ) -> Optional[int]:
    """Index (into `configs`, the compiled table) of the fp8 configuration of the call's
    accumulation (fast: the fast-accumulation rows) predicted fastest, from the table's fp8 tile
    model (MODEL[points_key(fp8, fast)], fitted on fp8 sweeps with --configs all); None where the
    table has none, or below the M it was fitted from (MODEL_MIN_M): the caller then keeps the
    kernel library's rule."""
    key = points_key(jnp.float8_e4m3fn, fast)
    measured = table()
    params = measured.MODEL.get(key)
    if not params or m * max(batch, 1) < getattr(measured, "MODEL_MIN_M", {}).get(key, 0):
        return None
    return choose(configs, params, m, n, k, batch, resolve_sms(sm_budget, num_sms or device_sms()))


def estimate_from(points: Sequence[tuple], m: int, n: int, k: int,
                  radius: float = RADIUS) -> Optional[float]:
    """The geometric mean of the ratios of `points` ((M, N, K, ratio), ...) within `radius` of
    (m, n, k) in log2 space, nearer ones weighing more; None where none is in reach. A point at
    (m, n, k) itself whose ratio is outside CLEAR is the answer."""
    own = [ratio for pm, pn, pk, ratio in points if (pm, pn, pk) == (m, n, k)]
    if own and not CLEAR[0] <= own[0] <= CLEAR[1]:
        return own[0]
    q = (math.log2(m), math.log2(n), math.log2(k))
    num = den = 0.0
    for pm, pn, pk, ratio in points:
        d = math.dist(q, (math.log2(pm), math.log2(pn), math.log2(pk)))
        if d <= radius:
            weight = 1.0 / (d + 0.25)
            num += weight * math.log(ratio)
            den += weight
    return math.exp(num / den) if den else None


_FP8_FAST_SUFFIX = "_fast"


def points_key(dtype, fast: bool = False) -> str:
    """The XLA_POINTS entry of a dtype: its name, and for fp8 with fast accumulation the name
    with _FP8_FAST_SUFFIX (the fast kernel against XLA's default fp8 dot; without it, fo_jax's
    fp32-promoting kernel against XLA's fp8 dot at precision HIGHEST)."""
    name = _dtype_name(dtype)
    return name + _FP8_FAST_SUFFIX if fast and name.startswith("float8") else name


def xla_dot_estimate(m: int, n: int, k: int, dtype, fast: bool = False) -> Optional[float]:
    """Estimated ms(xla.dot) / ms(fo_jax.matmul) at this shape from the measured neighbours
    (module docstring), or None where none was measured within RADIUS. fast: fp8 with fast
    accumulation (points_key)."""
    return estimate_from(table().XLA_POINTS.get(points_key(dtype, fast), ()), m, n, k)


def prefer_xla_dot(m: int, n: int, k: int, dtype, fast: bool = False) -> bool:
    """Whether fo_jax.matmul should run x[m, k] @ w[k, n] as XLA's dot (measured faster here)."""
    return xla_dot_reason(m, n, k, dtype, fast) is not None


def xla_dot_reason(m: int, n: int, k: int, dtype, fast: bool = False) -> Optional[str]:
    """Why fo_jax.matmul hands this GEMM to XLA's dot (for describe() and the DEBUG log), or
    None when fo_jax's own GEMM runs it."""
    est = xla_dot_estimate(m, n, k, dtype, fast)
    measured = table()
    if est is None or est >= measured.XLA_THRESHOLD:
        return None
    name = _dtype_name(dtype)
    if name.startswith("float8"):
        what = ("XLA's fp8 dot (fast accumulation, as asked)" if fast else
                "XLA's fp8 dot at precision HIGHEST (fp32 promotion, as fo_jax's default)")
        return (f"{what} measured faster around M={m}, N={n}, K={k} ({name}: fo_jax's fp8 GEMM "
                f"at ~{est:.2f}x of its speed on {measured.DEVICE})")
    return (f"XLA's dot measured faster around M={m}, N={n}, K={k} ({name}: "
            f"fo_jax's GEMM at ~{est:.2f}x of its speed on {measured.DEVICE})")



# Split K (OverlapConfig.k_splits; csrc/kernels/group_tile_scheduler.cuh): the whole waves run
# as before, and the last partial wave's tiles (every tile when they are fewer than the slots)
# each become `splits` units over a `splits`-th of K, on the slots the partial wave leaves idle.
# Only splits whose units fit in one wave are candidates (tail * splits <= slots). What that
# wave costs beyond its share of K (the final unit waits for the others and reads their fp32
# partial tiles; every unit fills its pipeline): SPLIT_WAVE_US per 128x128 of tile area plus
# SPLIT_PER_SPLIT_US per extra split, fitted to the model's own predictions on one H200
# (docs/gemm_performance.md, "Split K"). A split is taken only where it is predicted at least
# SPLIT_MARGIN faster than the best unsplit configuration.
SPLIT_WAVE_US = 1.5
SPLIT_PER_SPLIT_US = 0.8
SPLIT_CANDIDATES = (2, 3, 4)  # the splits the H200 sweep measured
SPLIT_MARGIN = 0.05


def predicted_split_us(cfg: dict, coef: Sequence[float], m: int, n: int, k: int, batch: int,
                       sms: int, splits: int) -> float:
    """predicted_us with the last partial wave's tiles split in `splits` (at most one split per
    k-tile): the whole waves as before, then the split units' waves over their share of K plus
    the split's cost."""
    units, slots, _ = waves(cfg, m, n, batch, sms)
    tail = units % slots
    k_tiles = -(-k // int(cfg["tile_k"]))
    splits = min(splits, k_tiles)
    if splits <= 1 or tail == 0:
        return predicted_us(cfg, coef, m, n, k, batch, sms)
    a, b, b_avg, g = coef
    whole = units // slots
    tail_waves = -(-tail * splits // slots)
    share = -(-k_tiles // splits)
    area = int(cfg["tile_m"]) * int(cfg["tile_n"]) / (128 * 128)
    cost = SPLIT_WAVE_US * area + SPLIT_PER_SPLIT_US * (splits - 1)
    return (a * (whole + tail_waves) + b * (whole * k_tiles + tail_waves * share)
            + b_avg * units / slots * k_tiles + g + tail_waves * cost)


def choose_split(configs: Sequence[dict], params: dict, m: int, n: int, k: int, sms: int
                 ) -> Optional[tuple]:
    """(index into `configs`, splits) of the fastest predicted plain GEMM x[m, k] @ w[k, n]:
    choose()'s configuration unsplit, unless a cooperative configuration split in one of
    SPLIT_CANDIDATES (its split units in one wave) is predicted at least SPLIT_MARGIN faster;
    None if no configuration has coefficients."""
    index = choose(configs, params, m, n, k, 1, sms)
    if index is None:
        return None
    unsplit = predicted_us(configs[index], params[configs[index]["name"]], m, n, k, 1, sms)
    best = (unsplit * (1.0 - SPLIT_MARGIN), index, 1)
    for i, cfg in enumerate(configs):
        coef = params.get(cfg["name"])
        if coef is None or cfg.get("pingpong"):
            continue
        units, slots, _ = waves(cfg, m, n, 1, sms)
        for splits in SPLIT_CANDIDATES:
            if splits > -(-k // int(cfg["tile_k"])) or (units % slots) * splits > slots:
                break
            t = predicted_split_us(cfg, coef, m, n, k, 1, sms, splits)
            if t < best[0]:
                best = (t, i, splits)
    return best[1], best[2]


def select_matmul(dtype, m: int, n: int, k: int, sm_budget: int, configs: Sequence[dict],
                  num_sms: Optional[int] = None) -> Optional[tuple]:
    """(configuration index, k_splits) of fo_jax.matmul's own GEMM for x[m, k] @ w[k, n] on
    sm_budget SMs, or None without a fitted table for the dtype (and for fp8 operands, whose
    rows the 16-bit table does not hold)."""
    if jnp.dtype(dtype) not in DTYPE_NAMES:
        return None
    params = _params(_dtype_name(dtype))
    if not params:
        return None
    return choose_split(configs, params, m, n, k, resolve_sms(sm_budget, num_sms or device_sms()))
