"""One JAX process of a plan-agreement run (tests/cpu/test_plan_agreement.py on CPU,
tests/gpu/overlap/test_reliability_gpu.py on GPUs): argv = process, processes, port, platform
("cpu" or "gpu"), num_groups[, scenario]. Lowers an overlapped reduce-scatter over a mesh with
one device per process, planned with <num_groups> groups as this process's tuning cache would
give them (a stand-in cache entry, not an explicit OverlapConfig field: a test gives one process
another value). On "cpu" it lowers for the "cuda" platform (no GPU needed: the plan agreement
runs at lowering); on "gpu" it also runs the call. Scenarios: "plain" (the default); "extra"
first lowers another overlapped call (other rows) that the other processes never lower, as a
`.lower()` for inspection would; "twice" lowers the shared call twice (two jits of it). Prints
"CHECKS <agreement checks> IN <seconds>" and "PLAN AGREED <process>", or "RAISED <process>
<type>: <message>"."""

import sys
import time

import jax

proc, nproc, port = (int(a) for a in sys.argv[1:4])
platform, num_groups = sys.argv[4], int(sys.argv[5])
scenario = sys.argv[6] if len(sys.argv) > 6 else "plain"
if platform == "gpu":
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                               local_device_ids=[proc])
else:
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import fo_jax  # noqa: E402
from fo_jax import _bootstrap, _plan  # noqa: E402
from leave_together import leave_together  # noqa: E402


def tuned(collective, m, n, k, dtype, tp):
    del dtype, tp
    entry = dict(_plan.heuristic_defaults(collective, m, n, k), num_groups=num_groups)
    entry.pop("group_weights", None)
    return entry


_plan._tuned = tuned  # this process's tuning cache
checks = []
check = _bootstrap.check_plan_agreement


def counted_check(*args, **kwargs):
    checks.append(args)
    return check(*args, **kwargs)


_bootstrap.check_plan_agreement = counted_check

mesh = Mesh(np.array(jax.devices()[:nproc]), ("tp",))
config = fo_jax.OverlapConfig(allow_fallback=False, transport="nccl")
m, n, k = 1024, 512, 256 * nproc


def lower(rows):
    """Lowers the overlapped call for x[rows, k] @ w[k, n] in a new jit (no lowering cache)."""
    f = jax.jit(jax.shard_map(
        lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective="reduce_scatter",
                                              config=config),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None)))
    x = jax.ShapeDtypeStruct((rows, k), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P(None, "tp")))
    w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=NamedSharding(mesh, P("tp", None)))
    if platform == "gpu":
        lowered = f.lower(x, w)
    else:
        lowered = f.trace(x, w).lower(lowering_platforms=("cuda",))
    assert "fo_jax_overlapped_matmul_v2" in lowered.as_text()
    return f, x, w


try:
    start = time.monotonic()
    if scenario == "extra":
        lower(2 * m)
    f, x, w = lower(m)
    if scenario == "twice":
        lower(m)
    print(f"CHECKS {len(checks)} IN {time.monotonic() - start:.1f}", flush=True)
    if platform == "gpu":
        ones = np.ones((m, k), jnp.bfloat16), np.ones((k, n), jnp.bfloat16)
        xg, wg = (jax.make_array_from_callback(a.shape, s.sharding, lambda i, a=a: a[i])
                  for a, s in zip(ones, (x, w)))
        jax.block_until_ready(f(xg, wg))
    print(f"PLAN AGREED {proc}", flush=True)
except Exception as e:  # noqa: BLE001 (reported for the test to check)
    print(f"RAISED {proc} {type(e).__name__}: {e}", flush=True)
# Every process leaves with the others, process 0 (which serves the key-value store) last, and
# without the distributed shutdown, whose barrier a process that raised may never reach.
leave_together()
