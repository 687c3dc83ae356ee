"""One process for all GPUs, run by test_overlap_gpu.test_copy_engine_under_env with an environment
that fo_jax reads once per process (FO_JAX_CE_COPY_THREAD=0: the copy stream's work enqueued on
XLA's thread instead of fo_jax's copy thread, peer_transport.h; FO_JAX_SPIN_WAIT=1: spin kernels
instead of stream waits): the copy-engine transport, both collectives, 20 back-to-back calls each,
every call and every GPU's copy against float64."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fo_jax  # noqa: E402
from numerics import REL_TOL, random_operands, rel_err  # noqa: E402

tp = int(sys.argv[1])
mesh = Mesh(np.array(jax.devices()[:tp]), ("tp",))
cfg = fo_jax.OverlapConfig(transport="copy_engine", allow_fallback=False)
x, w, x64, w64 = random_operands(np.random.default_rng(3), 1024 * tp, 1024, 1536, jnp.bfloat16)
expect = x64 @ w64
for collective, out_spec in (("reduce_scatter", P("tp", None)), ("all_reduce", P(None, None))):
    f = jax.jit(jax.shard_map(
        lambda a, b, c=collective: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=c,
                                                            config=cfg),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=out_spec))
    outs = [f(x, w) for _ in range(20)]
    jax.block_until_ready(outs)
    for i, out in enumerate(outs):
        shards = [out] if collective == "reduce_scatter" else [
            s.data for s in out.addressable_shards]
        for got in shards:
            err = rel_err(np.asarray(got.astype(jnp.float32)), expect)
            assert err <= REL_TOL[jnp.dtype(jnp.bfloat16)], (collective, i, err)
    print(f"{collective}: 20 calls OK", flush=True)
print("ENV WORKER OK", flush=True)
