"""One JAX process per GPU (launched by tests/gpu/overlap/test_copy_engine_processes_gpu.py):
process 0 alone calls fo_jax.describe on the reduce-scatter before any overlapped call has been
traced, while the other processes wait for it (a key in JAX's key-value store) before tracing
theirs. describe() must answer without asking them anything (an exchange would wait for hosts
and probe keys that they publish only later, until FO_JAX_PLAN_TIMEOUT_S): the copy engine, with
the note that the first lowering decides. Then every process runs the call, which must lower to
the copy engine (the probe passes on these machines) and match the float64 reference."""

import sys
import time

proc, nproc, port = (int(a) for a in sys.argv[1:4])

import jax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402
from fo_jax import _process_layout  # noqa: E402
from ipc_cases import (check_shard, lowered_transport, operands, shard_operands,  # noqa: E402
                       tp_fn, tp_mesh)

mesh = tp_mesh()
x, w, ref = operands(4096, 1024, 512, nproc, 11)
xg, wg = shard_operands(mesh, x, w)
cfg = fo_jax.OverlapConfig(allow_fallback=False)
store = _process_layout._client()
if proc == 0:
    seen = {}

    def body(a, b):
        seen["choice"] = fo_jax.describe(a, b, axis_name="tp", config=cfg)
        return a

    start = time.monotonic()
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                          out_specs=P(None, "tp"))).trace(xg, wg)
    took = time.monotonic() - start
    choice = seen["choice"]
    assert choice.transport == "copy_engine", choice
    assert "not yet checked in this process" in choice.reason, choice.reason
    print(f"DESCRIBE answered in {took:.1f} s: {choice.transport}", flush=True)
    store.key_value_set("fo_jax_test/described", "1")
else:
    store.blocking_key_value_get("fo_jax_test/described", 120_000)
f = tp_fn(mesh, cfg)
assert lowered_transport(f, xg, wg) == fo_jax._cuda.module().Transport["copy_engine"].value
check_shard(f(xg, wg), ref, "reduce_scatter")
print(f"WORKER OK process {proc}/{nproc}", flush=True)
jax.distributed.shutdown()
