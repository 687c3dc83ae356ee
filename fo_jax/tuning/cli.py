"""CLI: tune overlapped_matmul on the local GPUs and store the choices in the tuning cache.

    python -m fo_jax.tune --shapes 8192x8192x2048 16384x8192x7168 \
        --collectives reduce_scatter all_reduce [--top 3]

Shapes are per GPU (x[M, K] @ w[K, N]); TP is the number of local GPUs. Afterwards
`overlapped_matmul` picks the tuned configuration at trace time (fo_jax.tuning.lookup).
`python -m fo_jax.tuning` is the same command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Optional, Sequence

from fo_jax import _cuda
from fo_jax.bench import core as bench_core
from fo_jax.tuning import cache, measure, search


def _table(results: list) -> str:
    header = ["M x N x K", "collective", "chosen (groups, SMs to NCCL, NCCL CTAs)",
              "predicted ms", "measured ms", "error", "jax.baseline ms", "speedup"]
    rows = []
    for shape, collective, e in results:
        rows.append([shape, collective,
                     f"{e['num_groups']}, {e['sms_for_nccl']}, {e['nccl_max_ctas']}",
                     f"{e['predicted_ms']:.3f}", f"{e['measured_ms']:.3f}",
                     f"{100 * (e['predicted_ms'] - e['measured_ms']) / e['measured_ms']:+.1f}%",
                     f"{e['baseline_ms']:.3f}", f"{e['baseline_ms'] / e['measured_ms']:.2f}x"])
    return bench_core.markdown_table(header, rows)


def _errors(results: list) -> str:
    lines, errs = [], []
    for shape, collective, e in results:
        for r in e["candidates"]:
            if r.get("error") is None:
                lines.append(f"  {collective} {shape} g{r['num_groups']} s{r['sms_for_nccl']} "
                             f"c{r['nccl_max_ctas']}: FAILED {r.get('failure', '')}")
                continue
            errs.append(abs(r["error"]))
            lines.append(f"  {collective} {shape} g{r['num_groups']} s{r['sms_for_nccl']} "
                         f"c{r['nccl_max_ctas']}: predicted {r['predicted_ms']:.3f} ms, measured "
                         f"{r['measured_ms']:.3f} ms, error {100 * r['error']:+.1f}%"
                         + (" (heuristic)" if r.get("heuristic") else ""))
    if errs:
        lines.append(f"median |prediction error| over {len(errs)} measured candidates: "
                     f"{100 * statistics.median(errs):.1f}%")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the CLI; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m fo_jax.tune", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=bench_core.DESIGN_SHAPES,
                    help="per-GPU shapes MxNxK (x[M,K] @ w[K,N])")
    ap.add_argument("--collectives", nargs="+", default=list(bench_core.COLLECTIVES),
                    choices=bench_core.COLLECTIVES)
    ap.add_argument("--top", type=int, default=3, help="predicted-best candidates to measure")
    ap.add_argument("--recalibrate", action="store_true",
                    help="measure the NCCL curves and slowdowns again even if cached")
    args = ap.parse_args(argv)
    shapes = [(s, bench_core.parse_shape(s)) for s in args.shapes]

    gpus = _cuda.gpu_devices()
    if len(gpus) < 2:
        print("fo_jax.tune: no GPUs to tune on: found "
              f"{len(gpus)} CUDA GPU(s), need 2 or more (TP = number of local GPUs). Tuning "
              "times real GPU runs; run it on the GPU machine.", file=sys.stderr)
        return 2
    if not _cuda.module_available():
        print(f"fo_jax.tune: fo_jax's CUDA module is missing: {_cuda.unavailable_reason()}",
              file=sys.stderr)
        return 2
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh  # noqa: PLC0415

    tp = len(gpus)
    for s, (m, n, k) in shapes:
        if m % (8 * tp) or n % 8 or k % 8:
            print(f"fo_jax.tune: shape {s}: need M a multiple of 8*{tp}, N and K of 8",
                  file=sys.stderr)
            return 2
    mesh = Mesh(np.array(gpus), ("tp",))
    dtype = jnp.dtype(jnp.bfloat16)
    total_sms = measure.num_sms(gpus[0])
    print(f"fo_jax.tune: {tp} x {gpus[0].device_kind} ({total_sms} SMs), NCCL "
          f"{cache.nccl_version()}, bf16; cache {cache.cache_path()}", file=sys.stderr)
    progress = search.Progress(len(args.collectives) * search.calibration_steps()
                               + len(args.collectives) * len(shapes)
                               * search.steps_per_shape(args.top))
    t0 = time.perf_counter()
    results, failed = [], []
    for collective in args.collectives:
        try:
            curves, factors, gap = search.calibrate(mesh, collective, total_sms, dtype, progress,
                                               args.recalibrate)
        except Exception as e:  # noqa: BLE001 (report; the other collective may still work)
            failed.append(f"{collective} calibration: {e!r}")
            progress.skip(len(shapes) * search.steps_per_shape(args.top))
            continue
        for s, (m, n, k) in shapes:
            try:
                entry = search.tune_shape(mesh, collective, m, n, k, dtype, curves, factors,
                                          gap, total_sms, args.top, progress)
                results.append((s, collective, entry))
            except Exception as e:  # noqa: BLE001 (report, go on with the other shapes)
                failed.append(f"{collective} {s}: {e!r}")
                progress.skip(search.steps_per_shape(args.top))
    progress.close()
    print(f"\nfo_jax.tune: {tp} x {gpus[0].device_kind}, {time.perf_counter() - t0:.0f} s\n")
    if results:
        print(_table(results))
        print("Prediction error per measured candidate (predicted vs measured):")
        print(_errors(results))
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    print(f"\ntuning cache: {cache.cache_path()}")
    return 1 if failed else 0
