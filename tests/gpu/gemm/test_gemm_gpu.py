"""The signaling GEMM on one GPU (fo_jax.matmul and the raw kernel entry) against a float64
reference: shapes, every compiled configuration, poisoned outputs, counters per group, the
reduce-scatter row remap and a reduced SM budget."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from conftest import gpu_devices_or_skip
from numerics import (assert_close, expected_group_counts, group_major_layout,
                      random_operands)

pytestmark = pytest.mark.gpu
KERNEL = fo_jax.OverlapConfig(allow_fallback=False)

SHAPES = [  # (M, N, K): square, tall, wide, odd, tiny, partial tiles everywhere
    (1024, 1024, 1024),
    (4096, 256, 512),
    (256, 4096, 512),
    (1000, 1032, 520),
    (8, 8, 8),
    (136, 264, 72),
]


def _setup():
    (dev,) = gpu_devices_or_skip(1)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    from fo_jax import _cuda_ops, _plan

    return dev, _cuda_ops, _plan


def _operands(dev, seed, m, k, n, dtype, batch=1):
    rng = np.random.default_rng(seed)
    x, w, x64, w64 = random_operands(rng, batch * m, k, n, dtype)
    return jax.device_put(x, dev), jax.device_put(w, dev), x64, w64






@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_matches_float64(shape, dtype):
    dev, _, _ = _setup()
    m, n, k = shape
    x, w, x64, w64 = _operands(dev, hash(shape) % 1000, m, k, n, dtype)
    # allow_fallback=False: fo_jax's kernel even where the measured table hands the shape to
    # XLA's dot (256x4096x512, 1000x1032x520).
    f = jax.jit(lambda x, w: fo_jax.matmul(x, w, config=KERNEL))
    assert "fo_jax_gemm_v2" in f.lower(x, w).as_text()
    out = f(x, w)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (m, n)
    assert_close(out, x64 @ w64, dtype)


def _run_raw(dev, _cuda_ops, plan, x, w, batch, poison=True, signal=True):
    d0 = jax.device_put(jnp.full((x.shape[0], w.shape[1]), jnp.nan, x.dtype), dev)
    f = jax.jit(lambda a, b, d: _cuda_ops.signaling_gemm(a, b, plan, batch, signal, d),
                donate_argnums=2)
    d, counters = f(x, w, d0)
    return np.asarray(d.astype(jnp.float32), np.float64), np.asarray(counters)


def _configs(_plan):
    return [c["name"] for c in _plan.gemm_configs_for(jnp.bfloat16)]  # the 16-bit rows


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_every_config_poisoned_output_and_counters(dtype):
    dev, _cuda_ops, _plan = _setup()
    m, n, k = 1000, 1032, 520
    x, w, x64, w64 = _operands(dev, 5, m, k, n, dtype)
    ref = x64 @ w64
    for name in _configs(_plan):
        cfg = fo_jax.OverlapConfig(gemm_config=name, num_groups=3)
        plan = _plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, 1, cfg, 1, 0)
        d, counters = _run_raw(dev, _cuda_ops, plan, x, w, 1)
        assert np.isfinite(d).all(), f"{name}: unwritten (poisoned) output elements"
        assert_close(d, ref, dtype)
        assert counters.tolist() == expected_group_counts(plan, 1, n), name


@pytest.mark.parametrize("batch", [2, 4])
@pytest.mark.parametrize("groups", [None, 1, 3])
@pytest.mark.parametrize("m", [512, 200, 1000])
def test_remapped_reduce_scatter_layout(batch, groups, m):
    """batch > 1: each group's rows land group-major [batch 0 band | batch 1 band | ...], partial
    tiles never spill into the neighbouring band, counters count every tile."""
    dev, _cuda_ops, _plan = _setup()
    n, k, dtype = 264, 136, jnp.bfloat16
    x, w, x64, w64 = _operands(dev, m + batch, m, k, n, dtype, batch=batch)
    for name in _configs(_plan):
        cfg = fo_jax.OverlapConfig(gemm_config=name, num_groups=groups or 64)
        plan = _plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, batch, cfg, 1, 0)
        if groups is None:  # uneven explicit partition, last group smallest
            rows = -(-m // plan.tile_m)
            if rows < 2:
                continue
            cfg = fo_jax.OverlapConfig(gemm_config=name, group_tile_rows=(rows - 1, 1))
            plan = _plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, batch, cfg, 1, 0)
        d, counters = _run_raw(dev, _cuda_ops, plan, x, w, batch)
        assert np.isfinite(d).all(), f"{name}: unwritten output rows"
        assert_close(d, group_major_layout(x64 @ w64, plan, batch, m), dtype)
        assert counters.tolist() == expected_group_counts(plan, batch, n), name


def test_reduced_sm_budget_gives_identical_result():
    dev, _cuda_ops, _plan = _setup()
    m, n, k, dtype = 2048, 2048, 1024, jnp.bfloat16
    x, w, x64, w64 = _operands(dev, 9, m, k, n, dtype)
    outs = []
    for budget in (0, 8, -16):
        cfg = fo_jax.OverlapConfig(num_groups=4, sm_budget=budget if budget > 0 else None)
        plan = _plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, 1, cfg, 1, budget)
        d, counters = _run_raw(dev, _cuda_ops, plan, x, w, 1)
        assert counters.tolist() == expected_group_counts(plan, 1, n)
        outs.append(d)
    assert_close(outs[0], x64 @ w64, dtype)
    # Each tile is computed the same way whichever CTA takes it: bitwise equal.
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_bad_group_table_is_an_error_not_a_crash():
    dev, _cuda_ops, _plan = _setup()
    x, w, _, _ = _operands(dev, 1, 256, 64, 64, jnp.bfloat16)
    plan = _plan.plan_gemm("test", jnp.dtype(jnp.bfloat16), 256, 64, 64, 1, None, 1, 0)
    bad = plan.__class__(plan.config_index, plan.config_name, plan.tile_m, plan.tile_n,
                         (0, 99), plan.sm_budget)
    with pytest.raises(Exception, match="group table"):
        jax.block_until_ready(jax.jit(lambda a, b: _cuda_ops.signaling_gemm(a, b, bad))(x, w))
