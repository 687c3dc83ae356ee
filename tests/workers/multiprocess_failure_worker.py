"""One JAX process per GPU (launched by test_overlap_gpu.test_one_process_per_gpu_failure and
test_reliability_gpu.test_known_failure_in_another_process_ends_the_wait_without_a_timeout): the
last process's communicator breaks (injected: an asynchronous NCCL error that leaves it unusable)
before its second call, so it aborts it and raises; the other processes' second call then waits
for it inside NCCL until they abort their communicators, on the failure it publishes
(fo_jax/_failure_watch.py) or by their progress watchdog (FO_JAX_COMM_TIMEOUT_S, when a test sets
it), and their next call raises. Every process prints RAISED and the
exception, then leaves with the others (leave_together.py)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402
from fo_jax import _cuda  # noqa: E402
from leave_together import leave_together  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("tp",))
# NCCL requested: the injected error breaks an NCCL communicator (the copy engine, which a
# reduce-scatter across the processes of one host takes by default, has its own failure tests).
cfg = fo_jax.OverlapConfig(allow_fallback=False, transport="nccl")
m, n, k = 1024, 512, 256 * nproc
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((m, k)) / np.sqrt(k), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
xg = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P(None, "tp")), lambda i: x[i])
wg = jax.make_array_from_callback(w.shape, NamedSharding(mesh, P("tp", None)), lambda i: w[i])
f = jax.jit(jax.shard_map(
    lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective="reduce_scatter",
                                          config=cfg),
    mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None)))
jax.block_until_ready(f(xg, wg))
print(f"process {proc}: first call done", flush=True)
try:
    for i in range(2, 6):
        if proc == nproc - 1 and i == 2:
            _cuda.module().inject_async_error_for_tests(6, -1, True)  # ncclRemoteError, broken
        jax.block_until_ready(f(xg, wg))
        print(f"process {proc}: call {i} returned", flush=True)
    print(f"process {proc}: NO EXCEPTION", flush=True)
except Exception as e:  # noqa: BLE001 - the point is that it arrives as an exception
    print(f"process {proc}: RAISED {e}", flush=True)
leave_together()  # the others raise only when their watchdog fires (~5 s after the failure)
