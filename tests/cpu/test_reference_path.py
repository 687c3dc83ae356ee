"""overlapped_matmul on the reference path (CPU devices) against a float64 NumPy reference:
both collectives, several shapes, a 1-D and a 2-D mesh, jit, grad, and path reporting."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh
from numerics import assert_close, random_operands

@pytest.fixture(autouse=True)
def _on_cpu():
    """Everything here, references included, runs on CPU devices: on a GPU machine the default
    backend's float32 matmuls would use TF32 and miss float32 tolerances."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


SHAPES = [  # (M, K_total, N): M divisible by the TP sizes used, K_total by the TP size
    (64, 128, 96),
    (256, 64, 40),
    (40, 512, 8),
    (128, 256, 256),
]


def tp_call(mesh, collective, axis="tp", data_axis=None, config=None):
    row = (data_axis, axis) if (data_axis and collective == "reduce_scatter") else data_axis
    if collective == "reduce_scatter":
        out_spec = P(row if data_axis else axis, None)
    else:
        out_spec = P(data_axis, None)

    def body(x, w):
        return fo_jax.overlapped_matmul(x, w, axis_name=axis, collective=collective, config=config)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(data_axis, axis), P(axis, None)),
                         out_specs=out_spec)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_1d_mesh_matches_float64(collective, shape, dtype, tp):
    m, k, n = shape
    rng = np.random.default_rng(hash((collective, shape, tp)) % 2**32)
    x, w, x64, w64 = random_operands(rng, m, k, n, dtype)
    out = jax.jit(tp_call(cpu_mesh((tp,), ("tp",)), collective))(x, w)
    assert out.dtype == jnp.dtype(dtype)
    assert out.shape == (m, n)  # global view: RS rows are the tiled scatter of the same product
    assert_close(out, x64 @ w64, dtype)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_2d_mesh_collective_over_one_axis(collective):
    mesh = cpu_mesh((2, 4), ("data", "tp"))
    m, k, n = 128, 256, 64  # global; each data shard has 64 rows, each tp shard 64 columns of K
    rng = np.random.default_rng(7)
    x, w, x64, w64 = random_operands(rng, m, k, n, jnp.float32)
    out = jax.jit(tp_call(mesh, collective, data_axis="data"))(x, w)
    assert out.shape == (m, n)
    assert_close(out, x64 @ w64, jnp.float32)


def test_reduce_scatter_local_shape_and_rows():
    """Rank r receives rows [r*M/P, (r+1)*M/P) of the reduced product."""
    tp, m, k, n = 4, 32, 64, 16
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(3)
    x, w, x64, w64 = random_operands(rng, m, k, n, jnp.float32)
    out = tp_call(mesh, "reduce_scatter")(x, w)
    for shard in out.addressable_shards:
        assert shard.data.shape == (m // tp, n)
        rows = shard.index[0]
        np.testing.assert_allclose(np.asarray(shard.data), (x64 @ w64)[rows], rtol=1e-4, atol=1e-5)


def test_eager_shard_map_without_jit():
    mesh = cpu_mesh((2,), ("tp",))
    rng = np.random.default_rng(11)
    x, w, x64, w64 = random_operands(rng, 16, 32, 24, jnp.bfloat16)
    out = tp_call(mesh, "all_reduce")(x, w)
    assert_close(out, x64 @ w64, jnp.bfloat16)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_grad_through_reference_path(collective):
    tp, m, k, n = 4, 32, 64, 24
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(5)
    x, w, x64, w64 = random_operands(rng, m, k, n, jnp.float32)
    ct = rng.standard_normal((m, n))
    f = tp_call(mesh, collective)

    def loss(x, w):
        return jnp.sum(f(x, w) * jnp.asarray(ct, jnp.float32))

    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(np.asarray(dx), ct @ w64.T, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(dw), x64.T @ ct, rtol=2e-4, atol=2e-5)


def test_describe_reports_reference_path(monkeypatch):
    mesh = cpu_mesh((2,), ("tp",))
    seen = {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective="all_reduce")
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_reduce")

    x = jnp.ones((8, 16), jnp.bfloat16)
    w = jnp.ones((16, 8), jnp.bfloat16)
    jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())(x, w)
    choice = seen["choice"]
    assert choice.path == "reference"
    assert choice.axis_size == 2 and choice.collective == "all_reduce"
    assert choice.reason


def test_force_reference_env_is_reported(monkeypatch):
    monkeypatch.setenv("FO_JAX_FORCE_REFERENCE", "1")
    mesh = cpu_mesh((2,), ("tp",))
    seen = {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp")
        return x

    x = jnp.ones((8, 16), jnp.float16)
    w = jnp.ones((16, 8), jnp.float16)
    jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                  out_specs=P(None, "tp"))(x, w)
    assert seen["choice"].path == "reference" and "forced" in seen["choice"].reason


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_matmul_reference(dtype):
    rng = np.random.default_rng(1)
    x, w, x64, w64 = random_operands(rng, 48, 40, 56, dtype)
    out = jax.jit(fo_jax.matmul)(x, w)
    assert out.dtype == jnp.dtype(dtype)
    assert_close(out, x64 @ w64, dtype)


def test_config_is_static_and_validated():
    cfg = fo_jax.OverlapConfig(num_groups=4, sm_budget=116, group_tile_rows=[2, 2])
    assert cfg.group_tile_rows == (2, 2) and hash(cfg) == hash(fo_jax.OverlapConfig(
        num_groups=4, sm_budget=116, group_tile_rows=(2, 2)))
    with pytest.raises(ValueError, match="num_groups"):
        fo_jax.OverlapConfig(num_groups=0)
    with pytest.raises(ValueError, match="group_tile_rows"):
        fo_jax.OverlapConfig(group_tile_rows=(1, -1))
    with pytest.raises(ValueError, match="transport"):
        fo_jax.OverlapConfig(transport="nvlink")
    assert fo_jax.OverlapConfig(transport="copy_engine").transport == "copy_engine"
    with pytest.raises(ValueError, match="copy_engine_rounds"):
        fo_jax.OverlapConfig(copy_engine_rounds=0)
    assert fo_jax.OverlapConfig(copy_engine_rounds=2).copy_engine_rounds == 2
    mesh = cpu_mesh((2,), ("tp",))
    rng = np.random.default_rng(2)
    x, w, x64, w64 = random_operands(rng, 16, 32, 8, jnp.float32)
    out = jax.jit(tp_call(mesh, "all_reduce", config=cfg))(x, w)
    assert_close(out, x64 @ w64, jnp.float32)


