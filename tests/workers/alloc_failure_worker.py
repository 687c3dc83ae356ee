"""Copy-engine reduce-scatter on all local GPUs of one process with FO_JAX_TEST_FAIL=alloc:<rank>
set by the test (tests/gpu/overlap/test_reliability_gpu.py): that rank's receive-buffer
allocation fails. Each of two calls must raise (every rank fails the call together) rather than
hang; prints "RAISED <call> <message>" for each and "WORKER OK"."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax

devs = jax.devices()
tp = len(devs)
mesh = Mesh(np.array(devs), ("tp",))
config = fo_jax.OverlapConfig(allow_fallback=False, transport="copy_engine")
f = jax.jit(jax.shard_map(
    lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective="reduce_scatter",
                                          config=config),
    mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None)))
x = jnp.ones((2048 * tp, 512 * tp), jnp.bfloat16)
w = jnp.ones((512 * tp, 1024), jnp.bfloat16)
for call in range(2):
    try:
        jax.block_until_ready(f(x, w))
        print(f"call {call} returned without an error", flush=True)
    except Exception as e:  # noqa: BLE001 (the expected failure, reported)
        print(f"RAISED {call} {e}", flush=True)
print("WORKER OK", flush=True)
