"""The overlapped forms the single-process reliability workers run (failure_stage_worker.py,
stopped_rank_worker.py): each a collective and OverlapConfig fields, and the jitted call over
every local GPU with its operands."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax

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


def form_call(form: str):
    """(f, args): the form's jitted call over every local GPU and its random operands."""
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
        return f, (x, w)
    x = jnp.asarray(rng.standard_normal((2048 * tp, 512 * tp)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((512 * tp, 1024)), jnp.bfloat16)
    f = jax.jit(jax.shard_map(
        lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=collective,
                                              config=config),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
        out_specs=P("tp", None) if collective == "reduce_scatter" else P()))
    return f, (x, w)


def form_reference(form: str, args: tuple):
    """The correct result of form_call(form)'s call on `args` in float64 (x @ w: the
    reduce-scatter's rows, the all-reduce's replicated sum), or None for the all-gather (two
    results)."""
    if FORMS[form][0] == "all_gather":
        return None
    x, w = (np.asarray(a, dtype=np.float64) for a in args)
    return x @ w
