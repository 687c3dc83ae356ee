"""One JAX process per GPU with the copy engine across processes (launched by
tests/gpu/overlap/test_copy_engine_processes_gpu.py): the reduce-scatter cases of ipc_cases.py,
the copy engine requested, each CALLS times; every call must give the same bits, and each
process saves its shard (bf16 bits) under $FO_JAX_IPC_OUT for the test to compare with the
single-process copy engine. Then the all-reduce cases (AR_CASES, the copy engine requested: its
band sums store into the peers' mapped XLA memory), saved the same way (each process's output is
the whole product); the overlapped all-gather cases (AG_CASES, the copy engine requested: its rows
pushed into the peers' mapped XLA memory, the per-call table in shared memory), each process's
column block of the product saved the same way and its gathered x checked against x; then the
all-gather and the all-reduce with the default transport, on NCCL (the copy engine across
processes is opt-in for both), against the float64 reference."""

import os
import sys

import jax
import numpy as np

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402
from ipc_cases import (AG_CALLS, AG_CASES, AR_CASES, CALLS, CASES, ag_config,  # noqa: E402
                       ag_fn, ag_operands, ar_config, check_shard, config, lowered_transport,
                       operands, shard_ag_operands, shard_operands, tp_fn, tp_mesh)

out_dir = os.environ["FO_JAX_IPC_OUT"]
mesh = tp_mesh()
transports = fo_jax._cuda.module().Transport


def same_bits_every_call(f, args, calls, name, shard_of=lambda out: out):
    """Calls f(*args) `calls` times; each call's shard (shard_of(out)) must hold call 0's bits.
    Returns (call 0's bits, the last call's output)."""
    first = None
    for call in range(calls):
        out = f(*args)
        bits = np.asarray(shard_of(out).addressable_shards[0].data).view(np.uint16)
        if first is None:
            first = bits
        assert np.array_equal(bits, first), f"{name}: call {call} differs from call 0"
    return first, out


def save(name, bits, err):
    np.save(os.path.join(out_dir, f"{name}_{proc}.npy"), bits)
    print(f"process {proc}: {name} ok (rel err {err:.2e})", flush=True)


for seed, (name, m, n, k_rank, ring) in enumerate(CASES):
    x, w, ref = operands(m, n, k_rank, nproc, seed)
    xg, wg = shard_operands(mesh, x, w)
    f = tp_fn(mesh, config(ring))
    assert lowered_transport(f, xg, wg) == transports["copy_engine"].value, name
    first, out = same_bits_every_call(f, (xg, wg), CALLS, name)
    save(name, first, check_shard(out, ref, name))

for seed, (name, m, n, k_rank, rounds) in enumerate(AR_CASES, start=len(CASES)):
    x, w, ref = operands(m, n, k_rank, nproc, seed)
    xg, wg = shard_operands(mesh, x, w)
    f = tp_fn(mesh, ar_config(rounds), "all_reduce")
    assert lowered_transport(f, xg, wg) == transports["copy_engine"].value, name
    first, out = same_bits_every_call(f, (xg, wg), CALLS, name)
    save(name, first, check_shard(out, ref, name))

for seed, (name, rows, n, k, bands) in enumerate(AG_CASES, start=len(CASES) + len(AR_CASES)):
    x, w, ref = ag_operands(rows, n, k, nproc, seed)
    xg, wg = shard_ag_operands(mesh, x, w)
    f = ag_fn(mesh, ag_config(bands))
    assert lowered_transport(f, xg, wg) == transports["copy_engine"].value, name
    first, (y, g) = same_bits_every_call(f, (xg, wg), AG_CALLS, name, shard_of=lambda o: o[0])
    (gathered,) = g.addressable_shards
    assert np.array_equal(np.asarray(gathered.data).view(np.uint16),
                          x.view(np.uint16)), f"{name}: the gathered x differs from x"
    save(name, first, check_shard(y, ref, name))

x, w, ref = ag_operands(512, 1024, 2048, nproc, 98)
xg, wg = shard_ag_operands(mesh, x, w)
f = ag_fn(mesh, fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False))
assert lowered_transport(f, xg, wg) == transports["nccl"].value, "the copy engine is opt-in"
check_shard(f(xg, wg)[0], ref, "all-gather on NCCL")

x, w, ref = operands(4096, 1024, 512, nproc, 99)
xg, wg = shard_operands(mesh, x, w)
f = tp_fn(mesh, fo_jax.OverlapConfig(allow_fallback=False), "all_reduce")
assert lowered_transport(f, xg, wg) == transports["nccl"].value, "the copy engine is opt-in"
check_shard(f(xg, wg), ref, "all_reduce on NCCL")
print(f"WORKER OK process {proc}/{nproc}", flush=True)
jax.distributed.shutdown()
