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
import numpy as np

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402
from ipc_cases import (CALLS, CASES, check_shard, config, lowered_transport, operands,  # noqa: E402
                       shard_operands, tp_fn, tp_mesh)

out_dir = os.environ["FO_JAX_IPC_OUT"]
mesh = tp_mesh()
transports = fo_jax._cuda.module().Transport

for seed, (name, m, n, k_rank, ring) in enumerate(CASES):
    x, w, ref = operands(m, n, k_rank, nproc, seed)
    xg, wg = shard_operands(mesh, x, w)
    f = tp_fn(mesh, config(ring))
    assert lowered_transport(f, xg, wg) == transports["copy_engine"].value, name
    first = None
    for call in range(CALLS):
        out = f(xg, wg)
        bits = np.asarray(out.addressable_shards[0].data).view(np.uint16)
        if first is None:
            first = bits
        assert np.array_equal(bits, first), f"{name}: call {call} differs from call 0"
    err = check_shard(out, ref, name)
    np.save(os.path.join(out_dir, f"{name}_{proc}.npy"), first)
    print(f"process {proc}: {name} ok (rel err {err:.2e})", flush=True)

x, w, ref = operands(4096, 1024, 512, nproc, 99)
xg, wg = shard_operands(mesh, x, w)
f = tp_fn(mesh, fo_jax.OverlapConfig(allow_fallback=False), "all_reduce")
assert lowered_transport(f, xg, wg) == transports["nccl"].value
check_shard(f(xg, wg), ref, "all_reduce")
print(f"WORKER OK process {proc}/{nproc}", flush=True)
jax.distributed.shutdown()
