"""Every compiled GEMM configuration on small and odd M against a float64 reference, as the
overlap's producer runs it (groups, counters, the reduce-scatter remap, a reduced SM budget),
with outputs poisoned before each run; and fo_jax.matmul's own choice on small-M sweep shapes.
The 64-row and 2x1-cluster configurations meet here what the design shapes never give them:
fewer rows than one tile, an odd count of tile-rows (a cluster with an idle half), one
tile-row per group."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from conftest import gpu_devices_or_skip
from numerics import (assert_close, device_operands, expected_group_counts,
                      group_major_layout, poisoned_gemm_run)

pytestmark = pytest.mark.gpu

SMALL_SHAPES = [  # (M, N, K)
    (8, 264, 72),       # fewer rows than any tile
    (72, 1032, 520),    # one 64-row tile and a sliver; partial column tiles
    (200, 1280, 1024),  # odd count of 64-row tiles (4): a 2x1 cluster pair ends half idle
    (576, 1536, 2048),  # 9 tile-rows of 64: odd again, 8 columns of 192
    (1000, 264, 136),   # partial everything
]


def _setup():
    (dev,) = gpu_devices_or_skip(1)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    from fo_jax import _cuda_ops, _plan

    return dev, _cuda_ops, _plan






def _group_variants(_plan, name, dtype, m, n, k, batch):
    """Plans of config `name`: one group, three, and one per tile-row (at most 64)."""
    plans = []
    for groups in (1, 3, 64):
        cfg = fo_jax.OverlapConfig(gemm_config=name, num_groups=groups)
        plans.append(_plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, batch, cfg, 1, 0))
    return plans


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", SMALL_SHAPES)
def test_every_config_on_small_and_odd_m(shape, dtype):
    dev, _cuda_ops, _plan = _setup()
    m, n, k = shape
    x, w, x64, w64 = device_operands(dev, m + n + k, m, k, n, dtype)
    ref = x64 @ w64
    for c in _plan.gemm_configs_for(dtype):
        for plan in _group_variants(_plan, c["name"], dtype, m, n, k, 1):
            d, counters = poisoned_gemm_run(dev, plan, x, w)
            what = f"{c['name']} groups {plan.group_begin}"
            assert np.isfinite(d).all(), f"{what}: unwritten (poisoned) output elements"
            assert_close(d, ref, dtype)
            assert counters.tolist() == expected_group_counts(plan, 1, n), what


@pytest.mark.parametrize("batch", [2, 4])
@pytest.mark.parametrize("m", [8, 72, 200])
def test_every_config_remap_with_bands_smaller_than_a_tile(batch, m):
    """The reduce-scatter layout when each rank's band is shorter than one or two tiles: rows
    of a partial tile never spill into the next band, every tile is counted."""
    dev, _cuda_ops, _plan = _setup()
    n, k, dtype = 392, 200, jnp.bfloat16
    x, w, x64, w64 = device_operands(dev, m * batch, batch * m, k, n, dtype)
    ref = x64 @ w64
    for c in _plan.gemm_configs_for(dtype):
        for plan in _group_variants(_plan, c["name"], dtype, m, n, k, batch):
            d, counters = poisoned_gemm_run(dev, plan, x, w, batch)
            what = f"{c['name']} groups {plan.group_begin}"
            assert np.isfinite(d).all(), f"{what}: unwritten output rows"
            assert_close(d, group_major_layout(ref, plan, batch, m), dtype)
            assert counters.tolist() == expected_group_counts(plan, batch, n), what


def test_odd_sm_budgets_give_identical_results():
    """A 2x1-cluster config on an odd SM budget runs floor(budget / 2) clusters; every budget
    computes every tile the same way (bitwise equal), the counters complete."""
    dev, _cuda_ops, _plan = _setup()
    m, n, k, dtype = 1088, 1280, 1024, jnp.bfloat16  # 17 tile-rows of 64
    x, w, x64, w64 = device_operands(dev, 11, m, k, n, dtype)
    ref = x64 @ w64
    for c in _plan.gemm_configs_for(dtype):
        outs = []
        for budget in (0, 3, 7, -5):
            cfg = fo_jax.OverlapConfig(gemm_config=c["name"], num_groups=4)
            plan = _plan.plan_gemm("test", jnp.dtype(dtype), m, n, k, 1, cfg, 1, budget)
            d, counters = poisoned_gemm_run(dev, plan, x, w)
            assert counters.tolist() == expected_group_counts(plan, 1, n), (c["name"], budget)
            outs.append(d)
        assert_close(outs[0], ref, dtype)
        for d in outs[1:]:
            np.testing.assert_array_equal(outs[0], d, err_msg=c["name"])


@pytest.mark.parametrize("shape", [(512, 1280, 8192), (512, 4096, 512), (1024, 5504, 4096),
                                   (2048, 1536, 4096)])
def test_default_choice_on_small_m_sweep_shapes(shape):
    """fo_jax.matmul's own tile choice (the fitted table) on sweep shapes of the small-M regime,
    where the new configurations are chosen; allow_fallback=False keeps fo_jax's kernel where the
    table hands the shape to XLA's dot."""
    dev, _, _plan = _setup()
    m, n, k = shape
    dtype = jnp.bfloat16
    x, w, x64, w64 = device_operands(dev, m ^ n ^ k, m, k, n, dtype)
    f = jax.jit(lambda x, w: fo_jax.matmul(x, w, config=fo_jax.OverlapConfig(
        allow_fallback=False)))
    assert "@fo_jax_gemm" in f.lower(x, w).as_text()  # fo_jax's GEMM, not XLA's dot
    out = f(x, w)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (m, n)
    assert_close(out, x64 @ w64, dtype)
