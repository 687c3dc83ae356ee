"""Every collective form of the copy-engine transport, 32 calls each, on all local GPUs of one
process (tests/gpu/overlap/test_reliability_gpu.py runs it twice: with the epochs starting at 0,
and with FO_JAX_TEST_EPOCH_START=4294967288 so that the calls cross the 32-bit wrap). Prints
one "FORM <name> <sha256 of every call's output>" line per form, the final epochs
("EPOCHS ...") and "WORKER OK"."""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from fo_jax import info

FORMS = {
    "rs_direct_one": ("reduce_scatter", dict(copy_engine_ring=False, copy_engine_sum_split="one")),
    "rs_direct_bands": ("reduce_scatter",
                        dict(copy_engine_ring=False, copy_engine_sum_split="bands")),
    "rs_direct_rows": ("reduce_scatter",
                       dict(copy_engine_ring=False, copy_engine_sum_split="rows",
                            copy_engine_chunk_groups=2)),
    "rs_ring": ("reduce_scatter", dict(copy_engine_ring=True)),
    "ar_one_round": ("all_reduce", dict(copy_engine_rounds=1)),
    "ar_two_rounds": ("all_reduce", dict(copy_engine_rounds=2)),
}
CALLS = 32

devs = jax.devices()
tp = len(devs)
mesh = Mesh(np.array(devs), ("tp",))
m, n, k = 2048 * tp, 1024, 512  # per-rank x[m, k]
rng = np.random.default_rng(7)
x = jnp.asarray(rng.standard_normal((m, k * tp)) / np.sqrt(k), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((k * tp, n)), jnp.bfloat16)
for name, (collective, fields) in FORMS.items():
    config = fo_jax.OverlapConfig(allow_fallback=False, transport="copy_engine", **fields)
    f = jax.jit(jax.shard_map(
        lambda a, b, c=collective, cfg=config: fo_jax.overlapped_matmul(
            a, b, axis_name="tp", collective=c, config=cfg),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
        out_specs=P("tp", None) if collective == "reduce_scatter" else P()))
    digest = hashlib.sha256()
    for _ in range(CALLS):
        out = f(x, w)
        for shard in sorted(out.addressable_shards, key=lambda s: s.device.id):
            digest.update(np.asarray(shard.data).tobytes())
    print(f"FORM {name} {digest.hexdigest()}", flush=True)
comms = info.device_resources()["communicators"]
print("EPOCHS " + " ".join(str(c["epoch"]) for c in comms if c["copy_engine"]), flush=True)
print("WORKER OK", flush=True)
