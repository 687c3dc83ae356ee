"""Split K (OverlapConfig.k_splits) on one GPU: every cooperative configuration against a float64
reference with outputs poisoned before each run, K not a multiple of the split count or of the
tile, fewer tiles than SMs (every tile split) and more (whole waves, then the split tail), more
units than SMs, groups and counters, the reduce-scatter remap, odd SM budgets (which move the
tail), bitwise-repeatable results, the flag words left zero, and fo_jax.matmul with k_splits
under jit, grad and vmap."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from conftest import gpu_devices_or_skip
from numerics import (assert_close, device_operands, expected_group_counts,
                      group_major_layout, poisoned_gemm_run)

pytestmark = pytest.mark.gpu

SHAPES = [  # (M, N, K)
    (8, 264, 1032),     # fewer rows than a tile, K a partial k-tile past 16 whole ones
    (200, 1280, 4096),  # few tiles, long K: split K's case
    (1000, 264, 520),   # partial tiles everywhere, 9 k-tiles
    (576, 1536, 8192),
    (2048, 1280, 1024),  # 160 tiles of 128x128: a whole wave, then 28 split tiles
    (4096, 2048, 520),   # several whole waves and a tail, 9 k-tiles
]


def _setup():
    (dev,) = gpu_devices_or_skip(1)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    from fo_jax import _cuda_ops, _plan

    return dev, _cuda_ops, _plan


def _cooperative(_plan, dtype):
    return [c for c in _plan.gemm_configs_for(dtype) if not c["pingpong"]]


def _split_plan(_plan, dtype, name, m, n, k, splits, batch=1, groups=1, sm_budget=0):
    cfg = fo_jax.OverlapConfig(gemm_config=name, num_groups=groups)
    plan = _plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, batch, cfg, 1, sm_budget)
    return dataclasses.replace(plan, k_splits=splits)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_cooperative_config_splits_k(shape, dtype):
    dev, _cuda_ops, _plan = _setup()
    m, n, k = shape
    x, w, x64, w64 = device_operands(dev, m + n + k, m, k, n, dtype)
    ref = x64 @ w64
    for c in _cooperative(_plan, dtype):
        k_tiles = -(-k // c["tile_k"])
        for splits in sorted({2, 3, 7, min(16, k_tiles)}):
            if splits > k_tiles:
                continue
            for groups in (1, 3):
                plan = _split_plan(_plan, dtype, c["name"], m, n, k, splits, groups=groups)
                d, counters = poisoned_gemm_run(dev, plan, x, w)
                what = f"{c['name']} k_splits {splits} groups {plan.group_begin}"
                assert np.isfinite(d).all(), f"{what}: unwritten (poisoned) output elements"
                assert_close(d, ref, dtype)
                assert counters.tolist() == expected_group_counts(plan, 1, n), what


@pytest.mark.parametrize("batch", [2, 4])
@pytest.mark.parametrize("m", [512, 200])
def test_split_k_with_the_reduce_scatter_remap(batch, m):
    """Batched launch (group-major layout) with split K: every tile of every band is summed
    once and counted once. (m = 200 is not whole tiles: the launcher runs the last group as a
    launch of its own, both unsplit.)"""
    dev, _cuda_ops, _plan = _setup()
    n, k, dtype = 392, 2048, jnp.bfloat16
    x, w, x64, w64 = device_operands(dev, batch, batch * m, k, n, dtype)
    ref = x64 @ w64
    for c in _cooperative(_plan, dtype):
        plan = _split_plan(_plan, dtype, c["name"], m, n, k, 5, batch=batch, groups=3)
        d, counters = poisoned_gemm_run(dev, plan, x, w, batch)
        assert np.isfinite(d).all(), f"{c['name']}: unwritten output rows"
        assert_close(d, group_major_layout(ref, plan, batch, m), dtype)
        assert counters.tolist() == expected_group_counts(plan, batch, n), c["name"]


def test_split_k_is_bitwise_repeatable_on_any_sm_budget():
    """The final split adds the others' partial sums in split order, so timing changes no bit of
    the result; the SM budget decides which tiles form the split tail (budget 3: 90 tiles in
    whole waves, none split), each budget's result repeats bitwise. And the kernel leaves its
    flag words zero."""
    dev, _cuda_ops, _plan = _setup()
    m, n, k, dtype = 1088, 1280, 4096, jnp.bfloat16
    x, w, x64, w64 = device_operands(dev, 11, m, k, n, dtype)
    for c in _cooperative(_plan, dtype):
        for budget in (0, 3, 7, -5):
            plan = _split_plan(_plan, dtype, c["name"], m, n, k, 4, groups=4, sm_budget=budget)
            first, counters = poisoned_gemm_run(dev, plan, x, w)
            assert counters.tolist() == expected_group_counts(plan, 1, n), (c["name"], budget)
            assert_close(first, x64 @ w64, dtype)
            for _ in range(2):
                again, _ = poisoned_gemm_run(dev, plan, x, w)
                np.testing.assert_array_equal(first, again, err_msg=f"{c['name']} {budget}")
    # The whole counters result (group counters, then one flag word per tile of the split tail).
    plan = _split_plan(_plan, dtype, "coop_128x128x64_c1", m, n, k, 4)
    flags, partials = _plan.split_k_sizes(plan, m, n)
    results = _cuda_ops._gemm_results((x, w), m, n, x.dtype, plan)
    out = jax.jit(lambda a, b: _cuda_ops._ffi_call(
        _cuda_ops.GEMM_SPLIT_K_TARGET, (a, b), results,
        _cuda_ops._gemm_attrs(plan, True)))(x, w)
    assert out[1].shape == (1 + flags,) and out[2].shape == (partials,)
    words = np.asarray(out[1])
    assert words[0] == expected_group_counts(plan, 1, n)[0]
    assert not words[1:].any(), "split flags left set"


def test_matmul_with_k_splits_under_jit_and_grad():
    """fo_jax.matmul with OverlapConfig(k_splits=...) under jit, grad and vmap: the split-K call
    in the forward (the backward GEMMs choose their own), each result against float64."""
    dev, _, _ = _setup()
    rng = np.random.default_rng(3)
    m, k, n, dtype = 256, 4096, 1280, jnp.bfloat16
    x, w, x64, w64 = device_operands(dev, 3, m, k, n, dtype)
    g64 = rng.standard_normal((m, n))
    g = jax.device_put(jnp.asarray(g64, dtype), dev)
    g64 = np.asarray(g, np.float64)
    config = fo_jax.OverlapConfig(gemm_config="coop_128x128x64_c1", k_splits=8)

    def loss(x, w):
        return jnp.sum((fo_jax.matmul(x, w, config=config) * g).astype(jnp.float32))

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    text = f.lower(x, w).as_text()
    assert text.count("@fo_jax_gemm_split_k_v1") == 1, text.count("fo_jax_gemm")
    value, (dx, dw) = f(x, w)
    assert_close(float(value), float(np.sum((x64 @ w64) * g64)), dtype, factor=4)
    assert_close(dx, g64 @ w64.T, dtype)
    assert_close(dw, x64.T @ g64, dtype)
    y = jax.jit(lambda x, w: fo_jax.matmul(x, w, config=config))(x, w)
    assert_close(y, x64 @ w64, dtype)
    # vmap over x: the batch joins the GEMM's rows.
    xb = jnp.stack([x, x[::-1]])
    yb = jax.jit(jax.vmap(lambda x: fo_jax.matmul(x, w, config=config)))(xb)
    assert_close(yb[1], (x64 @ w64)[::-1], dtype)
