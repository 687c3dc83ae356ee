"""`python -m fo_jax.bench`: fo_jax against the JAX options a user could pick, on the local GPUs.

With 2+ GPUs (TP = --tp, default all local GPUs), per-GPU x[M,K] @ w[K,N], collective over "tp"
(reduce_scatter / all_reduce: x's K split; all_gather: M is the gathered rows, each GPU holding
M / TP of them):
  fo_jax               overlapped_matmul, default configuration (the copy-engine transport where
                       it can run; else NCCL with the tuning cache's entry or the shape
                       heuristic)
  fo_jax.nccl          overlapped_matmul with transport="nccl" (defaults)
  fo_jax.tuned         overlapped_matmul with the configuration `python -m fo_jax.tune` cached
  fo_jax.sequential    the same kernels without overlap: one group, GEMM on all SMs, then NCCL
  fo_jax[g,sm,c]       --configs / --sweep configurations (groups, GEMM SMs, NCCL CTAs)
  jax.baseline         XLA dot (fp32 accumulation) + psum / psum_scatter (all_gather: XLA's
                       all_gather, then the dot), inside shard_map
  jax.chunked[cC]      M split into C chunks, dot + psum / psum_scatter each (all_gather: each
                       chunk gathered, then its dot), concatenated
  xla.windowed_einsum  jit + NamedSharding dot under XLA's windowed-einsum flags (own process)
  gemm_only, comm_only XLA dot alone; psum / psum_scatter / all_gather alone (the overlap's
                       floor)
With 1 GPU (or --tp 1): the single-GPU rows (fo_jax/bench/single.py): fo_jax.matmul against
xla.dot, and overlapped_matmul over a 1-device mesh against x @ w + the collective. With no GPU:
the same methods on host CPU devices, said loudly and recorded in every output (--require-gpu
makes it an error instead).
Times: median of 5 x 20 back-to-back calls. Writes JSON Lines (every row records device,
num_devices, date, commit, fo_jax and jax versions), a markdown table and PNG plots (time,
speedup, overlap efficiency) to --out; progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from typing import Optional, Sequence

from fo_jax.bench import devices as _devices

CPU_SHAPES = ["256x512x256", "512x512x512"]
DTYPES = ("bfloat16", "float16")
SWEEP = [dict(num_groups=g, sm_budget=sm, nccl_max_ctas=c)
         for g, sm, c in itertools.product((4, 8, 16), (100, 116), (16, 32))]


def _run_windowed(sel: _devices.Selection, shapes: Sequence[str], collectives, dtype: str,
                  timing: dict, timeout_s: int = 900) -> tuple:
    """Runs fo_jax.bench.xla_worker in a fresh process; returns (rows, error or None)."""
    from fo_jax.bench.xla_worker import ROW_PREFIX, WINDOWED_EINSUM_FLAGS  # noqa: PLC0415

    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *WINDOWED_EINSUM_FLAGS]).strip()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "fo_jax.bench.xla_worker", "--platform", sel.platform,
           "--tp", str(sel.tp), "--dtype", dtype, "--shapes", *shapes,
           "--collectives", *collectives, "--reps", str(timing["reps"]),
           "--trials", str(timing["trials"])]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = e.stdout or "", f"timed out after {timeout_s} s", -1
        out = out.decode() if isinstance(out, bytes) else out
    rows = [json.loads(line[len(ROW_PREFIX):]) for line in out.splitlines()
            if line.startswith(ROW_PREFIX)]
    error = None
    if rc != 0:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-3:]
        error = f"XLA process exited {rc} with flags {' '.join(WINDOWED_EINSUM_FLAGS)}: " + \
            " / ".join(tail)
    return rows, error


def _select(num_gpus: int, tp: Optional[int], require_gpu: bool) -> _devices.Selection:
    from fo_jax import _cuda  # noqa: PLC0415

    return _devices.select(num_gpus, tp, require_gpu, _cuda.module_available(warn=False),
                           _cuda.unavailable_reason())


def _announce(sel: _devices.Selection) -> None:
    if sel.platform == "cpu":
        bar = "*" * 96
        print(f"\n{bar}\n*** {sel.message}\n*** {sel.note.upper()}\n{bar}\n", file=sys.stderr,
              flush=True)
    elif sel.message:
        print(sel.message, file=sys.stderr, flush=True)
    if sel.platform == "gpu" and sel.note:
        print(f"fo_jax.bench: WARNING: {sel.note}", file=sys.stderr, flush=True)


def run(shapes: Optional[Sequence[str]], collectives: Sequence[str], out: str,
        stem_prefix: str = "bench", configs: Sequence[dict] = (), extended: bool = True,
        chunks: Sequence[int] = (2, 4), windowed: bool = True, plots: bool = True,
        tag: str = "", require_gpu: bool = False, tp: Optional[int] = None,
        dtype: str = "bfloat16") -> list:
    """Measures every method on every (collective, shape); writes the files; returns the rows.

    Args:
      shapes: per-GPU "MxNxK" shapes (None: the design shapes, or tiny ones on CPU).
      collectives: any of "reduce_scatter", "all_reduce", "all_gather".
      out: output folder.
      stem_prefix: file names are {out}/{stem_prefix}_tp{tp}_{date}[_{dtype}]{tag}.*
      configs: extra fo_jax configurations (OverlapConfig fields), labelled
        fo_jax[g,sm,c] or fo_jax[g,sm,c,gemm_config].
      extended: also fo_jax.tuned, jax.chunked, xla.windowed_einsum (else the core methods).
      chunks: chunk counts of jax.chunked.
      windowed: run xla.windowed_einsum (a separate process).
      plots: write the PNG plots (needs matplotlib).
      tag: suffix of method names and file names.
      require_gpu: raise SelectionError instead of measuring on CPU host devices or with
        fo_jax's CUDA module missing.
      tp: devices to measure on (default: every local GPU; 8 host devices without GPUs).
      dtype: "bfloat16" or "float16".

    Raises:
      devices.SelectionError: the flags cannot be met here (the message says why).
    """
    if dtype not in DTYPES:
        raise _devices.SelectionError(f"fo_jax.bench: dtype {dtype!r}: expected one of {DTYPES}")
    _devices.add_cpu_flag()
    from fo_jax.bench import core  # noqa: PLC0415 (imports jax: after the flag, before devices)

    timing = dict(reps=20, trials=5, warmup=3)
    xla_rows, xla_error, sel = [], None, None
    if extended and windowed:
        # First, while this process holds no GPU memory; the GPU count comes from a child, so
        # that a flag this machine cannot meet fails before any measuring.
        num_gpus = _devices.count_gpus_in_subprocess()
        if num_gpus is not None:
            sel = _select(num_gpus, tp, require_gpu)
            if not sel.single:
                run_shapes = list(shapes or (CPU_SHAPES if sel.platform == "cpu"
                                             else core.DESIGN_SHAPES))
                core.progress(f"xla.windowed_einsum on {sel.tp} {sel.platform} devices "
                                  "(separate process) ...")
                win_timing = timing if sel.platform == "gpu" else dict(reps=3, trials=3)
                xla_rows, xla_error = _run_windowed(sel, run_shapes, collectives, dtype,
                                                    win_timing)
        else:
            xla_error = "could not count the GPUs in a child process"

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh  # noqa: PLC0415

    from fo_jax import _cuda  # noqa: PLC0415
    from fo_jax.bench import overlap, report, single  # noqa: PLC0415

    gpus = _cuda.gpu_devices()
    sel = _select(len(gpus), tp, require_gpu)
    _announce(sel)
    on_cpu = sel.platform == "cpu"
    if on_cpu:
        cpus = jax.devices("cpu")
        if len(cpus) < sel.tp:
            raise _devices.SelectionError(
                f"fo_jax.bench: TP {sel.tp} needs {sel.tp} host CPU devices, JAX has {len(cpus)} "
                f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} sets their count)")
        devs = cpus[:sel.tp]
        timing = dict(reps=3, trials=3, warmup=1)
    else:
        devs = gpus[:sel.tp]
    shapes = list(shapes or (CPU_SHAPES if on_cpu else core.DESIGN_SHAPES))
    jdtype = jnp.dtype(dtype)
    base = core.device_info(devs) | {"dtype": str(jdtype), "tp": sel.tp,
                                     "platform": sel.platform}
    if sel.note:
        base["note"] = sel.note
    res = core.Results(base)
    if sel.single:
        work = single.measure(devs[0], shapes, collectives, jdtype, res, timing, tag)
    else:
        mesh = Mesh(np.array(devs), ("tp",))
        work = overlap.measure(mesh, shapes, collectives, jdtype, res, timing, not on_cpu,
                               configs, extended, chunks, tag)
    if extended and windowed and not sel.single:
        _add_windowed(res, xla_rows, xla_error, work, tag)
    suffix = "" if dtype == "bfloat16" else f"_{dtype}"
    stem = os.path.join(out, f"{stem_prefix}_tp{sel.tp}_{base['date']}{suffix}{tag}")
    title = (f"{core.provenance(base)}; {dtype}, TP {sel.tp}; ms (median of {timing['trials']} "
             f"x {timing['reps']} calls), per-GPU x[M,K] @ w[K,N]")
    md = report.markdown(res.rows, title, sel.note)
    print("\n" + md)
    res.write_jsonl(stem + ".jsonl")
    res.write_markdown(stem + ".md", md)
    written = [stem + ".jsonl", stem + ".md"]
    if plots:
        try:
            written += report.plots(res.rows, stem, title, sel.note)
        except ImportError:
            print("warning: matplotlib is missing (pip install 'fo_jax[bench]'): no plots",
                  file=sys.stderr)
    print("wrote " + ", ".join(written))
    if sel.note:
        print(f"\n*** {sel.note.upper()} ***")
    return res.rows


def _add_windowed(res, xla_rows: list, xla_error: Optional[str], work: list, tag: str) -> None:
    from fo_jax.bench import core  # noqa: PLC0415
    from fo_jax.bench.xla_worker import WINDOWED_EINSUM_FLAGS  # noqa: PLC0415

    done = {(r["collective"], r["M"], r["N"], r["K"]) for r in xla_rows}
    for r in xla_rows:
        res.add(**{**r, "method": r["method"] + tag,
                   "xla_flags": " ".join(WINDOWED_EINSUM_FLAGS)})
    for collective, s in work:
        m, n, k = core.parse_shape(s)
        if (collective, m, n, k) not in done:
            res.add(M=m, N=n, K=k, collective=collective, method="xla.windowed_einsum" + tag,
                    ms=None, error=xla_error or "no result from the XLA process")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the CLI; returns the exit status (2 when the flags cannot be met here)."""
    ap = argparse.ArgumentParser(prog="python -m fo_jax.bench",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default="fo_jax_bench", help="output folder")
    ap.add_argument("--shapes", nargs="+", default=None,
                    help="per-GPU shapes MxNxK (default: the design shapes; tiny ones on CPU)")
    from fo_jax.bench.core import BENCH_COLLECTIVES  # noqa: PLC0415 (imports jax)

    ap.add_argument("--collectives", nargs="+", default=list(BENCH_COLLECTIVES),
                    choices=BENCH_COLLECTIVES)
    ap.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    ap.add_argument("--tp", type=int, default=None,
                    help="GPUs to measure on (default: all local GPUs; at most their count). "
                    "1: the single-GPU rows")
    ap.add_argument("--require-gpu", action="store_true",
                    help="exit non-zero instead of measuring on CPU host devices or without "
                    "fo_jax's CUDA module")
    ap.add_argument("--chunks", nargs="+", type=int, default=[2, 4], help="C of jax.chunked")
    ap.add_argument("--no-windowed-einsum", action="store_true",
                    help="skip xla.windowed_einsum (its separate process)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also time the SWEEP configurations")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra configurations, each GROUPS:SM_BUDGET:NCCL_MAX_CTAS[:GEMM_CONFIG]")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    try:
        configs = parse_configs(args.configs, args.sweep)
    except ValueError as e:
        ap.error(str(e))
    try:
        run(args.shapes, args.collectives, args.out, configs=configs, chunks=args.chunks,
            windowed=not args.no_windowed_einsum, plots=not args.no_plots, tag=args.tag,
            require_gpu=args.require_gpu, tp=args.tp, dtype=args.dtype)
    except _devices.SelectionError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


def parse_configs(specs: Sequence[str], sweep: bool) -> list:
    """--configs G:SM:C[:GEMM_CONFIG] strings (+ SWEEP with --sweep) -> OverlapConfig fields.
    G is a group count, or explicit group sizes in tile-rows joined by "+" (e.g. 2+4+5+5)."""
    extra = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (3, 4):
            raise ValueError(f"--configs {spec!r}: expected GROUPS:SM_BUDGET:NCCL_MAX_CTAS"
                             "[:GEMM_CONFIG]")
        cfg = dict(zip(("sm_budget", "nccl_max_ctas"), map(int, parts[1:3])))
        if "+" in parts[0]:
            cfg["group_tile_rows"] = tuple(int(r) for r in parts[0].split("+"))
        else:
            cfg["num_groups"] = int(parts[0])
        if len(parts) == 4:
            cfg["gemm_config"] = parts[3]
        extra.append(cfg)
    return (SWEEP if sweep else []) + extra
