"""Whether an fp8 weight given [N, K] (w_transposed=True) reaches fo_jax's fp8 kernel without a
transpose in the compiled program, against a [K, N] weight (one transpose per call).

Compiles fo_jax.overlapped_matmul over a one-GPU "tp" axis (the fp8 GEMM alone) and
fo_jax.matmul, each with w[K, N] and with w_transposed=True, prints the optimized HLO's
transpose instructions and fo_jax custom calls, and the median time per call of each.

Usage: python3 dev/probes_py/fp8_transposed_weight_hlo.py [--m 8192] [--n 8192] [--k 2048]
"""

from __future__ import annotations

import argparse
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fo_jax


def ops(text: str) -> list[str]:
    """The optimized HLO's transposes and custom calls, one line each (names only)."""
    found = []
    for line in text.splitlines():
        if (re.search(r"= \S+ transpose\(", line) or "kind=" in line and "transpose" in line
                or 'custom_call_target="fo_jax' in line):
            found.append(line.strip()[:160])
    return found


def time_ms(f, *args, calls: int = 50) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t) / calls * 1e3)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=2048)
    a = ap.parse_args()
    gpu = jax.devices("gpu")[0]
    print(gpu.device_kind, "cuda module", fo_jax.cuda_module_available(), flush=True)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((a.m, a.k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((a.k, a.n)), jnp.bfloat16)
    (xq, xs), (wq, ws) = fo_jax.quantize_fp8(x), fo_jax.quantize_fp8(w)
    wq_nk = jnp.asarray(wq.T)  # stored [N, K], as a user keeps an fp8 weight
    mesh = Mesh(np.array([gpu]), ("tp",))
    results = {}
    for name, transposed in (("[K, N]", False), ("[N, K], w_transposed", True)):
        wt = wq_nk if transposed else wq
        over = jax.jit(jax.shard_map(
            lambda x, w, xs, ws, t=transposed: fo_jax.overlapped_matmul(
                x, w, axis_name="tp", collective="all_reduce", x_scale=xs, w_scale=ws,
                w_transposed=t),
            mesh=mesh, in_specs=(P(), P(), P(), P()), out_specs=P()))
        # fo_jax's kernel in both layouts (a [N, K] weight may otherwise go to XLA's fp8 dot).
        plain = jax.jit(lambda x, w, xs, ws, t=transposed: fo_jax.matmul(
            x, w, x_scale=xs, w_scale=ws, w_transposed=t,
            config=fo_jax.OverlapConfig(allow_fallback=False)))
        for op, f in (("overlapped_matmul", over), ("matmul", plain)):
            text = f.lower(xq, wt, xs, ws).compile().as_text()
            y = f(xq, wt, xs, ws)
            results[(op, transposed)] = y
            print(f"\n== {op}, weight {name}: {time_ms(f, xq, wt, xs, ws):.4f} ms per call")
            for line in ops(text):
                print("  ", line)
    gpus = jax.devices("gpu")
    if len(gpus) >= 2:  # the overlapped reduce-scatter over 2 GPUs, K sharded
        mesh2 = Mesh(np.array(gpus[:2]), ("tp",))
        for name, transposed in (("[K, N]", False), ("[N, K], w_transposed", True)):
            wt, wspec = (wq_nk, P(None, "tp")) if transposed else (wq, P("tp", None))
            # Operands placed as the call takes them, so that the timing is the call's only.
            xq2 = jax.device_put(xq, NamedSharding(mesh2, P(None, "tp")))
            wt = jax.device_put(wt, NamedSharding(mesh2, wspec))
            f = jax.jit(jax.shard_map(
                lambda x, w, xs, ws, t=transposed: fo_jax.overlapped_matmul(
                    x, w, axis_name="tp", collective="reduce_scatter", x_scale=xs, w_scale=ws,
                    w_transposed=t, config=fo_jax.OverlapConfig(allow_fallback=False)),
                mesh=mesh2, in_specs=(P(None, "tp"), wspec, P(), P()), out_specs=P("tp", None)))
            text = f.lower(xq2, wt, xs, ws).compile().as_text()
            results[("reduce_scatter tp2", transposed)] = f(xq2, wt, xs, ws)
            print(f"\n== reduce_scatter over 2 GPUs, weight {name}: "
                  f"{time_ms(f, xq2, wt, xs, ws):.4f} ms per call")
            for line in ops(text):
                print("  ", line)
    for op in sorted({op for op, _ in results}):
        same = bool(jnp.array_equal(results[(op, False)], results[(op, True)]))
        print(f"{op}: results of the two layouts bit-identical: {same}")


if __name__ == "__main__":
    main()
