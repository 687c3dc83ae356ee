"""One JAX process per GPU with the copy engine across processes (launched by
tests/gpu/overlap/test_copy_engine_processes_gpu.py): the reduce-scatter cases of ipc_cases.py,
the copy engine requested, each CALLS times; every call must give the same bits, and each
process saves its shard (bf16 bits) under $FO_JAX_IPC_OUT for the test to compare with the
single-process copy engine. Then an all-reduce with the default config, which must lower to the
NCCL transport (its copy-engine form writes into the peers' XLA outputs) and match the float64
reference."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402
from ipc_cases import CALLS, CASES, config, lowered_transport, operands  # noqa: E402

out_dir = os.environ["FO_JAX_IPC_OUT"]
mesh = Mesh(np.array(jax.devices()), ("tp",))
transports = fo_jax._cuda.module().Transport


def global_array(a, spec):
    return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx: a[idx])


def tp_fn(collective, cfg):
    out_spec = P("tp", None) if collective == "reduce_scatter" else P()
    return jax.jit(jax.shard_map(
        lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=collective,
                                              config=cfg),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=out_spec))


for seed, (name, m, n, k_rank, ring) in enumerate(CASES):
    x, w, ref = operands(m, n, k_rank, nproc, seed)
    xg, wg = global_array(x, P(None, "tp")), global_array(w, P("tp", None))
    f = tp_fn("reduce_scatter", config(ring))
    assert lowered_transport(f, xg, wg) == transports["copy_engine"].value, name
    first = None
    for call in range(CALLS):
        (shard,) = f(xg, wg).addressable_shards
        bits = np.asarray(shard.data).view(np.uint16)
        if first is None:
            first = bits
        assert np.array_equal(bits, first), f"{name}: call {call} differs from call 0"
    got = np.asarray(shard.data.astype(jnp.float32), np.float64)
    want = ref[shard.index]
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1.5e-2, (name, err)
    np.save(os.path.join(out_dir, f"{name}_{proc}.npy"), first)
    print(f"process {proc}: {name} ok (rel err {err:.2e})", flush=True)

x, w, ref = operands(4096, 1024, 512, nproc, 99)
xg, wg = global_array(x, P(None, "tp")), global_array(w, P("tp", None))
f = tp_fn("all_reduce", fo_jax.OverlapConfig(allow_fallback=False))
assert lowered_transport(f, xg, wg) == transports["nccl"].value
(shard,) = f(xg, wg).addressable_shards
got = np.asarray(shard.data.astype(jnp.float32), np.float64)
err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
assert err < 1.5e-2, ("all_reduce", err)
print(f"WORKER OK process {proc}/{nproc}", flush=True)
jax.distributed.shutdown()
