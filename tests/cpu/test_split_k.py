"""Split K (OverlapConfig.k_splits) on CPU: the field's checks, fo_jax.matmul's plan (a
cooperative configuration named by gemm_config; at most one split per k-tile), the overlapped
calls' refusal, the sizes of the split-K call's results (Python's against the kernel library's),
and the lowering for CUDA devices: the split-K target with its k_splits attribute, in the
forward and the backward GEMMs, the reference on CPU. Needs the compiled CUDA module."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="CUDA module not built here (no nvcc at install time)")

BF16 = jnp.dtype(jnp.bfloat16)


@pytest.mark.parametrize("value", [0, -1, 17, 2.0, True])
def test_config_refuses_bad_k_splits(value):
    with pytest.raises(ValueError, match="k_splits"):
        fo_jax.OverlapConfig(k_splits=value)


def test_matmul_plan_takes_k_splits_on_a_cooperative_config():
    from fo_jax import _plan

    cfg = fo_jax.OverlapConfig(gemm_config="coop_128x128x64_c1", k_splits=4)
    plan = _plan.plan_matmul("fo_jax.matmul", BF16, 512, 1280, 8192, cfg)
    assert plan.k_splits == 4 and plan.config_name == "coop_128x128x64_c1"
    # One split per k-tile at most: K = 128 has two k-tiles of 64.
    assert _plan.plan_matmul("fo_jax.matmul", BF16, 512, 1280, 128, cfg).k_splits == 2
    one = dataclasses.replace(cfg, k_splits=1)
    assert _plan.plan_matmul("fo_jax.matmul", BF16, 512, 1280, 8192, one).k_splits == 1


def test_matmul_plan_refuses_k_splits_without_a_cooperative_config():
    from fo_jax import _plan

    with pytest.raises(ValueError, match="needs gemm_config.*coop_128x128x64_c1"):
        _plan.plan_matmul("fo_jax.matmul", BF16, 512, 1280, 8192,
                          fo_jax.OverlapConfig(k_splits=2))
    with pytest.raises(ValueError, match="ping-pong configuration, which cannot split K"):
        _plan.plan_matmul("fo_jax.matmul", BF16, 512, 1280, 8192,
                          fo_jax.OverlapConfig(gemm_config="pp_128x128x64_c1", k_splits=2))


def test_split_k_sizes_match_the_kernel_library():
    """The flag words and partial floats Python sizes the results by are the kernel library's
    bound (SplitKFlagWords / SplitKPartialFloats: the last partial wave's tiles), for every
    cooperative configuration and a table of shapes, SM counts and budgets (fewer tiles than
    SMs, more, clusters with an idle half, batches, partial tiles)."""
    from fo_jax import _cuda, _gemm_choice, _plan, config

    mod = _cuda.module()
    assert int(mod.max_k_splits()) == config.MAX_K_SPLITS
    coop = [c for c in _plan.gemm_configs() if not c["pingpong"]]
    assert {c["name"] for c in coop} >= {"coop_128x128x64_c1", "coop_128x128x64_c2"}
    for c in coop:
        for m, n, k, batch, splits in ((8, 264, 1032, 1, 2), (200, 392, 2048, 3, 5),
                                       (1000, 1280, 4096, 1, 16), (384, 256, 512, 2, 1),
                                       (4096, 4096, 4096, 1, 3)):
            for sms, budget in ((132, 0), (132, 40), (114, -7), (1, 0)):
                tile_rows = -(-m // c["tile_m"])
                plan = _plan.GemmPlan(c["index"], c["name"], c["tile_m"], c["tile_n"],
                                      (0, tile_rows), budget, batch, c["cluster_m"], splits)
                got = _plan.split_k_sizes(plan, m, n, sms)
                resolved = _gemm_choice.resolve_sms(budget, sms)
                want = tuple(mod.split_k_sizes(c["index"], m, n, k, batch, splits, resolved, sms))
                assert got == want, (c["name"], m, n, k, batch, splits, sms, budget)


def test_matmul_lowers_to_the_split_k_target():
    x = jnp.ones((256, 4096), jnp.bfloat16)
    w = jnp.ones((4096, 1280), jnp.bfloat16)
    cfg = fo_jax.OverlapConfig(gemm_config="coop_128x128x64_c1", k_splits=8)

    def loss(x, w):
        return jnp.sum(fo_jax.matmul(x, w, config=cfg).astype(jnp.float32))

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    value, (dx, dw) = f(x, w)  # CPU: the reference
    assert float(value) == 256 * 1280 * 4096
    np.testing.assert_array_equal(np.asarray(dx, np.float32), 1280.0)
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    # The forward splits; the backward GEMMs choose their own configuration (as gemm_config).
    assert text.count("@fo_jax_gemm_split_k_v1") == 1, text.count("fo_jax_gemm")
    assert "k_splits = 8 : i32" in text
    # 2 x 10 tiles of 128x128, under one wave (132 SMs where no GPU is visible): every tile in
    # the split tail, 7 partial tiles each: counters [1 + 20], partials.
    assert "tensor<21xui32>" in text and f"tensor<{20 * 7 * 128 * 128}xf32>" in text


def test_matmul_without_k_splits_keeps_the_unsplit_target():
    x = jnp.ones((256, 4096), jnp.bfloat16)
    w = jnp.ones((4096, 1280), jnp.bfloat16)
    cfg = fo_jax.OverlapConfig(gemm_config="coop_128x128x64_c1")
    f = jax.jit(lambda x, w: fo_jax.matmul(x, w, config=cfg))
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "@fo_jax_gemm_v2" in text and "split_k" not in text


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "all_gather"])
def test_overlapped_calls_refuse_k_splits_at_trace_time(collective):
    mesh = cpu_mesh((2,), ("tp",))
    cfg = fo_jax.OverlapConfig(gemm_config="coop_128x128x64_c1", k_splits=2)
    spec_x = P("tp", None) if collective == "all_gather" else P(None, "tp")
    spec_w = P(None, None) if collective == "all_gather" else P("tp", None)
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                              config=cfg),
        mesh=mesh, in_specs=(spec_x, spec_w), out_specs=P(None, None), check_vma=False))
    x = jnp.ones((1024, 512), jnp.bfloat16)
    w = jnp.ones((512, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="k_splits applies to fo_jax.matmul only"):
        f.trace(x, w)


def test_the_split_choice_serves_16_bit_operands_only():
    """fo_jax.matmul's own choice splits K where the model predicts it (few tiles, long K) in
    bfloat16 and float16, on a cooperative configuration, its split units in one wave; fp8
    operands keep their own rows and never split unasked."""
    from fo_jax import _gemm_choice, _plan

    for dtype in (jnp.bfloat16, jnp.float16):
        plan = _plan.plan_matmul("fo_jax.matmul", jnp.dtype(dtype), 512, 1280, 8192, None)
        assert plan.k_splits > 1 and plan.config_name.startswith("coop_"), plan
        c = next(c for c in _plan.gemm_configs() if c["name"] == plan.config_name)
        units, slots, _ = _gemm_choice.waves(c, 512, 1280, 1, _gemm_choice.DEFAULT_SMS)
        assert (units % slots) * plan.k_splits <= slots
        # Many tiles: no split.
        assert _plan.plan_matmul("fo_jax.matmul", jnp.dtype(dtype), 8192, 8192, 2048,
                                 None).k_splits == 1
    fp8 = jnp.dtype(jnp.float8_e4m3fn)
    for fast in (False, True):
        plan = _plan.plan_matmul("fo_jax.matmul", fp8, 2048, 512, 16384,
                                 fo_jax.OverlapConfig(fp8_fast_accumulation=fast))
        assert plan.k_splits == 1 and plan.config_name.startswith("fp8"), plan
