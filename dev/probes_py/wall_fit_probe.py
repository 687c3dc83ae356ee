"""How much of a benchmark sample is per-batch latency: wall time per call of n back-to-back calls,
fitted as period + F / n (n = 20 and 100), fo_jax against jax.baseline, reduce-scatter
8192x8192x2048 on all GPUs (docs/performance.md, 'What bounds the numbers'). bench_overlap.py times
n = 20 (as the anchors); F is the latency from the batch's first dispatch to its first kernel plus
the end of the last kernel to the host's wake-up. n = 1 shows one call's latency. Prints one line
per method.

Usage: python dev/probes_py/wall_fit_probe.py
"""
import os
import statistics
import sys

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, _BENCHMARKS)  # benchlib
import benchlib  # noqa: E402
import fo_jax  # noqa: E402,F401  (before JAX uses a GPU: 32 hardware queues)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fo_jax.bench import core as _benchcore  # noqa: E402

mesh = benchlib.tp_mesh_or_exit("wall_fit_probe.py")
x, w = _benchcore.random_operands(mesh, 8192, 8192, 2048, jnp.bfloat16)
for method in ("fo_jax", "baseline"):
    f = _benchcore.build(mesh, "reduce_scatter", method)
    for _ in range(5):
        jax.block_until_ready(f(x, w))
    res = {}  # n -> [(median dispatch ms/call, median wall ms/call) per repetition]
    for n in (1, 20, 100, 20, 100, 1):
        d, wl = zip(*[benchlib.dispatch_and_wall_ms(f, x, w, calls=n) for _ in range(5)])
        res.setdefault(n, []).append((statistics.median(d), statistics.median(wl)))
    line = []
    for n, v in sorted(res.items()):
        dispatch = " / ".join(f"{a:.3f}" for a, _ in v)
        wall = " / ".join(f"{b:.3f}" for _, b in v)
        line.append(f"n={n}: dispatch {dispatch} ms/call, wall {wall} ms/call")
    w20 = statistics.mean(b for _, b in res[20])
    w100 = statistics.mean(b for _, b in res[100])
    period = (100 * w100 - 20 * w20) / 80
    fixed = 20 * (w20 - period)
    print(f"{method}: " + "; ".join(line)
          + f"; fit wall(n) = period + F/n: period {period * 1e3:.0f} us, F {fixed * 1e3:.0f} us")
