"""fp8 GEMM benchmark: fo_jax's fp8 (e4m3) kernel against XLA's fp8 dot and both bf16 GEMMs.

Shapes: the five design shapes and LLM tensor-parallel shapes (bench_gemm_sweep.py's picks),
including K = 7168 with M >= 8192, where XLA's fp8 dot is measured 1.27-1.58x faster than its
bf16 dot and below which it is slower (docs/gemm_performance.md, "fp8"). `--shapes MxNxK ...`:
yours.

Methods per shape (x[M, K] ~ N(0, 1/K), w[K, N] ~ N(0, 1); fp8 operands from
fo_jax.quantize_fp8 of the same values, scales float32 device scalars). Every fo_jax method runs
with OverlapConfig(allow_fallback=False), so it times fo_jax's own kernel: without it
fo_jax.matmul hands a GEMM to XLA's dot (bf16) or fp8 dot (fp8 with the weight stored [N, K])
where the GPU model's table says XLA is faster, and on the H200 that is most of these shapes
(bench_gemm_sweep.py times fo_jax.matmul with that handover):
  dtype bfloat16:
    xla.dot            jnp.dot(x, w) in bf16 (XLA's autotuned GEMM)
    fo_jax.matmul      fo_jax.matmul(x, w): fo_jax's bf16 kernel
  dtype float8_e4m3fn (output bf16):
    xla.dot            lax.dot_general(xq, wq, preferred_element_type=bfloat16), then the two
                       scales (XLA's fp8 dot: cuBLASLt's fp8 GEMM where XLA rewrites it), on the
                       weight stored [N, K] as fo_jax.matmul_wt's (on a [K, N] weight XLA
                       transposes it per call, which cost it 1.1-1.5x on the H200). At
                       default precision XLA asks cuBLASLt for fast accumulation
                       (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the whole K sum in the tensor cores'
                       accumulator), which fo_jax does only with fp8_fast_accumulation
    xla.dot_fp32acc    the same with precision=HIGHEST: no fast accumulation (partial sums
                       promoted to fp32, as fo_jax's default kernels do)
    fo_jax.matmul      fo_jax.matmul(xq, wq, x_scale=, w_scale=): w [K, N], so the op transposes
                       it to [N, K] per call (an XLA transpose kernel, timed with it)
    fo_jax.matmul_wt   the same with w stored [N, K] (w_transposed=True): the kernel alone
    fo_jax.matmul_fast the same with OverlapConfig(fp8_fast_accumulation=True)
    fo_jax.gemm        with --configs: fo_jax.matmul_wt with OverlapConfig(gemm_config=NAME), one
                       row per compiled fp8 configuration ("config" names it), so that the
                       rule's pick (fo_jax.matmul_wt's "config") can be read against the best
                       (the fast-accumulation rows with fp8_fast_accumulation=True, against
                       fo_jax.matmul_fast's pick)
Every fp8 result is checked against the float32 product of the dequantized operands (relative
Frobenius error <= 1e-2: bf16 output rounding and the accumulation's own error); a failing
method's row carries "error" and no time.

Timing ("ms"): GPU kernel time per call from JAX profiler traces (trace_timing.py), every method of
a shape in the same traces, interleaved call by call in rotated order, median over --rounds rounds
of --calls calls: the timing of bench_gemm_sweep.py. The markdown's ratio columns (> 1: the second
faster): XLA's fp8 dot over fo_jax's fp8 kernel with the same accumulation (precision HIGHEST
against fo_jax's default, default precision against fp8_fast_accumulation), fo_jax's bf16 over
fo_jax's fp8 (the fp8 speedup, both accumulations) and XLA's bf16 over XLA's fp8.

Output (--out DIR): gemm_fp8_<gpu>_<date>_<commit>.jsonl (rows {"suite": "gemm_fp8", "device",
"date", "commit", "dtype", "M", "N", "K", "method", "ms", "tflops", "kernel" (the kernel that
took most of the time), "kernel_share" (its share), "config", and for fp8 methods "rel_err", the
relative Frobenius error above}) and .md. The .jsonl is written shape by shape, so a run cut
short keeps the shapes it finished; `--report FILE.jsonl` writes FILE.md from such rows (no GPU;
with fo_jax.gemm rows the per-configuration table asks the CUDA module for the picks).

Usage: python3 benchmarks/bench_fp8.py [--shapes MxNxK ...] [--rounds 3] [--calls 8] [--out DIR]
       [--configs all|NAME ...]
       python3 benchmarks/bench_fp8.py --report FILE.jsonl
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
from benchlib import OWN_KERNEL, OWN_KERNEL_FAST  # noqa: E402 (module docstring)
import gemm_sweep_report  # noqa: E402
import trace_timing  # noqa: E402

import fo_jax  # noqa: E402
from fo_jax.bench import core as _benchcore  # noqa: E402

SHAPES = _benchcore.DESIGN_SHAPES + [
    "2048x8192x7168", "32768x8192x7168", "4096x8192x7168", "1024x1280x8192", "4096x1280x8192",
    "2048x5120x1728", "8192x5120x1728", "512x4096x512", "8192x4096x512", "4096x7168x8192",
    "16384x2304x16384",
]
TOLERANCE = 1e-2


def operands(m: int, n: int, k: int, seed: int) -> dict:
    kx, kw = jax.random.split(jax.random.key(seed))

    @jax.jit
    def draw(kx, kw):
        x = jax.random.normal(kx, (m, k), jnp.float32) / math.sqrt(k)
        w = jax.random.normal(kw, (k, n), jnp.float32)
        (xq, xs), (wq, ws) = fo_jax.quantize_fp8(x), fo_jax.quantize_fp8(w)
        return x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), xq, wq, wq.T, xs, ws

    x, w, xq, wq, wq_t, xs, ws = draw(kx, kw)
    return dict(bf16=(x, w), fp8=(xq, wq, xs, ws), fp8_t=(xq, wq_t, xs, ws))


def xla_fp8_dot(xq, wq, xs, ws):
    """XLA's fp8 dot at default precision of a weight stored [N, K]."""
    return benchlib.xla_fp8_dot(xq, wq, xs, ws, w_transposed=True)


def xla_fp8_dot_fp32acc(xq, wq, xs, ws):
    return benchlib.xla_fp8_dot(xq, wq, xs, ws, w_transposed=True,
                                precision=jax.lax.Precision.HIGHEST)


def fp8_config_names(fast_accum=None) -> list:
    """The compiled fp8 configurations: accurate (False), fast-accumulation (True) or both."""
    from fo_jax import _plan  # noqa: PLC0415

    return [c["name"] for c in _plan.gemm_configs_for(jnp.float8_e4m3fn, fast_accum)]


def matmul_wt(name=None, fast=False):
    """fo_jax.matmul of a pre-transposed weight on fo_jax's kernel: tile configuration `name`
    (with its own accumulation), or else fo_jax's choice, with fast accumulation if `fast`."""
    from fo_jax import _plan  # noqa: PLC0415

    return benchlib.fo_jax_fp8_nk(_plan.row_config(name) if name else OWN_KERNEL_FAST if fast
                                  else OWN_KERNEL)


def methods(configs: list) -> list:
    """[(dtype, method, operands key, function, config or None)]: the fixed methods, then one
    fo_jax.gemm per name in `configs`."""
    return [
        ("bfloat16", "xla.dot", "bf16", jnp.dot, None),
        ("bfloat16", "fo_jax.matmul", "bf16", lambda x, w: fo_jax.matmul(x, w, config=OWN_KERNEL),
         None),
        ("float8_e4m3fn", "xla.dot", "fp8_t", xla_fp8_dot, None),
        ("float8_e4m3fn", "xla.dot_fp32acc", "fp8_t", xla_fp8_dot_fp32acc, None),
        ("float8_e4m3fn", "fo_jax.matmul", "fp8",
         lambda xq, wq, xs, ws: fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws, config=OWN_KERNEL),
         None),
        ("float8_e4m3fn", "fo_jax.matmul_wt", "fp8_t", matmul_wt(), None),
        ("float8_e4m3fn", "fo_jax.matmul_fast", "fp8_t", matmul_wt(fast=True), None),
    ] + [("float8_e4m3fn", "fo_jax.gemm", "fp8_t", matmul_wt(name), name) for name in configs]


def fp8_config(m: int, n: int, k: int, fast: bool = False) -> str:
    """The configuration fo_jax picks, accurate or with fast accumulation."""
    from fo_jax import _plan  # noqa: PLC0415

    config = fo_jax.OverlapConfig(fp8_fast_accumulation=fast)
    return _plan.plan_matmul("bench_fp8", jnp.dtype(jnp.float8_e4m3fn), m, n, k,
                             config).config_name


def summary_key(dtype: str, method: str, name=None) -> tuple:
    """A shape's summary entry of a method: (dtype, method), or (dtype, "fo_jax.gemm[NAME]") of
    one configuration's row."""
    return dtype, method if name is None else f"{method}[{name}]"


def measure(res, shape: tuple, timer, first_key: int, configs: list) -> dict:
    m, n, k = shape
    ops = operands(m, n, k, seed=m * 7 + n * 3 + k)
    xq, wq, xs, ws = ops["fp8"]
    ref = benchlib.fp8_reference(xq, wq, xs, ws)
    entries, ok, errs = [], {}, {}
    for j, (dtype, method, key, f, name) in enumerate(methods(configs)):
        fn = trace_timing.named_jit(f, first_key + j)
        error = None
        try:
            y = fn(*ops[key])
            jax.block_until_ready(y)
            if dtype == "float8_e4m3fn":
                err = errs[first_key + j] = float(_benchcore.rel_err(y, ref))
                if not err <= TOLERANCE:
                    raise AssertionError(f"relative error {err:.2e} against the dequantized "
                                         f"float32 product")
            for _ in range(3):
                jax.block_until_ready(fn(*ops[key]))
            ok[first_key + j] = (fn, ops[key])
        except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
            error = f"{type(e).__name__}: {e}"[:300]
            print(f"    {m}x{n}x{k} {dtype} {method}: {error}", file=sys.stderr)
        entries.append((first_key + j, dtype, method, name, error))
    gpu = timer(ok)
    flops = 2.0 * m * n * k
    summary = {}
    for key, dtype, method, name, error in entries:
        config = name or (fp8_config(m, n, k, fast=method == "fo_jax.matmul_fast")
                          if method.startswith("fo_jax") and dtype != "bfloat16" else None)
        row = dict(dtype=dtype, M=m, N=n, K=k, method=method, config=config)
        if key in errs:
            row["rel_err"] = float(f"{errs[key]:.3e}")
        if key in gpu:
            row.update(gpu[key].row_fields(flops))
            summary[summary_key(dtype, method, name)] = gpu[key].ms
        else:
            row.update(ms=None, error=error)
        res.add(**row)
    return summary


def ratio(a, b) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def config_markdown(table: list, configs: list) -> str:
    """Each fp8 configuration's time per shape, and per accumulation (float32, fast) the pick
    and its time over the best measured configuration of that accumulation."""
    fast_names = set(fp8_config_names(True))
    kinds = [(label, fast, [c for c in configs if (c in fast_names) == fast])
             for label, fast in (("float32 accumulation", False), ("fast accumulation", True))]
    kinds = [k for k in kinds if k[2]]
    header = ["M", "N", "K", *[f"{c} ms" for c in configs]]
    for label, _, _ in kinds:
        header += [f"pick ({label})", "best", "pick / best"]
    rows, ratios = [], {label: [] for label, _, _ in kinds}
    for (m, n, k), s in table:
        times = {c: s.get(summary_key("float8_e4m3fn", "fo_jax.gemm", c)) for c in configs}
        row = [m, n, k, *[f"{times[c]:.4f}" if times[c] else "-" for c in configs]]
        for label, fast, names in kinds:
            measured = {c: times[c] for c in names if times[c]}
            pick = fp8_config(m, n, k, fast)
            best = min(measured, key=measured.get) if measured else None
            r = measured[pick] / measured[best] if best and pick in measured else None
            if r:
                ratios[label].append(r)
            row += [pick, best or "-", f"{r:.3f}" if r else "-"]
        rows.append(row)
    lines = []
    for label, rs in ratios.items():
        gm = math.exp(sum(map(math.log, rs)) / len(rs)) if rs else float("nan")
        lines.append(f"- {label}: the pick over the fastest measured configuration: geomean "
                     f"{gm:.3f}, worst {max(rs) if rs else float('nan'):.3f}.")
    return ("\n\n## Each fp8 configuration (w [N, K])\n\n" + "\n".join(lines) + "\n\n" +
            _benchcore.markdown_table(header, rows))


def markdown(base: dict, table: list) -> str:
    header = ["M", "N", "K", "xla bf16 ms", "fo_jax bf16 ms", "xla fp8 ms", "xla fp8 fp32acc ms",
              "fo_jax fp8 ms", "fo_jax fp8 (w [N,K]) ms", "fo_jax fp8 fast ms",
              "xla fp8 fp32acc / fo_jax fp8", "xla fp8 / fo_jax fp8 fast",
              "fo_jax bf16 / fo_jax fp8", "fo_jax bf16 / fo_jax fp8 fast", "xla bf16 / xla fp8"]
    rows = []
    for (m, n, k), s in table:
        g = lambda d, meth: s.get((d, meth))  # noqa: E731
        b16x, b16f = g("bfloat16", "xla.dot"), g("bfloat16", "fo_jax.matmul")
        f8x, f8f, f8t = (g("float8_e4m3fn", "xla.dot"), g("float8_e4m3fn", "fo_jax.matmul"),
                         g("float8_e4m3fn", "fo_jax.matmul_wt"))
        f8p = g("float8_e4m3fn", "xla.dot_fp32acc")
        f8q = g("float8_e4m3fn", "fo_jax.matmul_fast")
        fmt = lambda v: f"{v:.4f}" if v else "-"  # noqa: E731
        rows.append([m, n, k, fmt(b16x), fmt(b16f), fmt(f8x), fmt(f8p), fmt(f8f), fmt(f8t),
                     fmt(f8q), ratio(f8p, f8t), ratio(f8x, f8q), ratio(b16f, f8t),
                     ratio(b16f, f8q), ratio(b16x, f8x)])
    title = (f"# fp8 GEMM: fo_jax vs XLA\n\n{_benchcore.provenance(base)}\n\nGPU kernel time "
             "per call (JAX profiler, median of rounds); ratios over fo_jax's fp8 kernel with a "
             "pre-transposed weight (> 1: fo_jax faster), each against the same accumulation: "
             "XLA's fp8 dot at precision HIGHEST (fp32acc) against fo_jax's default, XLA's at "
             "default precision (cuBLASLt's fast accumulation) against fo_jax's "
             "fp8_fast_accumulation=True.\n\n")
    return title + _benchcore.markdown_table(header, rows)


def table_from_rows(rows: list) -> tuple:
    """(table, configs) of measure()'s summaries rebuilt from result rows: per shape in the
    rows' order, {(dtype, method or "fo_jax.gemm[NAME]"): ms}, and the configurations timed."""
    table: dict = {}
    configs: list = []
    for r in rows:
        summary = table.setdefault((r["M"], r["N"], r["K"]), {})
        if r.get("ms") is None:
            continue
        name = r["config"] if r["method"] == "fo_jax.gemm" else None
        if name and name not in configs:
            configs.append(name)
        summary[summary_key(r["dtype"], r["method"], name)] = r["ms"]
    return list(table.items()), configs


def report(path: str) -> str:
    """Writes the markdown of a run's .jsonl next to it (e.g. of a run cut short)."""
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    if not rows:
        raise SystemExit(f"bench_fp8.py: no rows in {path}")
    table, configs = table_from_rows(rows)
    md = markdown(rows[0], table) + (config_markdown(table, configs) if configs else "")
    out = os.path.splitext(path)[0] + ".md"
    with open(out, "w") as fh:
        fh.write(md)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", metavar="FILE.jsonl",
                    help="write FILE.md from a run's rows instead of running")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", nargs="*", default=None, help="MxNxK ... instead of the list")
    ap.add_argument("--rounds", type=int, default=3, help="traces per shape (median)")
    ap.add_argument("--calls", type=int, default=8, help="calls per method in each trace")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="'all' or fp8 configuration names: time each (fo_jax.gemm rows)")
    args = ap.parse_args()
    if args.report:
        print(f"wrote {report(args.report)}", file=sys.stderr)
        return

    gpus = benchlib.cuda_gpus_or_exit("bench_fp8.py")
    info = benchlib.device_info(gpus[:1])
    res = benchlib.Results({"suite": "gemm_fp8", **info}, echo=False)
    stem = os.path.join(args.out, gemm_sweep_report.file_stem(res.base).replace(
        "gemm_sweep_", "gemm_fp8_", 1))
    shapes = [_benchcore.parse_shape(s) for s in (args.shapes or SHAPES)]
    known = fp8_config_names()
    configs = known if args.configs == ["all"] else args.configs
    unknown = [c for c in configs if c not in known]
    if unknown:
        raise SystemExit(f"bench_fp8.py: unknown fp8 configurations {unknown}; compiled: {known}")
    timer = trace_timing.TraceTimer(args.rounds, args.calls)
    os.makedirs(args.out, exist_ok=True)
    table = []
    t0 = time.perf_counter()
    with open(stem + ".jsonl", "w") as jsonl:  # written shape by shape: a crash keeps the rest
        for j, shape in enumerate(shapes):
            first = len(res.rows)
            summary = measure(res, shape, timer, first_key=len(res.rows), configs=configs)
            jsonl.writelines(json.dumps(r) + "\n" for r in res.rows[first:])
            jsonl.flush()
            table.append((shape, summary))
            f8x = summary.get(("float8_e4m3fn", "xla.dot"))
            f8p = summary.get(("float8_e4m3fn", "xla.dot_fp32acc"))
            f8t = summary.get(("float8_e4m3fn", "fo_jax.matmul_wt"))
            f8q = summary.get(("float8_e4m3fn", "fo_jax.matmul_fast"))
            b16 = summary.get(("bfloat16", "fo_jax.matmul"))
            print(f"[{j + 1}/{len(shapes)}] {'x'.join(map(str, shape))}: xla / fo_jax fp8 "
                  f"{ratio(f8p, f8t)} (float32 accumulation), {ratio(f8x, f8q)} (fast), "
                  f"fo_jax bf16 / fp8 {ratio(b16, f8t)} "
                  f"[{time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
    md = markdown(res.base, table) + (config_markdown(table, configs) if configs else "")
    res.write_markdown(stem + ".md", md)
    print(md)
    print(f"wrote {stem}.jsonl, {stem}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
