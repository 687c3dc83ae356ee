"""The overlapped all-gather + GEMM (OverlapConfig(all_gather="overlap")) without a GPU: its
plans on both transports (consumer GEMM config, bands of whole clusters, one group per band,
own bands first in the visit order, the SMs left to NCCL, every SM on the copy engine), the
handler's decoding and validation of them (run on the CPU), the paths describe() names (opt-
in, fallbacks with their reasons), the custom call lowered for "cuda" from CPU devices (the
plan attribute and its three results: y, the gathered x, the band flags) for a table of
shapes, dtypes and axis sizes, and the opted-in op on CPU devices (the reference path) equal
to the plain ops, forward and gradients. Needs the compiled CUDA module for all but the last."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh

needs_module = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                  reason="CUDA module not built here (no nvcc at install time)")

OPT_IN = fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False)


def _plan(size=4, rows=2048, n=4096, k=2048, dtype=jnp.bfloat16, config=OPT_IN,
          transport="nccl"):
    from fo_jax import _plan as plan_mod

    return plan_mod.plan_overlap("test", "all_gather", size, jnp.dtype(dtype), rows, n, k, config,
                                 transport)


# (axis size, rows of x per rank, N, K, dtype, bands per rank)
TABLE = [
    (2, 1024, 4096, 2048, jnp.bfloat16, None),
    (4, 2048, 4096, 2048, jnp.bfloat16, None),
    (4, 2048, 8192, 8192, jnp.float16, 2),
    (8, 1024, 1024, 4096, jnp.bfloat16, 4),
    (2, 256, 392, 136, jnp.float16, None),  # odd N and K (multiples of 8)
    (8, 128, 512, 512, jnp.bfloat16, None),
]


def _config(bands, **extra):
    return fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False, num_groups=bands,
                                **extra)


@needs_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("size,rows,n,k,dtype,bands", TABLE)
def test_plan(size, rows, n, k, dtype, bands, transport):
    from fo_jax import _plan as plan_mod

    plan = _plan(size, rows, n, k, dtype, _config(bands), transport)
    per_rank = bands or 1
    c = plan_mod.gemm_configs()[plan.gemm.config_index]
    assert plan.collective == "all_gather" and plan.transport == transport
    assert c["has_consumer"] and c["name"] in ("pp_128x192x64_c2", "pp_128x128x64_c1")
    band_rows = plan.tiles_chunk * plan.gemm.tile_m
    assert band_rows * per_rank == rows and band_rows % (c["tile_m"] * c["cluster_m"]) == 0
    assert plan.gemm.group_begin == tuple(i * plan.tiles_chunk
                                          for i in range(size * per_rank + 1))
    assert plan.gemm.batch == 1 and plan.rounds == 1 and not plan.ring
    if transport == "nccl":  # NCCL's CTAs fit on the SMs the GEMM leaves
        assert plan.gemm.sm_budget < 0 and plan.nccl_max_ctas <= -plan.gemm.sm_budget
    else:  # no SM moves data
        assert plan.gemm.sm_budget == 0
    assert f"bands of {band_rows} rows ({per_rank} per rank)" in plan.describe()


@needs_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("size,rows,n,k,dtype,bands", TABLE)
def test_handler_decodes_the_plan(size, rows, n, k, dtype, bands, transport):
    """The plan attribute as lowered, decoded and validated by the handler's own code (on the
    CPU), for every rank: a consumer GEMM over all gathered rows, one group per band, output
    rows = the gathered rows."""
    from fo_jax import _cuda_ops

    plan = _plan(size, rows, n, k, dtype, _config(bands), transport)
    for rank in range(size):
        got = _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), dtype, rows * size,
                                           n, k, rank=rank)
        assert got["rank"] == rank and got["batch"] == 1
        assert (got["m"], got["n"], got["k"]) == (rows * size, n, k)
        assert got["output_rows"] == rows * size
        assert got["config"] == plan.gemm.config_index and got["num_groups"] == plan.num_groups
        assert got["rotate_tile_rows"] == got["rotate_period_tile_rows"] == 0


@needs_module
@pytest.mark.parametrize("size,per_rank", [(2, 1), (4, 1), (4, 2), (8, 3)])
def test_band_order_own_bands_first_then_arrival_order(size, per_rank):
    """Rank r visits its own bands first (no wait), then step s = 1 .. P-1's: rank r - s's,
    chunk by chunk: the NCCL transport's arrival order (comm/all_gather_nccl.h)."""
    from fo_jax import _cuda

    mod = _cuda.module()
    for rank in range(size):
        order = list(mod.all_gather_band_order(size, per_rank, rank))
        expect = [((rank - s) % size) * per_rank + c for s in range(size) for c in range(per_rank)]
        assert order == expect
        assert sorted(order) == list(range(size * per_rank))


def _broken(plan, **changes):
    import dataclasses

    gemm = {k: v for k, v in changes.items() if k in ("group_begin", "batch", "config_index")}
    rest = {k: v for k, v in changes.items() if k not in gemm}
    return dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, **gemm), **rest)


def _config_index(name):
    from fo_jax import _plan as plan_mod

    return [c["name"] for c in plan_mod.gemm_configs()].index(name)


@needs_module
@pytest.mark.parametrize("change,message", [
    (dict(config_index="coop_128x256x64_c1"), "has no consumer kernel"),
    (dict(group_begin=(0, 8, 16, 24, 32, 48, 64)), "one group per band"),
    (dict(tiles_chunk=3), "bands of a multiple"),
    (dict(rounds=2), "reduce-scatter's copy-engine program"),
    (dict(batch=4), "takes batch 1 here"),
])
def test_handler_refuses_broken_plans(change, message):
    """ValidateOverlapPlan's all-gather part (csrc/comm/overlap_plan.cc) names what is wrong."""
    from fo_jax import _cuda_ops

    if "config_index" in change:
        change = dict(change, config_index=_config_index(change["config_index"]))
    plan = _broken(_plan(4, 2048, 4096, 2048), **change)
    with pytest.raises(Exception, match=message):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), jnp.bfloat16, 8192,
                                     4096, 2048)


@needs_module
def test_handler_refuses_a_copy_engine_all_gather_of_too_many_ranks():
    from fo_jax import _cuda_ops

    plan = _plan(32, 128, 1024, 1024, transport="copy_engine",
                 config=fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False))
    with pytest.raises(Exception, match="copy-engine transport takes 2 to 16 ranks"):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), jnp.bfloat16, 4096,
                                     1024, 1024)


@needs_module
def test_handler_refuses_gathered_rows_not_divisible_by_the_axis():
    from fo_jax import _cuda_ops

    plan = _plan(4, 2048, 4096, 2048)
    with pytest.raises(Exception, match="gathered rows .* not divisible by the axis size 4"):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), jnp.bfloat16, 8190,
                                     4096, 2048)


def _choose(rows, n, k, config, size=4, platform="gpu"):
    from fo_jax import overlap

    return overlap._choose_overlapped(jnp.dtype(jnp.bfloat16), config, rows, n, k, platform,
                                      "all_gather", size)


@needs_module
def test_paths_and_reasons():
    default = _choose(2048, 4096, 4096, None)
    assert default.path == "xla" and "opt-in" in default.reason
    xla = _choose(2048, 4096, 4096, fo_jax.OverlapConfig(all_gather="xla"))
    assert xla.path == "xla" and "opt-in" in xla.reason
    on = _choose(2048, 4096, 4096, OPT_IN)  # one process, no GPUs to lack peer access
    assert on.path == "cuda" and on.transport == "copy_engine" and "opted in" in on.reason
    nccl = _choose(2048, 4096, 4096, _config(None, transport="nccl"))
    assert nccl.path == "cuda" and nccl.transport == "nccl" and "requested" in nccl.reason
    many = _choose(128, 8192, 8192, OPT_IN, size=32)  # more ranks than the copy engine takes
    assert many.transport == "nccl" and "2 to 16 ranks" in many.reason
    odd = _choose(136, 4096, 4096, OPT_IN)  # rows per rank not whole 128-row tiles
    assert odd.path == "xla" and "not a multiple of 128" in odd.reason
    split = _choose(2048, 4096, 4096, _config(3))
    assert split.path == "xla" and "do not split into 3 bands" in split.reason
    small = _choose(128, 512, 512, fo_jax.OverlapConfig(all_gather="overlap"))
    assert small.path == "xla" and "too small to gain" in small.reason
    assert _choose(2048, 4096, 4096, OPT_IN, platform="cpu").path == "reference"


@needs_module
@pytest.mark.parametrize("size", [2, 4])
def test_the_copy_engine_floor_applies_to_the_copy_engine_all_gather(size):
    """4096x8192x2048 gathered (an estimated GEMM of 176 us, between the copy engine's 100 us
    floor and NCCL's 250 us) overlaps on the copy engine, where it measured 1.20x (TP=2) and
    1.23x (TP=4) of XLA's all-gather + dot, and stays XLA's on NCCL; 2048 gathered rows (88 us)
    stay XLA's on both."""
    auto = fo_jax.OverlapConfig(all_gather="overlap")
    nccl = fo_jax.OverlapConfig(all_gather="overlap", transport="nccl")
    ce = _choose(4096 // size, 8192, 2048, auto, size=size)
    assert ce.path == "cuda" and ce.transport == "copy_engine", ce.reason
    on_nccl = _choose(4096 // size, 8192, 2048, nccl, size=size)
    assert on_nccl.path == "xla" and "< 250 us" in on_nccl.reason, on_nccl.reason
    for config in (auto, nccl):
        small = _choose(2048 // size, 8192, 2048, config, size=size)
        assert small.path == "xla" and "too small to gain" in small.reason, small.reason


@needs_module
def test_explicit_requests_that_cannot_run_raise():
    with pytest.raises(ValueError, match="transport='copy_engine'.*2 to 16 ranks"):
        _choose(128, 8192, 8192, fo_jax.OverlapConfig(all_gather="overlap",
                                                      transport="copy_engine"), size=32)
    with pytest.raises(ValueError, match="has no consumer kernel"):
        _choose(2048, 4096, 4096, fo_jax.OverlapConfig(all_gather="overlap",
                                                       gemm_config="coop_128x256x64_c1"))
    with pytest.raises(ValueError, match="all_gather must be one of"):
        fo_jax.OverlapConfig(all_gather="yes")


def _lowered(size, rows, n, k, dtype, config, mesh_shape=None):
    mesh_shape = mesh_shape or (size,)
    names = ("tp",) if len(mesh_shape) == 1 else ("data", "tp")
    mesh = cpu_mesh(mesh_shape, names)
    data = None if len(mesh_shape) == 1 else "data"
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.all_gather_matmul(x, w, axis_name="tp", config=config),
        mesh=mesh, in_specs=(P((data, "tp") if data else "tp", None), P(None, "tp")),
        out_specs=(P(data, "tp"), P((data, "tp") if data else "tp", None))))
    dp = mesh_shape[0] if data else 1
    x = jnp.ones((rows * size * dp, k), dtype)
    w = jnp.ones((k, n * size), dtype)
    y, g = f(x, w)  # CPU: the reference path
    np.testing.assert_array_equal(np.asarray(y[:8, :8], np.float32), float(k))
    return f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()


def _custom_calls(text):
    return [line for line in text.splitlines() if "fo_jax_overlapped_matmul_v2" in line
            and "custom_call" in line]


@needs_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("size,rows,n,k,dtype,bands", TABLE)
def test_lowering_for_cuda(size, rows, n, k, dtype, bands, transport):
    """The custom call: collective all_gather (2), the transport, the plan's band table, and
    three results: y [P * rows, n], the gathered x [P * rows, k], one flag word per band."""
    config = _config(bands, transport=transport)
    plan = _plan(size, rows, n, k, dtype, config, transport)
    calls = _custom_calls(_lowered(size, rows, n, k, dtype, config))
    assert len(calls) == 1
    call = calls[0]
    assert "collective = 2 : i32" in call and f"axis_size = {size} : i32" in call
    code = 0 if transport == "nccl" else 1
    assert f"transport = {code} : i32" in call
    assert f"tiles_chunk = {plan.tiles_chunk} : i32" in call
    ty = "bf16" if dtype == jnp.bfloat16 else "f16"
    m = rows * size
    results = re.search(r"-> \((.*)\)\s*$", call).group(1)
    assert results == (f"tensor<{m}x{n}x{ty}>, tensor<{m}x{k}x{ty}>, "
                       f"tensor<{plan.num_groups}xui32>")


@needs_module
def test_lowering_with_a_data_axis():
    calls = _custom_calls(_lowered(2, 1024, 2048, 2048, jnp.bfloat16, OPT_IN, mesh_shape=(2, 2)))
    assert len(calls) == 1 and "device_rank = dense<[0, 1, 0, 1]>" in calls[0]


@needs_module
def test_default_lowers_to_xla_all_gather():
    text = _lowered(4, 2048, 4096, 2048, jnp.bfloat16, None)
    assert not _custom_calls(text) and "all_gather" in text


@needs_module
def test_reduce_scatter_backward_uses_the_opted_in_all_gather():
    """The reduce-scatter's dx = AG(dy) @ w^T runs through the overlapped all-gather when the
    forward's config opts in (and through XLA's all_gather otherwise)."""
    mesh = cpu_mesh((4,), ("tp",))

    def grads(config):
        def loss(x, w):
            y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter",
                                         config=config)
            return jax.lax.psum(jnp.sum(y.astype(jnp.float32)), "tp")

        f = jax.jit(jax.shard_map(jax.value_and_grad(loss, argnums=(0, 1)), mesh=mesh,
                                  in_specs=(P(None, "tp"), P("tp", None)),
                                  out_specs=(P(), (P(None, "tp"), P("tp", None)))))
        # Large enough that neither GEMM falls back for its size (only traced, never run).
        x = jax.ShapeDtypeStruct((8192, 32768), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((32768, 8192), jnp.bfloat16)
        return f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()

    def collectives(text):
        return sorted(re.findall(r"collective = (\d) : i32", text))

    on = fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False)
    assert collectives(grads(on)) == ["0", "2"]  # forward RS, backward AG
    assert collectives(grads(fo_jax.OverlapConfig(allow_fallback=False))) == ["0"]


@pytest.mark.parametrize("tp", [2, 4])
def test_opted_in_op_on_cpu_equals_the_plain_ops(tp):
    """On CPU devices the opted-in op takes the reference path: forward, gathered input and
    gradients equal the plain ops'."""
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((256 * tp, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 32 * tp)), jnp.float32)
    mesh = cpu_mesh((tp,), ("tp",))

    def loss(op):
        def f(x, w):
            y, g = op(x, w)
            return jax.lax.psum(jnp.sum(jnp.sin(y)) + jnp.sum(g * g), "tp")
        return f

    def fo(x, w):
        return fo_jax.all_gather_matmul(x, w, axis_name="tp", config=OPT_IN)

    def plain(x, w):
        g = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
        return jnp.dot(g, w, precision=jax.lax.Precision.HIGHEST), g

    def run(op):
        return jax.jit(jax.shard_map(jax.value_and_grad(loss(op), argnums=(0, 1)), mesh=mesh,
                                     in_specs=(P("tp", None), P(None, "tp")),
                                     out_specs=(P(), (P("tp", None), P(None, "tp")))))(x, w)

    (v1, (dx1, dw1)), (v2, (dx2, dw2)) = run(fo), run(plain)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    np.testing.assert_allclose(dx1, dx2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw1, dw2, rtol=1e-4, atol=1e-4)


def test_bench_rows_opt_in():
    """The benchmarks' fo_jax all_gather rows run the overlapped all-gather; a configuration
    with an SM budget (fo_jax.sequential: every SM, none left to NCCL) keeps XLA's path."""
    from fo_jax.bench import core

    assert core.gather_config(None).all_gather == "overlap"
    assert core.gather_config(fo_jax.OverlapConfig(transport="nccl")).all_gather == "overlap"
    assert core.gather_config(fo_jax.OverlapConfig(num_groups=1, sm_budget=1024)).all_gather \
        is None


@pytest.mark.parametrize("w_batched", [False, True])
def test_vmap_of_the_opted_in_op(w_batched):
    """vmap folds a batched x into the GEMM's rows (and maps over a batched w): on CPU devices
    equal to the plain ops per element; with the module, it lowers for cuda to the overlapped
    call."""
    tp = 4
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((3, 128 * tp, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 64, 16 * tp) if w_batched else (64, 16 * tp)),
                    jnp.float32)
    w_axis = 0 if w_batched else None
    w_spec = P(None, None, "tp") if w_batched else P(None, "tp")

    def fo(x, w):
        return jax.vmap(lambda a, b: fo_jax.all_gather_matmul(a, b, axis_name="tp",
                                                              config=OPT_IN),
                        in_axes=(0, w_axis))(x, w)

    def plain(x, w):
        def one(a, b):
            g = jax.lax.all_gather(a, "tp", axis=0, tiled=True)
            return jnp.dot(g, b, precision=jax.lax.Precision.HIGHEST), g
        return jax.vmap(one, in_axes=(0, w_axis))(x, w)

    def run(op):
        return jax.jit(jax.shard_map(op, mesh=mesh, in_specs=(P(None, "tp", None), w_spec),
                                     out_specs=(P(None, None, "tp"), P(None, "tp", None))))

    (y1, g1), (y2, g2) = run(fo)(x, w), run(plain)(x, w)
    np.testing.assert_allclose(y1, y2, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(g1, g2)
    if fo_jax.cuda_module_available():
        xb = jax.ShapeDtypeStruct((3, 1024 * tp, 1024), jnp.bfloat16)
        wb = jax.ShapeDtypeStruct((3, 1024, 1024 * tp) if w_batched else (1024, 1024 * tp),
                                  jnp.bfloat16)
        text = run(fo).trace(xb, wb).lower(lowering_platforms=("cuda",)).as_text()
        assert _custom_calls(text)
