"""One JAX process per GPU (launched by test_overlap_gpu.test_one_process_per_gpu): initialize
jax.distributed, run both overlapped collectives on a global mesh, check against float64: the
reduce-scatter with the default transport (the copy engine across processes where the CUDA IPC
probe passes) and with NCCL requested; the all-reduce (NCCL with several processes)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
import fo_jax  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("tp",))
NO_FALLBACK = fo_jax.OverlapConfig(allow_fallback=False)  # small test shape: keep the CUDA path
NCCL = fo_jax.OverlapConfig(allow_fallback=False, transport="nccl")
m, n, k = 1024, 512, 256 * nproc
rng = np.random.default_rng(0)  # same data in every process
x = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
w = rng.standard_normal((k, n)).astype(np.float32)
ref = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) @ np.asarray(
    jnp.asarray(w, jnp.bfloat16), np.float64)


def global_array(a, spec):
    a = np.asarray(jnp.asarray(a, jnp.bfloat16))
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


xg, wg = global_array(x, P(None, "tp")), global_array(w, P("tp", None))
for collective, out_spec, cfg in (("reduce_scatter", P("tp", None), NO_FALLBACK),
                                 ("reduce_scatter", P("tp", None), NCCL),
                                 ("all_reduce", P(), NO_FALLBACK)):
    f = jax.jit(jax.shard_map(
        lambda a, b, c=collective, cfg=cfg: fo_jax.overlapped_matmul(
            a, b, axis_name="tp", collective=c, config=cfg),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=out_spec))
    assert "fo_jax_overlapped_matmul_v2" in f.lower(xg, wg).as_text()
    for _ in range(5):
        out = f(xg, wg)
    for shard in out.addressable_shards:
        got = np.asarray(shard.data.astype(jnp.float32), np.float64)
        want = ref[shard.index]
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1.5e-2, (collective, cfg.transport, err)
print(f"WORKER OK process {proc}/{nproc}", flush=True)
jax.distributed.shutdown()
