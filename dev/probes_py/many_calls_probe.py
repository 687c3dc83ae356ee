"""Diagnostic (device machine): many back-to-back overlapped calls on every local GPU, in batches
with progress output, to find which path stops making progress. One variant per process.
Usage: python many_calls_probe.py COLLECTIVE[,COLLECTIVE...] CALLS BATCH [M N K].
Environment: FO_JAX_TRANSPORT=nccl and FO_JAX_CE_* (transport and plan); PROBE_METHOD=baseline
(XLA's dot + psum / psum_scatter instead of fo_jax: the control); PROBE_PLACED=1 (inputs placed
on the mesh once, instead of resharded from one GPU on every call as in the tests);
PROBE_DISRUPT=newkernel|unload|globals|none: halfway through every batch, with calls in flight,
run a jitted function compiled beforehand but never run (its kernel's first launch: a lazy module
load under CUDA_MODULE_LOADING=LAZY), or destroy an executable that ran before (a module unload),
or run a new function with a constant array (its module has an initialised global: loading it
waits for GPU 0 to drain while it holds a driver lock that peer memcpy calls need,
dev/probes/ctx_lock_probe.cu), ways a host thread can wait for a GPU to drain while other
threads still have to enqueue the peers' parts of a call (docs/performance.md, 'Copies as
graph launches');
PROBE_DISRUPT=globals_thread: instead, a thread runs and drops, one after another on every GPU,
PROBE_POOL (default 400) functions with constant arrays compiled beforehand (a module with
globals loaded, then unloaded, on a busy GPU many times a second: the most direct attempt at the
driver-lock deadlock); PROBE_STALL_S (default 20): with no new call
dispatched or batch completed for that long, fo_jax._diagnostics.watch_for_stall reports and
ends the process (dev/lease/hang_probe.sh attaches a debugger first)."""

import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fo_jax
from fo_jax import _diagnostics

logging.basicConfig(level=logging.WARNING)
logging.getLogger("fo_jax").setLevel("DEBUG")  # each call's path and plan
collective, calls, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m, n, k = (int(a) for a in sys.argv[4:7]) if len(sys.argv) > 6 else (1024, 1024, 1024)
method = os.environ.get("PROBE_METHOD", "fo_jax")
placed = os.environ.get("PROBE_PLACED") == "1"
disrupt = os.environ.get("PROBE_DISRUPT", "none")
stall_s = float(os.environ.get("PROBE_STALL_S", "20"))
progress = {"dispatched": 0, "phase": "start"}
_diagnostics.watch_for_stall(
    lambda: (progress["dispatched"], progress["phase"]), stall_s,
    lambda: f"phase {progress['phase']}, {progress['dispatched']} calls dispatched in all")
devs = [d for d in jax.devices() if d.platform == "gpu"]
mesh = Mesh(np.array(devs), ("tp",))
cfg = fo_jax.OverlapConfig(allow_fallback=False,
                           transport=os.environ.get("FO_JAX_TRANSPORT") or None)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
in_specs = (P(None, "tp"), P("tp", None))
if placed:
    x, w = (jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, w), in_specs))
print(f"probe: {method}, {len(devs)} GPUs, {m}x{n}x{k}, inputs "
      f"{'placed once' if placed else 'resharded from one GPU every call'}, disruption "
      f"{disrupt}, CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING', '(unset)')}",
      flush=True)


_spare = {"n": 0}


def _function_with_constant(i, y):
    """A compiled function whose module holds constant array number i as an initialised global
    (a new constant: a new executable, a new module)."""
    table = np.arange(4096, dtype=np.float32) * i
    return jax.jit(lambda v: v * table + 1.0).lower(y).compile()


def _prepare_disruption():
    """For one disruption: a compiled-but-never-run function (newkernel), one with a constant
    array (globals), or a run-once executable to drop (unload)."""
    _spare["n"] += 1
    y = jnp.full((4096,), float(_spare["n"]), jnp.float32)
    if disrupt == "globals":
        return [_function_with_constant(_spare["n"], y), y]
    g = jax.jit(lambda v, c=_spare["n"]: jnp.sin(v * (c + 0.5)) + c).lower(y).compile()
    if disrupt == "unload":
        jax.block_until_ready(g(y))
    return [g, y]


def _disrupt(prepared):
    """Runs or drops the prepared executable; `prepared` (the only other reference) is emptied."""
    g, y = prepared
    prepared.clear()
    if disrupt in ("newkernel", "globals"):
        g(y)  # not waited for
    elif disrupt == "unload":
        del g
        import gc

        gc.collect()


def _start_globals_thread():
    """Compiles PROBE_POOL functions with constant arrays spread over the GPUs, then runs and
    drops them one by one on a daemon thread (module load with globals, then unload) until the
    pool is used up or the probe ends."""
    import gc
    import threading

    pool = []
    for i in range(int(os.environ.get("PROBE_POOL", "400"))):
        y = jax.device_put(jnp.zeros((4096,), jnp.float32), devs[i % len(devs)])
        pool.append((_function_with_constant(i + 1, y), y))
        # Progress for the stall watchdog: 400 compilations outlast its 20 s (without it, a
        # globals_thread run is reported as a stall while it is still compiling).
        progress["phase"] = f"start: {i + 1} functions with constants compiled"
    print(f"probe: {len(pool)} functions with constants compiled", flush=True)

    def churn():
        ran = 0
        while pool:
            g, y = pool.pop()
            g(y)  # not waited for: its module loads while the GPU is busy
            del g
            ran += 1
            if ran % 8 == 0:
                gc.collect()  # dropped executables: their modules unload
            time.sleep(0.01)
        print(f"probe: the churn thread ran and dropped {ran} functions", flush=True)

    threading.Thread(target=churn, daemon=True).start()


def _body(coll):
    if method == "baseline":
        if coll == "reduce_scatter":
            return lambda a, b: jax.lax.psum_scatter(a @ b, "tp", scatter_dimension=0, tiled=True)
        return lambda a, b: jax.lax.psum(a @ b, "tp")
    return lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=coll, config=cfg)


if disrupt == "globals_thread":
    _start_globals_thread()
for coll in collective.split(","):  # several: one after the other in this process
    out_spec = P("tp", None) if coll == "reduce_scatter" else P()
    f = jax.jit(jax.shard_map(_body(coll), mesh=mesh, in_specs=in_specs, out_specs=out_spec))
    t0 = time.time()
    done = 0
    while done < calls:
        progress["phase"] = f"{coll} dispatch from call {done}"
        outs = []
        prepared = _prepare_disruption() if disrupt not in ("none", "globals_thread") else None
        for i in range(batch):
            outs.append(f(x, w))
            progress["dispatched"] += 1
            if prepared is not None and i == batch // 2:
                progress["phase"] += f" (disrupted: {disrupt} after call {done + i})"
                _disrupt(prepared)
                prepared = None
        progress["phase"] = f"{coll} block on calls {done}..{done + batch - 1}"
        jax.block_until_ready(outs)
        done += batch
        print(f"{coll}: {done} calls, {time.time() - t0:.2f} s", flush=True)
print("PROBE OK", flush=True)
