"""Lowering the CUDA path for the "cuda" platform from CPU devices (no GPU needed): the overlap
primitive's result types pass shard_map's check_vma, and the custom call carries the plan and
the mesh table as the FFI handler expects them; the handler's own decoding and validation of a
plan (fo_jax_check_overlap_plan, run on the CPU) accept the lowered plans and refuse broken ones
with a message. Needs the compiled CUDA module (built wherever nvcc is)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="CUDA module not built here (no nvcc at install time)")

NO_FALLBACK = fo_jax.OverlapConfig(allow_fallback=False, num_groups=2)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)])
def test_cuda_lowering_from_cpu(collective, mesh_shape):
    names = ("tp",) if len(mesh_shape) == 1 else ("data", "tp")
    mesh = cpu_mesh(mesh_shape, names)
    data = None if len(mesh_shape) == 1 else "data"
    if collective == "reduce_scatter":
        out_spec = P((data, "tp") if data else "tp", None)
    else:
        out_spec = P(data, None)
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                              config=NO_FALLBACK),
        mesh=mesh, in_specs=(P(data, "tp"), P("tp", None)), out_specs=out_spec))
    x = jnp.ones((1024, 512), jnp.bfloat16)
    w = jnp.ones((512, 256), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(f(x, w), np.float32), 512.0)  # CPU: reference
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "fo_jax_overlapped_matmul_v2" in text
    for attr in ("plan = {", "mesh = {", "group_tokens", "group_begin", "device_rank",
                 "axis_size"):
        assert attr in text, attr


def _plan(collective="reduce_scatter", transport="copy_engine", rows=8192, size=4, config=None):
    from fo_jax import _plan as plan_mod

    return plan_mod.plan_overlap("test", collective, size, jnp.dtype(jnp.bfloat16), rows, 8192,
                                 2048, config, transport)


@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_handler_decodes_the_plan(collective, transport):
    """The plan attribute as lowered, decoded and validated by the handler's code: the GEMM's
    arguments it derives are the plan's."""
    from fo_jax import _cuda_ops

    plan = _plan(collective, transport)
    got = _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), jnp.bfloat16, 8192,
                                       8192, 2048, rank=1)
    rs = collective == "reduce_scatter"
    assert got["batch"] == plan.gemm.batch == (4 if rs and transport == "nccl" else 1)
    assert got["m"] == 8192 // plan.gemm.batch and (got["n"], got["k"]) == (8192, 2048)
    assert got["config"] == plan.gemm.config_index and got["sm_budget"] == plan.gemm.sm_budget
    assert got["num_groups"] == plan.num_groups and len(got["expected"]) == plan.num_groups
    tiles_n = -(-8192 // plan.gemm.tile_n)
    b = plan.gemm.group_begin
    assert got["expected"] == [plan.gemm.batch * (b[g + 1] - b[g]) * tiles_n
                               for g in range(plan.num_groups)]
    assert got["output_rows"] == (2048 if rs else 8192)
    if transport == "copy_engine":
        assert got["rotate_tile_rows"] == 2 * plan.tiles_chunk  # rank 1 visits chunk 2 first
        assert got["rotate_period_tile_rows"] == (4 * plan.tiles_chunk if plan.rounds > 1 else 0)
    else:
        assert got["rotate_tile_rows"] == got["rotate_period_tile_rows"] == 0


def _broken(plan, **changes):
    import dataclasses

    gemm = {k: v for k, v in changes.items() if k in ("group_begin", "batch", "config_index")}
    rest = {k: v for k, v in changes.items() if k not in gemm}
    return dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, **gemm), **rest)


@pytest.mark.parametrize("change,message", [
    (dict(group_begin=(0, 5, 64)), "whole clusters"),
    (dict(group_begin=(0, 16, 99)), "group table must start at 0 and end"),
    (dict(group_begin=(0, 24, 64)), "split along the rounds x ranks chunks"),
    (dict(batch=4), "takes batch 1 here, the plan has 4"),
    (dict(tiles_chunk=8), "tiles_chunk"),
    (dict(rounds=2), "more only for an all-reduce"),
    (dict(axis_size=32), "2 to 16 ranks"),
    (dict(config_index=99), "config index 99 out of range"),
])
def test_handler_refuses_broken_plans(change, message):
    """ValidateOverlapPlan (csrc/comm/overlap_plan.cc), the one check of a plan in C++, names
    what is wrong."""
    from fo_jax import _cuda_ops

    plan = _broken(_plan(config=fo_jax.OverlapConfig(copy_engine_ring=False)), **change)
    with pytest.raises(Exception, match=message):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), jnp.bfloat16, 8192,
                                     8192, 2048)


def test_handler_refuses_a_copy_engine_program_on_nccl():
    from fo_jax import _cuda_ops

    plan = _broken(_plan(transport="nccl"), rounds=2)
    with pytest.raises(Exception, match="NCCL transport plan with a copy-engine program"):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), jnp.bfloat16, 8192,
                                     8192, 2048)


def test_plan_enums_come_from_the_module():
    from fo_jax import _cuda

    mod = _cuda.module()
    assert [e.name for e in mod.Collective] == ["reduce_scatter", "all_reduce", "all_gather"]
    assert [e.name for e in mod.Transport] == ["nccl", "copy_engine"]
    assert [e.name for e in mod.SumSplit] == ["one", "bands", "rows"]
    assert [e.name for e in mod.GemmDtype] == ["bfloat16", "float16", "float8_e4m3fn"]


@pytest.mark.parametrize("signal", [False, True])
def test_gemm_returns_counters_only_when_it_signals(signal):
    """Without signals the kernel leaves the counters result unwritten, so the entry returns
    None in its place; with them, one counter per group."""
    from fo_jax import _cuda_ops, _plan as plan_mod

    x = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    plan = plan_mod.plan_gemm("test", jnp.dtype(jnp.bfloat16), 1024, 256, 512, 1,
                              fo_jax.OverlapConfig(num_groups=2), 2, 0)
    f = jax.jit(lambda a, b: _cuda_ops.signaling_gemm(a, b, plan, signal=signal))
    d, counters = jax.eval_shape(f, x, w)
    assert (d.shape, d.dtype) == ((1024, 256), jnp.bfloat16)
    if signal:
        assert (counters.shape, counters.dtype) == ((2,), jnp.uint32)
    else:
        assert counters is None
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "@fo_jax_gemm_v2" in text and f"signal = {str(signal).lower()}" in text
