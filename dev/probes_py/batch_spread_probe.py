"""Is a benchmark sample bimodal? Batches of 20 back-to-back calls (as bench_overlap.py times
them), each batch's wall time per call printed in order, for several variants, reduce-scatter
8192x8192x2048 on all GPUs; back to back and with a 20 ms pause before each batch (the GPUs idle,
as between bench_overlap.py's methods). Variants are interleaved (rounds of 10 batches each).
A variant is a method ("fo_jax" or "baseline") with optional environment settings applied while
its function is traced, e.g. fo_jax:FO_JAX_CE_SPLIT_SUM=0. Context: docs/performance.md,
'What bounds the numbers'.

Usage: python dev/probes_py/batch_spread_probe.py [VARIANT ...]   (default: fo_jax baseline)
"""
import os
import statistics
import sys
import time

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, _BENCHMARKS)  # benchlib
import benchlib  # noqa: E402
import fo_jax  # noqa: E402,F401  (before JAX uses a GPU: 32 hardware queues)
import jax.numpy as jnp  # noqa: E402

from fo_jax.bench import core as _benchcore  # noqa: E402

ROUNDS, BATCHES, CALLS = 4, 10, 20


variants = sys.argv[1:] or ["fo_jax", "baseline"]
mesh = benchlib.tp_mesh_or_exit("batch_spread_probe.py")
x, w = _benchcore.random_operands(mesh, 8192, 8192, 2048, jnp.bfloat16)
fns = {v: benchlib.build_rs_variant(mesh, v, x, w) for v in variants}
for pause in (0.0, 0.02):
    walls = {v: [] for v in variants}
    for _ in range(ROUNDS):
        for v, f in fns.items():
            for _ in range(BATCHES):
                if pause:
                    time.sleep(pause)
                walls[v].append(benchlib.dispatch_and_wall_ms(f, x, w, calls=CALLS)[1] * 1e3)
    for v, ws in walls.items():
        q = statistics.quantiles(ws, n=10)
        print(f"{v} pause {pause * 1e3:.0f} ms: {len(ws)} batches of {CALLS}, us/call: "
              f"min {min(ws):.0f} p10 {q[0]:.0f} median {statistics.median(ws):.0f} "
              f"p90 {q[-1]:.0f} max {max(ws):.0f}; in order: " + " ".join(f"{a:.0f}" for a in ws),
              flush=True)
