"""Diagnostic (device machine): many back-to-back overlapped calls on every local GPU, in batches
with progress output, to find which path stops making progress. One variant per process (a hang
is killed by the caller's timeout). Usage: python many_calls_probe.py COLLECTIVE CALLS BATCH
[M N K]; transport and plan overrides come from the environment (FO_JAX_CE_*, or
FO_JAX_TRANSPORT=nccl)."""

import faulthandler
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax

logging.basicConfig(level=logging.WARNING)
logging.getLogger("fo_jax").setLevel("DEBUG")  # each call's path and plan
faulthandler.dump_traceback_later(float(os.environ.get("PROBE_DUMP_S", "40")), exit=True)
collective, calls, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])  # a,b: both
m, n, k = (int(a) for a in sys.argv[4:7]) if len(sys.argv) > 6 else (1024, 1024, 1024)
devs = [d for d in jax.devices() if d.platform == "gpu"]
mesh = Mesh(np.array(devs), ("tp",))
cfg = fo_jax.OverlapConfig(allow_fallback=False,
                           transport=os.environ.get("FO_JAX_TRANSPORT") or None)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
for coll in collective.split(","):  # several: one after the other in this process
    out_spec = P("tp", None) if coll == "reduce_scatter" else P()
    f = jax.jit(jax.shard_map(
        lambda a, b, c=coll: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=c,
                                                      config=cfg),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=out_spec))
    t0 = time.time()
    done = 0
    while done < calls:
        outs = [f(x, w) for _ in range(batch)]
        jax.block_until_ready(outs)
        done += batch
        print(f"{coll}: {done} calls, {time.time() - t0:.2f} s", flush=True)
print("PROBE OK", flush=True)
