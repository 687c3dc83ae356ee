"""Shared benchmark plumbing for the scripts here: timing, operands, result rows, profiler traces.

Timing and result rows are re-exported from fo_jax/bench/core.py (one copy of the timing code for
the scripts, the tuner and `python -m fo_jax.bench`). Timing: `reps` back-to-back calls of a
jitted function, one block_until_ready at the end, time divided by `reps`; repeated `trials`
times; the median is reported (the method of ../shared/anchors, median of 5 x 20 calls), so
numbers compare.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

import fo_jax
from fo_jax.bench import core as bench_core
from fo_jax.bench.core import (  # noqa: F401 (re-exports)
    DESIGN_SHAPES,
    Results,
    commit,
    device_info,
    markdown_table,
    median,
    provenance,
    rotated,
    time_ms,
    time_ms_interleaved,
    xla_fp8_dot,
)


# fo_jax's own kernels, never fo_jax.matmul's handover to XLA's dot that a GPU model's table
# may choose: what a benchmark of fo_jax's GEMM itself passes.
OWN_KERNEL = fo_jax.OverlapConfig(allow_fallback=False)
OWN_KERNEL_FAST = fo_jax.OverlapConfig(allow_fallback=False, fp8_fast_accumulation=True)


def fo_jax_fp8_nk(config=None):
    """fo_jax.matmul(xq, wq, x_scale=, w_scale=) of a weight stored [N, K] (w_transposed=True)
    under `config`: a function of (xq, wq, x_scale, w_scale)."""
    return lambda xq, wq, xs, ws: fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws,
                                                w_transposed=True, config=config)


def fp8_reference(xq, w_kn, xs, ws) -> jax.Array:
    """fo_jax.reference.fp8_matmul (the dequantized operands' float32 product, bf16 out) of a
    weight [K, N], compiled without XLA's autotuning: the fp8 methods are checked against it
    and nothing times it, while autotuning would time GEMM algorithms for its float32 dot at
    every shape (on a GPU; on a CPU the option changes nothing)."""
    return jax.jit(fo_jax.reference.fp8_matmul).lower(xq, w_kn, xs, ws).compile(
        compiler_options={"xla_gpu_autotune_level": 0})(xq, w_kn, xs, ws)


def cuda_gpus_or_exit(script: str, minimum: int = 1) -> list:
    """The CUDA devices, or exit with a message if fewer than `minimum` or no fo_jax CUDA module."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < minimum or not fo_jax.cuda_module_available():
        need = "a CUDA GPU" if minimum == 1 else f"{minimum}+ CUDA GPUs"
        sys.exit(f"{script} needs {need} and fo_jax's CUDA module")
    return gpus


def tp_mesh_or_exit(script: str) -> Mesh:
    """A one-axis ("tp") mesh over every CUDA GPU, or exit as cuda_gpus_or_exit (2+ GPUs)."""
    return Mesh(np.array(cuda_gpus_or_exit(script, minimum=2)), ("tp",))


def build_rs_variant(mesh: Mesh, variant: str, x, w):
    """A reduce-scatter variant's jitted function, traced and warmed up (5 calls) with its
    settings in the environment: "METHOD[:ENV=VALUE...]" (the probes compare such variants
    interleaved in one process; plan variants are OverlapConfig fields, the environment holds only
    process-wide switches such as FO_JAX_FORCE_REFERENCE=1)."""
    method, *settings = variant.split(":")
    saved = dict(os.environ)
    os.environ.update(s.split("=", 1) for s in settings)
    try:
        f = bench_core.build(mesh, "reduce_scatter", method)
        for _ in range(5):
            jax.block_until_ready(f(x, w))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return f


def gemm_operands(m: int, n: int, k: int, dtype, device, seed: int) -> tuple:
    """x [m, k] ~ N(0, 1/k) and w [k, n] ~ N(0, 1) in `dtype` on `device` (outputs ~ N(0, 1))."""
    rng = np.random.default_rng(seed)
    x = jax.device_put(jnp.asarray(rng.standard_normal((m, k)) / np.sqrt(k), dtype), device)
    w = jax.device_put(jnp.asarray(rng.standard_normal((k, n)), dtype), device)
    assert x.dtype == dtype and w.dtype == dtype  # a float64 scalar must not promote them
    return x, w


def kernel_events(trace_dir: str) -> dict:
    """{GPU index: [(name, start_ns, end_ns, stream line name)]}: every kernel and memset of a
    `jax.profiler.trace` written to trace_dir (the "Stream" lines of each GPU plane)."""
    from jax.profiler import ProfileData  # noqa: PLC0415 (only the profiling scripts need it)

    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"no xplane.pb under {trace_dir}")
    out: dict = {}
    for plane in ProfileData.from_file(sorted(paths)[-1]).planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        gpu = int(plane.name.split(":")[2].split()[0])
        for line in plane.lines:
            if not line.name.startswith("Stream"):  # skip XLA op / module summary lines
                continue
            for ev in line.events:
                out.setdefault(gpu, []).append(
                    (ev.name, ev.start_ns, ev.start_ns + ev.duration_ns, line.name))
    return out


def kernel_label(name: str) -> str:
    """A short name for a profiled kernel: "fo_jax GEMM" for the signaling GEMM (a CUTLASS
    device_kernel), else the name without return type, anonymous namespace, template arguments
    and parameters (e.g. "fo_jax::BandSum", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL")."""
    if "device_kernel" in name or "cutlass" in name:
        return "fo_jax GEMM"
    name = name.replace("void ", "").replace("(anonymous namespace)::", "")
    return name.split("(")[0].split("<")[0].strip()[:48]


def is_memset(event_name: str) -> bool:
    """Whether a profiled GPU event (kernel_events' name) is a memset, not a kernel."""
    return "memset" in event_name.lower()


def gpu_ms_samples(fns: dict, *args, calls: int = 8, rounds: int = 3) -> tuple:
    """Three GPU times per call from JAX profiler traces, one sample per round: `rounds` traces of
    `calls` back-to-back calls per method, the methods alternating in rotated order, so that a
    round's samples of two methods are taken next to each other. Kernel time: the sum of the
    durations of every kernel and memset a call runs on GPU 0. Span: from the first kernel's start
    to the last one's end on GPU 0, over `calls`; it also holds the gaps between kernels and what
    the profiler does not record as a kernel (stream memory operations), and, where the host
    cannot enqueue calls as fast as the GPU runs them, host time. Kernels alone: kernel time
    without the memsets (is_memset). ({name: [kernel ms per round]}, {name: [span ms per
    round]}, {name: [kernels-alone ms per round]})."""
    kernel: dict = {name: [] for name in fns}
    span: dict = {name: [] for name in fns}
    alone: dict = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in rotated(names, r):
            with tempfile.TemporaryDirectory() as tdir:
                with jax.profiler.trace(tdir):
                    jax.block_until_ready([fns[name](*args) for _ in range(calls)])
                events = kernel_events(tdir).get(0, [])
            if not events:
                raise RuntimeError(f"{name}: the profiler recorded no GPU kernel")
            kernel[name].append(sum(e[2] - e[1] for e in events) / 1e6 / calls)
            span[name].append((max(e[2] for e in events) - min(e[1] for e in events))
                              / 1e6 / calls)
            alone[name].append(sum(e[2] - e[1] for e in events if not is_memset(e[0]))
                               / 1e6 / calls)
    return kernel, span, alone


def kernel_ms_samples(fns: dict, *args, calls: int = 8, rounds: int = 3) -> dict:
    """gpu_ms_samples' kernel time: {name: [ms per round]}."""
    return gpu_ms_samples(fns, *args, calls=calls, rounds=rounds)[0]


def kernel_ms_interleaved(fns: dict, *args, calls: int = 8, rounds: int = 3) -> dict:
    """kernel_ms_samples' median per method. Unlike wall clock it holds no host or queue time,
    so small differences between kernels (a signal's cost) are not lost in the harness's noise.
    {name: ms}."""
    return {name: median(v) for name, v in
            kernel_ms_samples(fns, *args, calls=calls, rounds=rounds).items()}


def paired_overhead(samples: list, baseline: list) -> tuple:
    """(median, lowest, highest) over rounds of samples[r] / baseline[r] - 1: the cost of one
    method over another, each round's two samples taken next to each other, so that the clock's
    drift over a run moves both."""
    if len(samples) != len(baseline) or not samples:
        raise ValueError(f"paired_overhead: {len(samples)} samples against {len(baseline)}")
    ratios = [a / b - 1 for a, b in zip(samples, baseline)]
    return median(ratios), min(ratios), max(ratios)


def wall_ms_samples(fns: dict, *args, calls: int = 64, rounds: int = 3) -> tuple:
    """Wall-clock time per call without the profiler, one sample per round: `calls` back-to-back
    calls per method, the methods alternating in rotated order (dispatch_and_wall_ms). Where the
    GPU sets the pace (the host's enqueue time per call well under the wall time) this is the
    calls' span on the GPU with nothing recording it. ({name: [wall ms per call per round]},
    {name: [host enqueue ms per call per round]})."""
    wall: dict = {name: [] for name in fns}
    host: dict = {name: [] for name in fns}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            jax.block_until_ready(fns[name](*args))
            h, w = dispatch_and_wall_ms(fns[name], *args, calls=calls)
            host[name].append(h)
            wall[name].append(w)
    return wall, host


def dispatch_and_wall_ms(f, *args, calls: int = 20) -> tuple:
    """(host ms to enqueue one call, wall ms per call) over `calls` back-to-back calls: when the
    first is as long as the second, a wall-clock harness measures the host, not the GPU."""
    t0 = time.perf_counter()
    outs = [f(*args) for _ in range(calls)]
    t1 = time.perf_counter()
    jax.block_until_ready(outs)
    return (t1 - t0) / calls * 1e3, (time.perf_counter() - t0) / calls * 1e3
