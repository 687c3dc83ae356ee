"""One JAX process per GPU with the copy engine across processes (launched by
tests/gpu/overlap/test_reliability_gpu.py with FO_JAX_TEST_FAIL=<stage>:<last rank>): the last
rank fails at that stage on every call, after its peers in the other processes may wait for it.
It releases their flags and fails its group; the other processes learn the failure through JAX's
key-value store (fo_jax/_failure_watch.py) and their later calls raise. Prints "CALL <i>
RAISED|RETURNED <seconds> <first line>" per call and "WORKER OK process <p>", then lingers
before leaving without jax.distributed.shutdown (a process that leaves first would end the
others through the coordination service before they could raise)."""

import os
import sys
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402
from call_report import report_calls  # noqa: E402
from ipc_cases import config, operands  # noqa: E402

CALLS = 6
mesh = Mesh(np.array(jax.devices()), ("tp",))
x, w, _ = operands(4096, 1024, 512, nproc, 5)
xg = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P(None, "tp")), lambda i: x[i])
wg = jax.make_array_from_callback(w.shape, NamedSharding(mesh, P("tp", None)), lambda i: w[i])
f = jax.jit(jax.shard_map(
    lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective="reduce_scatter",
                                          config=config(False, multiprocess=True)),
    mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None)))
report_calls(f, (xg, wg), CALLS, pause_s=1.5)  # the failure watch polls once a second
print(f"WORKER OK process {proc}", flush=True)
time.sleep(10)
os._exit(0)
