"""GEMM sweep: fo_jax.matmul against XLA's dot on per-GPU shapes of tensor-parallel LLM layers.

Shapes (66, `sweep_shapes()`): x[M, K] @ w[K, N] as one GPU runs it in a Megatron-style
tensor-parallel transformer layer, built as 11 layer shapes (N, K) x 6 token counts M.
  Models (hidden / MLP / fused QKV width: 3 x hidden with llama2's multi-head attention,
  hidden + 2 x 8 KV heads x 128 with llama3's grouped-query attention):
    llama2-7b 4096 / 11008 / 12288, llama3-8b 4096 / 14336 / 6144, llama2-13b 5120 / 13824 / 15360,
    llama3-70b 8192 / 28672 / 10240, llama3-405b 16384 / 53248 / 18432.
  Layers at tensor-parallel degree tp (column-parallel: N split; row-parallel: K split):
    qkv (N = QKV / tp, K = hidden), attn_out (N = hidden, K = hidden / tp),
    mlp_up (gate and up fused: N = 2 MLP / tp, K = hidden), mlp_down (N = hidden, K = MLP / tp).
  The 11 (model, layer, tp) picks span N and K from 512 to 16384 (N or K below 2048 in four of
  them: 8B attn_out tp8 K = 512, 8B qkv tp4 N = 1536, 13B mlp_down tp8 K = 1728, 70B qkv tp8
  N = 1280), with partial tiles (N = 5504, 1280, 2304) and the five design shapes among them
  (70B attn_out tp4 and mlp_down tp4).
  M = 512, 1024, 2048, 4096, 8192 and 32768 (16384 where N * K >= 8192 * 2048, to bound the
  run's time): tokens per GPU from one short sequence to a large micro-batch.
`--quick`: 6 of them. `--shapes MxNxK ...`: your own. `--min-m`, `--max-m`: those with M in range.

Methods in bfloat16 and float16 (operands random normal, x scaled by 1/sqrt(K); both in the
timed dtype, asserted):
  xla.dot          jax.jit(jnp.dot) in the input dtype: what users write (XLA's autotuned
                   cuBLASLt or Triton GEMM, fp32 accumulation, one rounding)
  fo_jax.matmul    jax.jit(fo_jax.matmul): fo_jax's default choice for the shape ("config" says
                   which tile configuration, or "xla.dot" where fo_jax hands the shape to XLA)
  fo_jax.own       --own: fo_jax.matmul with allow_fallback=False: fo_jax's own kernel and its
                   choice of configuration and split ("config"), even where fo_jax.matmul hands
                   the shape to XLA's dot
  fo_jax.gemm      --configs: fo_jax.matmul with OverlapConfig(gemm_config=NAME), one row per
                   compiled configuration ("all": every one), so the choice can be fitted from
                   one run (dev/fit_gemm_table.py)
                   "NAME/kS" (or --splits S ...: every cooperative configuration of --configs
                   at each S) runs it with OverlapConfig(k_splits=S): split K
  fo_jax.producer  --producer: the overlap's producer, 8 groups and counters, per configuration
Every fo_jax result is checked against xla.dot first (relative error; a wrong kernel's time is
not recorded: its row carries "error").

Methods in float8_e4m3fn (`--dtype float8_e4m3fn`; output bf16): the same x and w quantized by
fo_jax.quantize_fp8 (per-tensor scales, float32 device scalars), the weight stored [N, K] for
every method, the layout both fp8 GEMMs read without a transpose:
  xla.dot            lax.dot_general(xq, wq, preferred_element_type=bfloat16) times the two
                     scales: XLA's fp8 dot (cuBLASLt's fp8 GEMM) at default precision, where
                     XLA asks for fast accumulation (the whole K sum in the tensor cores'
                     accumulator)
  xla.dot_fp32acc    the same at precision HIGHEST: partial sums promoted to fp32, the
                     accumulation of fo_jax's default
  fo_jax.matmul      fo_jax.matmul(xq, wq, x_scale=, w_scale=, w_transposed=True)
  fo_jax.matmul_fast the same with OverlapConfig(fp8_fast_accumulation=True): XLA's default
                     accumulation
Every fp8 result is checked against the float32 product of the dequantized operands (relative
error <= 1e-2). --configs and --splits name the fp8 rows here ("all": every fp8 row, each with
its own accumulation; the report's best configuration per shape is read per accumulation,
against XLA's dot of that accumulation); --own adds fo_jax.own and fo_jax.own_fast: the two
fo_jax.matmul methods with allow_fallback=False, fo_jax's own kernel even where fo_jax.matmul
hands the shape to XLA's fp8 dot; --producer is 16-bit only.

Timing ("ms"): GPU kernel time per call from JAX profiler traces (trace_timing.py): per round
ONE trace holds --calls calls of every method of the shape in both dtypes, interleaved call by
call in rotated order (trace_timing.schedule), each blocked on; each kernel is attributed to
its method by the XLA module of its jitted function; the median over --rounds rounds. Kernel
time holds no host or launch-queue time, so 10-us GEMMs compare fairly with long ones.
"wall_ms" (xla.dot and fo_jax.matmul only): median of 5 interleaved trials of 20 back-to-back
calls (_benchcore.time_ms_interleaved), host and queue included.
Budget: --rounds 3 --calls 8 (after 3 warm-up calls), as benchlib.kernel_ms_interleaved: 3
traces per shape. The default run (66 shapes, both dtypes, --configs all in bfloat16: 12
configurations) compiles and checks 66 x 16 functions; one call of every shape sums to ~26
TFLOP, so ~28 calls per method (check, warm-up, 24 traced) and the wall-clock trials make
~40 s of GPU time. The rest goes to compilation (XLA autotunes every dot) and tracing: 5-8
minutes on one H100 expected. Each progress line on stderr says where the time went so far
(compile, timing, traces) and the time left; the JSON Lines are written shape by shape, so a
run cut short keeps what it measured.

Output (--out DIR): gemm_sweep_<gpu>_<date>_<commit>.jsonl (rows {"suite": "gemm_sweep",
"device", "date", "commit", "dtype", "M", "N", "K", "method", "ms", "config", "kernel" (the
kernel that took most of the time), "kernel_share" (its share), ...}), .md (per dtype:
xla.dot / fo_jax.matmul per shape and the geomean; with --configs the best measured
configuration per shape; in fp8, XLA's dots that ran more than their GEMM) and .png (ratio
vs M) when matplotlib is installed. Progress on stderr.

Usage: python3 benchmarks/bench_gemm_sweep.py [--dtype bfloat16|float16|both|float8_e4m3fn]
         [--quick | --shapes MxNxK ...] [--min-m M] [--max-m M]
         [--own] [--configs all|NAME|NAME/kS ...] [--splits S ...]
         [--configs-dtype bfloat16|float16|both] [--producer]
         [--rounds 3] [--calls 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import gemm_sweep_report  # noqa: E402
import trace_timing  # noqa: E402

import fo_jax  # noqa: E402
from fo_jax.bench import core as _benchcore  # noqa: E402

MODELS = {  # hidden, MLP (intermediate), fused QKV width
    "llama2-7b": (4096, 11008, 12288),
    "llama3-8b": (4096, 14336, 6144),
    "llama2-13b": (5120, 13824, 15360),
    "llama3-70b": (8192, 28672, 10240),
    "llama3-405b": (16384, 53248, 18432),
}
LAYERS = [  # (model, layer, tp)
    ("llama3-8b", "attn_out", 8), ("llama3-8b", "qkv", 4), ("llama2-7b", "mlp_up", 4),
    ("llama2-13b", "mlp_down", 8), ("llama3-70b", "qkv", 8), ("llama3-70b", "attn_out", 4),
    ("llama3-70b", "mlp_up", 8), ("llama3-70b", "mlp_down", 4), ("llama3-405b", "qkv", 8),
    ("llama3-405b", "mlp_down", 8), ("llama3-8b", "mlp_down", 2),
]
TOKENS = (512, 1024, 2048, 4096, 8192)
QUICK = ["1024x1280x8192", "512x4096x512", "2048x5120x1728", "2048x8192x7168", "8192x8192x2048",
         "4096x2304x16384"]
FP8 = "float8_e4m3fn"
DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, FP8: jnp.float8_e4m3fn}
# Relative Frobenius error: 16-bit against xla.dot, fp8 against the dequantized float32 product.
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, FP8: 1e-2}


def layer_nk(model: str, layer: str, tp: int) -> tuple:
    hidden, mlp, qkv = MODELS[model]
    return {"qkv": (qkv // tp, hidden), "attn_out": (hidden, hidden // tp),
            "mlp_up": (2 * mlp // tp, hidden), "mlp_down": (hidden, mlp // tp)}[layer]


def sweep_shapes() -> list:
    """[(M, N, K, label)]: the 66 shapes of the module docstring."""
    out = []
    for model, layer, tp in LAYERS:
        n, k = layer_nk(model, layer, tp)
        largest = 32768 if n * k < 8192 * 2048 else 16384
        for m in TOKENS + (largest,):
            out.append((m, n, k, f"{model} {layer} tp{tp}"))
    return out


def parse_shapes(specs: list) -> list:
    known = {(m, n, k): label for m, n, k, label in sweep_shapes()}
    out = []
    for s in specs:
        m, n, k = _benchcore.parse_shape(s)
        out.append((m, n, k, known.get((m, n, k), "")))
    return out


# ------------------------------------------------------------------------------------------
# The sweep
# ------------------------------------------------------------------------------------------
def chosen_shapes(args) -> list:
    """The shapes --shapes, --quick or the sweep name, with M in [--min-m, --max-m]."""
    shapes = (parse_shapes(args.shapes) if args.shapes
              else parse_shapes(QUICK) if args.quick else sweep_shapes())
    shapes = [s for s in shapes if args.min_m <= s[0] <= (args.max_m or s[0])]
    if not shapes:
        sys.exit(f"bench_gemm_sweep.py: no shape with {args.min_m} <= M <= {args.max_m}")
    return shapes


def operands(m: int, n: int, k: int, dtype, seed: int) -> tuple:
    """The arguments of every method: x [m, k] ~ N(0, 1/k) and w [k, n] ~ N(0, 1), drawn on the
    default device; for fp8 (xq, wq [n, k], x_scale, w_scale), quantized from the same draws."""
    kx, kw = jax.random.split(jax.random.key(seed))
    scale = 1.0 / math.sqrt(k)  # a Python float: weak, keeps the dtype
    x32 = lambda kx: jax.random.normal(kx, (m, k), jnp.float32) * scale  # noqa: E731
    w32 = lambda kw: jax.random.normal(kw, (k, n), jnp.float32)  # noqa: E731
    if dtype == jnp.dtype(FP8):
        def draw(kx, kw):
            (xq, xs), (wq, ws) = fo_jax.quantize_fp8(x32(kx)), fo_jax.quantize_fp8(w32(kw))
            return xq, wq.T, xs, ws
        args = jax.jit(draw)(kx, kw)
        assert args[0].dtype == dtype and args[1].dtype == dtype, (args[0].dtype, args[1].dtype)
        return args
    x, w = jax.jit(lambda kx, kw: (x32(kx).astype(dtype), w32(kw).astype(dtype)))(kx, kw)
    assert x.dtype == dtype and w.dtype == dtype, (x.dtype, w.dtype)
    return x, w


FP8_FAST = fo_jax.OverlapConfig(fp8_fast_accumulation=True)


FP8_OWN = {"fo_jax.own": benchlib.OWN_KERNEL, "fo_jax.own_fast": benchlib.OWN_KERNEL_FAST}


def fp8_methods(own: bool = False) -> list:
    """[(method, None, function of (xq, wq [N, K], x_scale, w_scale))]: the fp8 methods."""
    xla = benchlib.xla_fp8_dot
    out = [
        ("xla.dot", None, lambda xq, wq, xs, ws: xla(xq, wq, xs, ws, w_transposed=True)),
        ("xla.dot_fp32acc", None, lambda xq, wq, xs, ws: xla(
            xq, wq, xs, ws, w_transposed=True, precision=jax.lax.Precision.HIGHEST)),
        ("fo_jax.matmul", None, benchlib.fo_jax_fp8_nk()),
        ("fo_jax.matmul_fast", None, benchlib.fo_jax_fp8_nk(FP8_FAST)),
    ]
    if own:
        out += [(name, None, benchlib.fo_jax_fp8_nk(cfg)) for name, cfg in FP8_OWN.items()]
    return out


def reference(args: tuple, dtype):
    """What every fp8 method is checked against: the float32 product of the dequantized
    operands; None for 16-bit dtypes (checked against xla.dot)."""
    if dtype != jnp.dtype(FP8):
        return None
    xq, wq, xs, ws = args
    return benchlib.fp8_reference(xq, wq.T, xs, ws)


def chosen_config(fn, args: tuple, dtype, m: int, n: int, k: int, config=None) -> str:
    """What fo_jax.matmul runs for this shape: "xla.dot" when its program holds no fo_jax GEMM,
    else the tile configuration of its plan (under `config`)."""
    from fo_jax import _plan  # noqa: PLC0415

    if "fo_jax_gemm" not in fn.lower(*args).as_text():
        return "xla.dot"
    plan = _plan.plan_matmul("fo_jax.matmul", dtype, m, n, k, config)
    return plan.config_name + (f"/k{plan.k_splits}" if plan.k_splits > 1 else "")


def config_of(name: str) -> fo_jax.OverlapConfig:
    """OverlapConfig of a --configs entry: NAME, or NAME/kS (split K in S); an fp8 row with its
    own accumulation (_plan.row_config)."""
    from fo_jax import _plan  # noqa: PLC0415

    base, _, split = name.partition("/k")
    return _plan.row_config(base, k_splits=int(split) if split else None)


def methods_for(dtype, m: int, n: int, k: int, configs: list, producer: bool,
                own: bool = False) -> list:
    """[(method, config or None, function of the operands)] for one shape and dtype."""
    from fo_jax import _cuda_ops, _plan  # noqa: PLC0415

    if dtype == jnp.dtype(FP8):
        return fp8_methods(own) + [("fo_jax.gemm", name, benchlib.fo_jax_fp8_nk(config_of(name)))
                                   for name in configs]
    out = [("xla.dot", None, jnp.dot), ("fo_jax.matmul", None, fo_jax.matmul)]
    if own:
        plan = _plan.plan_matmul("fo_jax.matmul", dtype, m, n, k, None)
        name = plan.config_name + (f"/k{plan.k_splits}" if plan.k_splits > 1 else "")
        keep = benchlib.OWN_KERNEL
        out.append(("fo_jax.own", name, lambda x, w: fo_jax.matmul(x, w, config=keep)))
    for name in configs:
        cfg = config_of(name)
        out.append(("fo_jax.gemm", name,
                    lambda x, w, cfg=cfg: fo_jax.matmul(x, w, config=cfg)))
    if producer:
        for name in [c for c in configs if "/k" not in c] or [None]:
            cfg = fo_jax.OverlapConfig(num_groups=8, gemm_config=name)
            plan = _plan.plan_gemm("bench_gemm_sweep", dtype, m, n, k, 1, cfg, 8, 0)
            out.append(("fo_jax.producer", plan.config_name,
                        lambda x, w, plan=plan: _cuda_ops.signaling_gemm(x, w, plan, 1, True)[0]))
    return out


def prepare(shape: tuple, dtype_name: str, configs: list, producer: bool, first_key: int,
            times: dict, own: bool = False) -> list:
    """The methods of one shape and dtype, compiled, checked (16-bit against xla.dot, fp8
    against the dequantized float32 product) and warmed up:
    [(key, method, config, jitted function, operands, error or None)]; times["compile"] += s."""
    m, n, k, _ = shape
    dtype = jnp.dtype(DTYPES[dtype_name])
    t0 = time.perf_counter()
    args = operands(m, n, k, dtype, seed=m * 7 + n * 3 + k)
    ref = reference(args, dtype)
    against = "xla.dot" if ref is None else "the dequantized float32 product"
    out_dtype = jnp.dtype(jnp.bfloat16) if dtype == jnp.dtype(FP8) else dtype
    out = []
    for j, (method, config, f) in enumerate(methods_for(dtype, m, n, k, configs, producer,
                                                        own)):
        key = first_key + j
        fn = trace_timing.named_jit(f, key)
        error = None
        try:
            y = fn(*args)
            assert y.dtype == out_dtype, f"result dtype {y.dtype}"
            if ref is None:  # 16-bit: xla.dot comes first
                ref = y
            else:
                err = float(_benchcore.rel_err(y, ref))
                if not err <= TOLERANCE[dtype_name]:
                    raise AssertionError(f"relative error {err:.2e} against {against}")
            if method in ("fo_jax.matmul", "fo_jax.matmul_fast"):
                config = chosen_config(fn, args, dtype, m, n, k,
                                       FP8_FAST if method == "fo_jax.matmul_fast" else None)
            elif method in FP8_OWN:
                config = chosen_config(fn, args, dtype, m, n, k, FP8_OWN[method])
            for _ in range(3):
                jax.block_until_ready(fn(*args))
        except Exception as e:  # noqa: BLE001 (one bad configuration must not end the sweep)
            error = f"{type(e).__name__}: {e}"[:300]
            print(f"    {dtype_name} {method} {config or ''}: {error}", file=sys.stderr)
        out.append((key, method, config, fn, args, error))
    times["compile"] += time.perf_counter() - t0
    return out


def measure(res: benchlib.Results, shape: tuple, dtypes: list, configs_for: dict, args,
            timer: trace_timing.TraceTimer, times: dict) -> dict:
    """Times every method of one shape in every dtype, all in the same traces; adds the rows.
    {dtype: {method or "fo_jax.gemm[config]": ms, "config": fo_jax.matmul's config}}."""
    m, n, k, label = shape
    methods = []
    for dtype_name in dtypes:
        methods += [(dtype_name, *entry) for entry in prepare(
            shape, dtype_name, configs_for[dtype_name], args.producer, len(methods), times,
            args.own)]
    ok = {key: (fn, xw) for _, key, _, _, fn, xw, error in methods if error is None}
    t0 = time.perf_counter()
    gpu = timer(ok)
    walls = {}
    for dtype_name in dtypes:
        mine = {meth: (key, fn, xw) for d, key, meth, _, fn, xw, _ in methods
                if d == dtype_name and meth in ("xla.dot", "fo_jax.matmul") and key in ok}
        if len(mine) == 2:
            xw = mine["xla.dot"][2]
            walls[dtype_name] = _benchcore.time_ms_interleaved(
                {meth: fn for meth, (_, fn, _) in mine.items()}, *xw, reps=20, trials=5)
    times["timing"] += time.perf_counter() - t0
    flops = 2.0 * m * n * k
    summary: dict = {d: {} for d in dtypes}
    for dtype_name, key, method, config, _, _, error in methods:
        row = dict(dtype=dtype_name, M=m, N=n, K=k, layer=label, method=method, config=config)
        if key in gpu:
            row.update(gpu[key].row_fields(flops))
            if method in walls.get(dtype_name, {}):
                row["wall_ms"] = round(walls[dtype_name][method], 5)
            name = f"{method}[{config}]" if method == "fo_jax.gemm" else method
            summary[dtype_name][name] = gpu[key].ms
        else:
            row.update(ms=None, error=error)
        if method == "fo_jax.matmul":
            summary[dtype_name]["config"] = config
        res.add(**row)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "both", FP8], default="both",
                    help=f"both: bfloat16 and float16; {FP8}: the fp8 methods")
    ap.add_argument("--quick", action="store_true", help="6 shapes instead of 66")
    ap.add_argument("--shapes", nargs="*", default=None, help="MxNxK ... instead of the sweep")
    ap.add_argument("--min-m", type=int, default=0, help="only the shapes with M >= this")
    ap.add_argument("--max-m", type=int, default=None, help="only the shapes with M <= this")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="'all' or names: time these compiled GEMM configurations too")
    ap.add_argument("--own", action="store_true",
                    help="also time fo_jax.matmul with allow_fallback=False (its own kernel)")
    ap.add_argument("--splits", nargs="*", type=int, default=[],
                    help="also time every cooperative configuration of --configs split in S")
    ap.add_argument("--configs-dtype", choices=["bfloat16", "float16", "both"],
                    default="bfloat16", help="dtypes in which --configs are timed (with "
                    "--dtype float8_e4m3fn: the fp8 rows, in fp8)")
    ap.add_argument("--producer", action="store_true",
                    help="also time the overlap's producer (8 groups, counters) per config")
    ap.add_argument("--rounds", type=int, default=3, help="traces per shape (median)")
    ap.add_argument("--calls", type=int, default=8, help="calls per method in each trace")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    gpus = benchlib.cuda_gpus_or_exit("bench_gemm_sweep.py")
    from fo_jax import _plan  # noqa: PLC0415

    rows = _plan.gemm_configs_for(jnp.float8_e4m3fn if args.dtype == FP8 else jnp.bfloat16,
                                  fast_accum=None)  # the rows of the timed dtypes
    compiled = [c["name"] for c in rows]
    configs = compiled if args.configs == ["all"] else list(args.configs)
    cooperative = {c["name"] for c in rows if not c["pingpong"]}
    configs += [f"{c}/k{s}" for c in list(configs) if c in cooperative for s in args.splits]
    unknown = sorted({c.partition("/k")[0] for c in configs} - set(compiled))
    if unknown:
        sys.exit(f"bench_gemm_sweep.py: unknown --configs {unknown}; compiled: {compiled}")
    shapes = chosen_shapes(args)
    dtypes = ["bfloat16", "float16"] if args.dtype == "both" else [args.dtype]
    if args.dtype == FP8 and args.producer:
        sys.exit("bench_gemm_sweep.py: --producer is 16-bit only")
    config_dtypes = ([FP8] if args.dtype == FP8 else ["bfloat16", "float16"]
                     if args.configs_dtype == "both" else [args.configs_dtype])

    info = benchlib.device_info(gpus[:1])
    info.pop("num_devices", None)
    info["sms"] = int(getattr(gpus[0], "core_count", 0)) or None  # for the choice's waves
    res = benchlib.Results({"suite": "gemm_sweep", **info}, echo=False)
    stem = os.path.join(args.out, gemm_sweep_report.file_stem(res.base) + args.tag)
    timer = trace_timing.TraceTimer(args.rounds, args.calls)
    times = {"compile": 0.0, "timing": 0.0}
    configs_for = {d: configs if d in config_dtypes else [] for d in dtypes}
    t0 = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    jsonl = open(stem + ".jsonl", "w")  # written as the rows come: a crash keeps what ran
    for j, shape in enumerate(shapes):
        m, n, k, label = shape
        first = len(res.rows)
        summary = measure(res, shape, dtypes, configs_for, args, timer, times)
        jsonl.writelines(json.dumps(r) + "\n" for r in res.rows[first:])
        jsonl.flush()
        parts = []
        for dtype_name, s in summary.items():
            xla, fo = s.get("xla.dot"), s.get("fo_jax.matmul")
            part = (f"{dtype_name} xla.dot {xla or float('nan'):.4f} ms, fo_jax.matmul "
                    f"{fo or float('nan'):.4f} ms ({xla / fo if xla and fo else float('nan'):.3f}x"
                    f", {s.get('config')})")
            fast, acc = s.get("fo_jax.matmul_fast"), s.get("xla.dot_fp32acc")
            if fast and xla:
                part += f"; like with like: fast {xla / fast:.3f}x"
            if acc and fo:
                part += f", HIGHEST {acc / fo:.3f}x"
            timed = {key: v for key, v in s.items() if key.startswith("fo_jax.gemm[")}
            if timed and xla:
                best = min(timed, key=timed.get)
                part += f", best {best[len('fo_jax.gemm['):-1]} {xla / timed[best]:.3f}x"
            parts.append(part)
        elapsed = time.perf_counter() - t0
        print(f"[{j + 1}/{len(shapes)}] {m}x{n}x{k} ({label}): " + "; ".join(parts) +
              f"  [{elapsed:.0f} s: compile {times['compile']:.0f}, timing {times['timing']:.0f}"
              f" ({timer.traces} traces, {timer.trace_s:.0f} s); ~"
              f"{elapsed / (j + 1) * (len(shapes) - j - 1):.0f} s left]", file=sys.stderr,
              flush=True)
    jsonl.close()
    md = gemm_sweep_report.markdown(res.rows)
    res.write_markdown(stem + ".md", md)
    plot = gemm_sweep_report.plot(res.rows, stem + ".png")
    print(md)
    print(f"wrote {stem}.jsonl, {stem}.md" + (f", {plot}" if plot else "") +
          f" in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
