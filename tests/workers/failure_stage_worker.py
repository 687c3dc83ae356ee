"""One overlapped form on all local GPUs of one process, with FO_JAX_TEST_FAIL=<stage>:<rank> set
by the test (tests/gpu/overlap/test_reliability_gpu.py): that rank fails at that stage after the
address exchange (a copy graph build, the GEMM launch, the copy thread's hand-off) on every call.
The other ranks must not wait for it: each call returns or raises promptly, and once one raised
every later call raises (the group is failed). Arguments: the form (a key of FORMS). Prints
"CALL <i> RAISED|RETURNED <seconds> <first line of the error>" per call, then "WORKER OK", and
leaves through the interpreter's normal exit (the copy threads and CUDA torn down as usual)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from call_report import report_calls

FORMS = {
    "rs_direct": ("reduce_scatter", dict(transport="copy_engine", copy_engine_ring=False)),
    "rs_rows": ("reduce_scatter", dict(transport="copy_engine", copy_engine_ring=False,
                                       copy_engine_sum_split="rows", copy_engine_chunk_groups=2)),
    "rs_ring": ("reduce_scatter", dict(transport="copy_engine", copy_engine_ring=True)),
    "ar_two_rounds": ("all_reduce", dict(transport="copy_engine", copy_engine_rounds=2)),
    "rs_nccl": ("reduce_scatter", dict(transport="nccl")),
    "ar_nccl": ("all_reduce", dict(transport="nccl")),
    "ag_copy_engine": ("all_gather", dict(transport="copy_engine", all_gather="overlap")),
    "ag_nccl": ("all_gather", dict(transport="nccl", all_gather="overlap")),
}
CALLS = 3

form = sys.argv[1]
collective, fields = FORMS[form]
devs = jax.devices()
tp = len(devs)
mesh = Mesh(np.array(devs), ("tp",))
config = fo_jax.OverlapConfig(allow_fallback=False, **fields)
rng = np.random.default_rng(3)
if collective == "all_gather":
    x = jnp.asarray(rng.standard_normal((1024 * tp, 1024)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((1024, 512 * tp)), jnp.bfloat16)
    f = jax.jit(jax.shard_map(
        lambda a, b: fo_jax.all_gather_matmul(a, b, axis_name="tp", config=config),
        mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
        out_specs=(P(None, "tp"), P("tp", None))))
else:
    x = jnp.asarray(rng.standard_normal((2048 * tp, 512 * tp)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((512 * tp, 1024)), jnp.bfloat16)
    f = jax.jit(jax.shard_map(
        lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=collective,
                                              config=config),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
        out_specs=P("tp", None) if collective == "reduce_scatter" else P()))
report_calls(f, (x, w), CALLS)
print("WORKER OK", flush=True)
