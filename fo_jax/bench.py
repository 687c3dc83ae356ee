"""`python -m fo_jax.bench`: fo_jax against the JAX options a user could pick, on all local GPUs.

Methods (bf16; per-GPU x[M,K] @ w[K,N]; collective over the "tp" axis of all local GPUs):
  fo_jax               overlapped_matmul, default configuration (the copy-engine transport where
                       it can run; else NCCL with the tuning cache's entry or the shape
                       heuristic)
  fo_jax.nccl          overlapped_matmul with transport="nccl" (defaults)
  fo_jax.tuned         overlapped_matmul with the configuration `python -m fo_jax.tune` cached
  fo_jax.sequential    the same kernels without overlap: one group, GEMM on all SMs, then NCCL
  fo_jax[g,sm,c]       --configs / --sweep configurations (groups, GEMM SMs, NCCL CTAs)
  jax.baseline         XLA dot (fp32 accumulation) + psum / psum_scatter, inside shard_map
  jax.chunked[cC]      M split into C chunks, dot + psum / psum_scatter each, concatenated
  xla.windowed_einsum  jit + NamedSharding dot under XLA's windowed-einsum flags (own process)
  gemm_only, comm_only XLA dot alone; psum / psum_scatter alone (the overlap's floor)
Times: median of 5 x 20 back-to-back calls. Writes JSON Lines, a markdown table and PNG plots
(time, speedup over jax.baseline, overlap efficiency) to --out. Without 2+ GPUs it runs the XLA
reference path on 8 host CPU devices (tiny default shapes) and says so in every output.
The measuring code lives in the package (not in benchmarks/, which the wheel does not ship) so
the installed CLI runs anywhere; benchmarks/bench_overlap.py is a thin wrapper around `run`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from typing import Optional, Sequence

CPU_NOTE = ("reference path on CPU: no GPUs found, every method ran XLA on host CPU devices; "
            "these times are not GPU measurements")
CPU_SHAPES = ["256x512x256", "512x512x512"]
CPU_FLAG = "--xla_force_host_platform_device_count=8"
SWEEP = [dict(num_groups=g, sm_budget=sm, nccl_max_ctas=c)
         for g, sm, c in itertools.product((4, 8, 16), (100, 116), (16, 32))]
CORE_METHODS = ("fo_jax", "fo_jax.sequential", "jax.baseline", "gemm_only", "comm_only")


def _add_cpu_flag() -> None:
    # Must happen before jax creates its backends (importing jax does not). Harmless with GPUs:
    # it only sets the host platform's device count.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + CPU_FLAG).strip()


def _run_windowed(gpu_shapes: Sequence[str], cpu_shapes: Sequence[str], collectives,
                  timing: dict, timeout_s: int = 900) -> tuple:
    """Runs fo_jax._bench_xla in a fresh process; returns (platform or None, rows, error)."""
    from fo_jax._bench_xla import ROW_PREFIX, WINDOWED_EINSUM_FLAGS  # noqa: PLC0415

    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *WINDOWED_EINSUM_FLAGS]).strip()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "fo_jax._bench_xla", "--gpu-shapes", *gpu_shapes,
           "--cpu-shapes", *cpu_shapes, "--collectives", *collectives,
           "--reps", str(timing["reps"]), "--trials", str(timing["trials"])]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = e.stdout or "", f"timed out after {timeout_s} s", -1
        out = out.decode() if isinstance(out, bytes) else out
    platform, rows = None, []
    for line in out.splitlines():
        if line.startswith("FO_JAX_PLATFORM "):
            platform = line.split()[1]
        elif line.startswith(ROW_PREFIX):
            rows.append(json.loads(line[len(ROW_PREFIX):]))
    error = None
    if rc != 0:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-3:]
        error = f"XLA process exited {rc} with flags {' '.join(WINDOWED_EINSUM_FLAGS)}: " + \
            " / ".join(tail)
    return platform, rows, error


def run(shapes: Optional[Sequence[str]], collectives: Sequence[str], out: str,
        stem_prefix: str = "bench", configs: Sequence[dict] = (), extended: bool = True,
        chunks: Sequence[int] = (2, 4), windowed: bool = True, plots: bool = True,
        tag: str = "", require_gpu: bool = False) -> list:
    """Measures every method on every (collective, shape); writes the files; returns the rows.

    Args:
      shapes: per-GPU "MxNxK" shapes (None: the design shapes, or tiny ones on CPU).
      collectives: "reduce_scatter" and/or "all_reduce".
      out: output folder.
      stem_prefix: file names are {out}/{stem_prefix}_tp{tp}_{date}{tag}.*
      configs: extra fo_jax configurations (OverlapConfig fields), labelled
        fo_jax[g,sm,c] or fo_jax[g,sm,c,gemm_config].
      extended: also fo_jax.tuned, jax.chunked, xla.windowed_einsum (else the core methods).
      chunks: chunk counts of jax.chunked.
      windowed: run xla.windowed_einsum (a separate process).
      plots: write the PNG plots (needs matplotlib).
      tag: suffix of method names and file names.
      require_gpu: exit instead of falling back to CPU devices.
    """
    _add_cpu_flag()
    from fo_jax import _benchcore, _bench_report  # noqa: PLC0415

    timing = dict(reps=20, trials=5, warmup=3)
    gpu_shapes = list(shapes or _benchcore.DESIGN_SHAPES)
    cpu_shapes = list(shapes or CPU_SHAPES)
    xla_rows, xla_error, platform = [], None, None
    if extended and windowed:  # first: the parent must not hold GPU memory yet
        print("[fo_jax.bench] xla.windowed_einsum (separate process) ...", file=sys.stderr,
              flush=True)
        platform, xla_rows, xla_error = _run_windowed(gpu_shapes, cpu_shapes, collectives,
                                                      timing)

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh  # noqa: PLC0415

    import fo_jax  # noqa: PLC0415
    from fo_jax import _cuda  # noqa: PLC0415

    gpus = _cuda.gpu_devices()
    on_cpu = len(gpus) < 2
    if require_gpu and (on_cpu or not fo_jax.cuda_module_available()):
        sys.exit(f"needs 2+ CUDA GPUs and fo_jax's CUDA module (found {len(gpus)} GPU(s), "
                 f"CUDA module {'present' if fo_jax.cuda_module_available() else 'missing'})")
    note = CPU_NOTE if on_cpu else None
    if not on_cpu and not fo_jax.cuda_module_available():
        note = "fo_jax's CUDA module is missing: fo_jax rows ran the XLA reference path"
    devices = jax.devices("cpu")[:8] if on_cpu else gpus
    if on_cpu:
        timing = dict(reps=3, trials=3, warmup=1)
        print(f"\n*** {CPU_NOTE.upper()} ***\n", file=sys.stderr, flush=True)
    shapes = cpu_shapes if on_cpu else gpu_shapes
    tp = len(devices)
    mesh = Mesh(np.array(devices), ("tp",))
    dtype = jnp.dtype(jnp.bfloat16)
    base = _benchcore.device_info(devices) | {"dtype": str(dtype), "tp": tp,
                                              "platform": "cpu" if on_cpu else "gpu"}
    if note:
        base["note"] = note
    res = _benchcore.Results(base)
    total_sms = None
    if not on_cpu and extended:
        from fo_jax.tuning import cache, measure  # noqa: PLC0415

        total_sms = measure.num_sms(gpus[0])
    work = [(c, s) for c in collectives for s in shapes]
    for i, (collective, s) in enumerate(work):
        m, n, k = _benchcore.parse_shape(s)
        print(f"[{i + 1}/{len(work)}] {collective} {s}", file=sys.stderr, flush=True)
        x, w = _benchcore.random_operands(mesh, m, n, k, dtype, seed=i)
        y = _benchcore.random_partials(mesh, m, n, dtype, seed=i + 1000)
        assert x.dtype == dtype and w.dtype == dtype and y.dtype == dtype
        build = _benchcore.build
        seq = fo_jax.OverlapConfig(num_groups=1, sm_budget=1024)
        fns = {"fo_jax": build(mesh, collective, "fo_jax"),
               "fo_jax.sequential": build(mesh, collective, "fo_jax", seq)}
        if not on_cpu:
            fns["fo_jax.nccl"] = build(mesh, collective, "fo_jax",
                                       fo_jax.OverlapConfig(transport="nccl"))

        if total_sms is not None:
            tuned = cache.lookup(gpus[0].device_kind, collective, m, n, k, dtype, tp)
            if tuned is not None:
                fns["fo_jax.tuned"] = build(mesh, collective, "fo_jax", fo_jax.OverlapConfig(
                    num_groups=tuned["num_groups"], sm_budget=total_sms - tuned["sms_for_nccl"],
                    nccl_max_ctas=tuned["nccl_max_ctas"]))
        for cfg in configs:
            fns[config_label(cfg)] = build(mesh, collective, "fo_jax", fo_jax.OverlapConfig(**cfg))
        fns["jax.baseline"] = build(mesh, collective, "baseline")
        if extended:
            for c in chunks:
                fns[f"jax.chunked[c{c}]"] = build(mesh, collective, "chunked", chunks=c)
        fns["gemm_only"] = build(mesh, collective, "gemm_only")
        fns["comm_only"] = build(mesh, collective, "comm_only")
        ref = fns["jax.baseline"](x, w)
        # Check every method first; then time the working ones with their trials interleaved
        # (A B C A B C ...) so clock and power drift hits all of them alike.
        ok = {}
        for name, f in fns.items():
            args = (y,) if name == "comm_only" else (x, w)
            extra = {"chunks": int(name[len("jax.chunked[c"):-1])} if "chunked" in name else {}
            try:
                got = f(*args)
                assert got.dtype == dtype, (name, got.dtype)
                if name not in ("gemm_only", "comm_only"):
                    err = float(_benchcore.rel_err(got, ref))
                    assert err < 2e-2, f"{name}: wrong result (rel err {err:.2e})"
                ok[name] = extra
            except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
                res.add(M=m, N=n, K=k, collective=collective, method=name + tag, ms=None,
                        error=repr(e)[:500], **extra)
        on_xw = {name: fns[name] for name in ok if name != "comm_only"}
        times = _benchcore.time_ms_interleaved(on_xw, x, w, **timing)
        if "comm_only" in ok:
            times["comm_only"] = _benchcore.time_ms(fns["comm_only"], y, **timing)
        for name in fns:
            if name in times:
                res.add(M=m, N=n, K=k, collective=collective, method=name + tag,
                        ms=round(times[name], 4), **ok[name])
        fns.clear()
    if extended and windowed:
        done = {(r["collective"], r["M"], r["N"], r["K"]) for r in xla_rows}
        from fo_jax._bench_xla import WINDOWED_EINSUM_FLAGS  # noqa: PLC0415

        for r in xla_rows:
            res.add(**{**r, "method": r["method"] + tag,
                       "xla_flags": " ".join(WINDOWED_EINSUM_FLAGS)})
        for collective, s in work:
            m, n, k = _benchcore.parse_shape(s)
            if (collective, m, n, k) not in done:
                res.add(M=m, N=n, K=k, collective=collective, method="xla.windowed_einsum" + tag,
                        ms=None, error=xla_error or "no result from the XLA process")
        if platform is not None and platform != ("cpu" if on_cpu else "gpu"):
            print(f"warning: the XLA process ran on {platform}", file=sys.stderr)
    stem = os.path.join(out, f"{stem_prefix}_tp{tp}_{base['date']}{tag}")
    title = (f"{base['device']} x{tp}, {base['date']}, commit {base['commit']}, bf16, ms (median "
             f"of {timing['trials']} x {timing['reps']} calls), per-GPU x[M,K] @ w[K,N]")
    md = _bench_report.markdown(res.rows, title, note)
    print("\n" + md)
    res.write_jsonl(stem + ".jsonl")
    res.write_markdown(stem + ".md", md)
    written = [stem + ".jsonl", stem + ".md"]
    if plots:
        try:
            written += _bench_report.plots(res.rows, stem, title, note)
        except ImportError:
            print("warning: matplotlib is missing (pip install 'fo_jax[bench]'): no plots",
                  file=sys.stderr)
    print("wrote " + ", ".join(written))
    if note:
        print(f"\n*** {note.upper()} ***")
    return res.rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the CLI; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m fo_jax.bench",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default="fo_jax_bench", help="output folder")
    ap.add_argument("--shapes", nargs="+", default=None,
                    help="per-GPU shapes MxNxK (default: the design shapes; tiny ones on CPU)")
    ap.add_argument("--collectives", nargs="+", default=["reduce_scatter", "all_reduce"],
                    choices=["reduce_scatter", "all_reduce"])
    ap.add_argument("--chunks", nargs="+", type=int, default=[2, 4], help="C of jax.chunked")
    ap.add_argument("--no-windowed-einsum", action="store_true",
                    help="skip xla.windowed_einsum (its separate process)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also time the SWEEP configurations")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra configurations, each GROUPS:SM_BUDGET:NCCL_MAX_CTAS[:GEMM_CONFIG]")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    run(args.shapes, args.collectives, args.out, configs=parse_configs(args.configs, args.sweep),
        chunks=args.chunks, windowed=not args.no_windowed_einsum, plots=not args.no_plots,
        tag=args.tag)
    return 0


def config_label(cfg: dict) -> str:
    """fo_jax[g4,sm100,c32] / fo_jax[g2+4+5+5,sm100,c32,pp_128x192x64_c2] for a config dict."""
    groups = cfg.get("num_groups")
    if cfg.get("group_tile_rows"):
        groups = "+".join(str(r) for r in cfg["group_tile_rows"])
    label = f"fo_jax[g{groups},sm{cfg['sm_budget']},c{cfg['nccl_max_ctas']}"
    return label + (f",{cfg['gemm_config']}]" if cfg.get("gemm_config") else "]")


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


if __name__ == "__main__":
    sys.exit(main())
