"""Is a benchmark sample bimodal? 40 batches of 20 back-to-back calls (as bench_overlap.py times
them), each batch's wall time per call printed in order, fo_jax against jax.baseline,
reduce-scatter 8192x8192x2048 on all GPUs; then the same with a 20 ms pause before each batch
(the GPUs idle, as between bench_overlap.py's methods). wall_fit_probe.py saw two batches of
one process read 474 and 550 us per call (benchmarks/NOTES.md §16). Run next to an
`nvidia-smi --query-gpu=... -lms` log to see clocks and power (tools/gpu_run.sh does not).

Usage: python benchmarks/batch_spread_probe.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import fo_jax  # noqa: E402,F401  (before JAX uses a GPU: 32 hardware queues)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from fo_jax import _benchcore  # noqa: E402

BATCHES, CALLS = 40, 20

gpus = benchlib.cuda_gpus_or_exit("batch_spread_probe.py", minimum=2)
mesh = Mesh(np.array(gpus), ("tp",))
x, w = _benchcore.random_operands(mesh, 8192, 8192, 2048, jnp.bfloat16)
for method in ("fo_jax", "baseline"):
    f = _benchcore.build(mesh, "reduce_scatter", method)
    for _ in range(5):
        jax.block_until_ready(f(x, w))
    for pause in (0.0, 0.02):
        walls = []
        for _ in range(BATCHES):
            if pause:
                time.sleep(pause)
            walls.append(benchlib.dispatch_and_wall_ms(f, x, w, calls=CALLS)[1] * 1e3)
        q = statistics.quantiles(walls, n=10)
        print(f"{method} pause {pause * 1e3:.0f} ms: {BATCHES} batches of {CALLS}, us/call: "
              f"min {min(walls):.0f} p10 {q[0]:.0f} median {statistics.median(walls):.0f} "
              f"p90 {q[-1]:.0f} max {max(walls):.0f}; in order: "
              + " ".join(f"{v:.0f}" for v in walls), flush=True)
