"""fo_jax's ops behave like JAX ops on CPU devices (the reference path, with fo_jax's own custom
VJP and batching rules around it, which the CUDA path shares): x[..., K] with leading dimensions,
jax.grad, jax.vmap over x, w or both, lax.scan, jax.checkpoint, an axis of size 1, and describe()
agreeing with the DEBUG log. tests/gpu/gemm/test_transforms_gpu.py and
tests/gpu/overlap/test_autodiff_gpu.py run the same transforms through the CUDA kernels."""

import logging

import jax
import jax.test_util  # noqa: F401  (check_grads)
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh
from numerics import assert_close

CPU = jax.devices("cpu")[0]
HI = jax.lax.Precision.HIGHEST


def _rand(rng, shape, dtype=jnp.float32, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


def _ref_matmul(x, w):
    return jnp.einsum("...k,kn->...n", x.astype(jnp.float32), w.astype(jnp.float32),
                      precision=HI)


# --------------------------------------------------------------------------------------------
# fo_jax.matmul
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lead", [(), (5,), (2, 3), (2, 1, 4)])
def test_matmul_leading_dims(lead):
    rng = np.random.default_rng(0)
    x, w = _rand(rng, (*lead, 16)), _rand(rng, (16, 24))
    with jax.default_device(CPU):
        out = jax.jit(fo_jax.matmul)(x, w)
    assert out.shape == (*lead, 24)
    np.testing.assert_allclose(out, np.asarray(x, np.float64) @ np.asarray(w, np.float64),
                               rtol=2e-5, atol=2e-5)


def test_matmul_grad_matches_float64():
    rng = np.random.default_rng(1)
    x, w = _rand(rng, (3, 8, 16)), _rand(rng, (16, 12))
    g = _rand(rng, (3, 8, 12))
    with jax.default_device(CPU):
        dx, dw = jax.jit(jax.grad(lambda x, w: jnp.sum(fo_jax.matmul(x, w) * g),
                                  argnums=(0, 1)))(x, w)
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    np.testing.assert_allclose(dx, g64 @ w64.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, np.einsum("abk,abn->kn", x64, g64), rtol=1e-4, atol=1e-4)


def test_matmul_check_grads():
    rng = np.random.default_rng(2)
    x, w = _rand(rng, (4, 8), scale=0.5), _rand(rng, (8, 6), scale=0.5)
    with jax.default_device(CPU), jax.default_matmul_precision("highest"):
        jax.test_util.check_grads(fo_jax.matmul, (x, w), order=2, modes=("rev",), atol=2e-2,
                                  rtol=2e-2)


def test_matmul_bf16_grad_dtypes():
    rng = np.random.default_rng(3)
    x, w = _rand(rng, (8, 16), jnp.bfloat16), _rand(rng, (16, 8), jnp.bfloat16)
    with jax.default_device(CPU):
        dx, dw = jax.grad(lambda x, w: fo_jax.matmul(x, w).astype(jnp.float32).sum(),
                          argnums=(0, 1))(x, w)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (1, None), (None, 1)])
def test_matmul_vmap(in_axes):
    rng = np.random.default_rng(4)
    xs = (3, 8, 16) if in_axes[0] == 0 else (8, 3, 16) if in_axes[0] == 1 else (8, 16)
    ws = (3, 16, 12) if in_axes[1] == 0 else (16, 3, 12) if in_axes[1] == 1 else (16, 12)
    x, w = _rand(rng, xs), _rand(rng, ws)
    with jax.default_device(CPU):
        out = jax.jit(jax.vmap(fo_jax.matmul, in_axes=in_axes))(x, w)
        expect = jax.vmap(_ref_matmul, in_axes=in_axes)(x, w)
    np.testing.assert_allclose(out, expect, rtol=2e-5, atol=2e-5)


def test_matmul_vmap_of_grad_and_grad_of_vmap():
    rng = np.random.default_rng(5)
    x, w = _rand(rng, (3, 8, 16)), _rand(rng, (16, 12))

    def loss(x, w):
        return jnp.sum(jnp.sin(fo_jax.matmul(x, w)))

    def ref_loss(x, w):
        return jnp.sum(jnp.sin(_ref_matmul(x, w)))

    with jax.default_device(CPU):
        got = jax.vmap(jax.grad(loss, argnums=1), in_axes=(0, None))(x, w)
        want = jax.vmap(jax.grad(ref_loss, argnums=1), in_axes=(0, None))(x, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        got = jax.grad(lambda x, w: jnp.sum(jax.vmap(loss, in_axes=(0, None))(x, w)))(x, w)
        want = jax.grad(lambda x, w: jnp.sum(jax.vmap(ref_loss, in_axes=(0, None))(x, w)))(x, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_matmul_scan_and_checkpoint():
    rng = np.random.default_rng(6)
    ws = _rand(rng, (4, 16, 16), scale=0.25)
    x = _rand(rng, (8, 16))

    def net(x, ws, mm):
        def layer(h, w):
            return jnp.tanh(jax.checkpoint(mm)(h, w)), None
        return jnp.sum(jax.lax.scan(layer, x, ws)[0])

    with jax.default_device(CPU):
        got = jax.jit(jax.value_and_grad(lambda x, ws: net(x, ws, fo_jax.matmul),
                                         argnums=(0, 1)))(x, ws)
        want = jax.value_and_grad(lambda x, ws: net(x, ws, _ref_matmul), argnums=(0, 1))(x, ws)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_forward_mode_says_it_is_unsupported():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 8))
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(fo_jax.matmul, (x, w), (x, w))


# --------------------------------------------------------------------------------------------
# fo_jax.overlapped_matmul
# --------------------------------------------------------------------------------------------
def _sharded(mesh, fn, in_specs, out_specs):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_overlapped_leading_dims(collective):
    """x [A, B, K]: the product is [A, B, N]; reduce_scatter scatters A (the first dimension)."""
    tp = 4
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(7)
    x, w = _rand(rng, (8, 3, 32)), _rand(rng, (32, 16))
    out_spec = P("tp", None, None) if collective == "reduce_scatter" else P()
    f = _sharded(mesh, lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp",
                                                             collective=collective),
                 (P(None, None, "tp"), P("tp", None)), out_spec)
    out = f(x, w)
    assert out.shape == (8, 3, 16)
    expect = np.einsum("abk,kn->abn", np.asarray(x, np.float64), np.asarray(w, np.float64))
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_overlapped_check_grads(collective):
    tp = 2
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(8)
    x, w = _rand(rng, (4, 8), scale=0.5), _rand(rng, (8, 6), scale=0.5)
    out_spec = P("tp", None) if collective == "reduce_scatter" else P()
    f = jax.shard_map(lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp",
                                                            collective=collective),
                      mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=out_spec)
    with jax.default_matmul_precision("highest"):
        jax.test_util.check_grads(f, (x, w), order=1, modes=("rev",), atol=2e-2, rtol=2e-2)


def _vmap_case(in_axes, collective):
    """Global operands for vmap over (x, w) inside shard_map, and their specs."""
    tp = 2
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(9)
    b = 3
    x = _rand(rng, (b, 8, 16) if in_axes[0] == 0 else (8, 16))
    w = _rand(rng, (b, 16, 12) if in_axes[1] == 0 else (16, 12))
    x_spec = P(None, None, "tp") if in_axes[0] == 0 else P(None, "tp")
    w_spec = P(None, "tp", None) if in_axes[1] == 0 else P("tp", None)
    if collective == "reduce_scatter":
        out_spec = P(None, "tp", None)
    else:
        out_spec = P()
    return mesh, x, w, (x_spec, w_spec), out_spec


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)])
def test_overlapped_vmap(collective, in_axes):
    mesh, x, w, in_specs, out_spec = _vmap_case(in_axes, collective)

    def body(op):
        return lambda x, w: jax.vmap(lambda a, b: op(a, b), in_axes=in_axes)(x, w)

    ours = body(lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp",
                                                      collective=collective))
    ref = body(lambda a, b: fo_jax.reference.overlapped_matmul(a, b, "tp", collective))
    got = _sharded(mesh, ours, in_specs, out_spec)(x, w)
    want = _sharded(mesh, ref, in_specs, out_spec)(x, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_overlapped_grad_of_vmap_scan_checkpoint(collective):
    """A scanned stack of checkpointed layers with a vmapped batch, differentiated, equals the
    same model written with the reference op."""
    tp = 2
    mesh = cpu_mesh((tp,), ("tp",))
    rng = np.random.default_rng(10)
    ws = _rand(rng, (3, 16, 16), scale=0.25)
    x = _rand(rng, (2, 8, 16))
    ax = "tp"

    def make(op):
        def layer(h, w):
            # A row-parallel layer whose output's columns are sharded again for the next one:
            # reduce_scatter's rows are gathered back first.
            y = jax.checkpoint(op)(h, w)
            if collective == "reduce_scatter":
                y = jax.lax.all_gather(y, ax, axis=0, tiled=True)
            k = h.shape[-1]
            y = jax.lax.dynamic_slice_in_dim(y, jax.lax.axis_index(ax) * k, k, axis=1)
            return jnp.tanh(y), None

        def model(x, ws):
            def one(xi):
                return jax.lax.scan(layer, xi, ws)[0]
            out = jax.vmap(one)(x)
            return jax.lax.psum(jnp.sum(out * out), ax)
        return model

    ours = make(lambda h, w: fo_jax.overlapped_matmul(h, w, axis_name=ax, collective=collective))
    ref = make(lambda h, w: fo_jax.reference.overlapped_matmul(h, w, ax, collective))

    def run(model):
        f = jax.shard_map(jax.value_and_grad(model, argnums=(0, 1)), mesh=mesh,
                          in_specs=(P(None, None, ax), P(None, ax, None)),
                          out_specs=(P(), (P(None, None, ax), P(None, ax, None))),
                          check_vma=False)
        return jax.jit(f)(x, ws)

    for a, b in zip(jax.tree.leaves(run(ours)), jax.tree.leaves(run(ref))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_axis_of_size_one_is_a_gemm(collective):
    mesh = cpu_mesh((1,), ("tp",))
    rng = np.random.default_rng(11)
    x, w = _rand(rng, (16, 32), jnp.bfloat16), _rand(rng, (32, 8), jnp.bfloat16)
    seen = {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective=collective)
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective)

    out_spec = P("tp", None) if collective == "reduce_scatter" else P()
    f = _sharded(mesh, body, (P(None, "tp"), P("tp", None)), out_spec)
    out = f(x, w)
    assert "axis of size 1" in seen["choice"].reason and seen["choice"].axis_size == 1
    assert_close(out, np.asarray(x, np.float64) @ np.asarray(w, np.float64), jnp.bfloat16)
    text = f.lower(x, w).as_text()
    assert "fo_jax_overlapped_matmul" not in text


def test_describe_and_debug_log_agree(caplog):
    mesh = cpu_mesh((2,), ("tp",))
    seen = {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective="all_reduce")
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_reduce")

    x, w = jnp.ones((64, 64), jnp.bfloat16), jnp.ones((64, 64), jnp.bfloat16)
    with caplog.at_level(logging.DEBUG, logger="fo_jax"):
        _sharded(mesh, body, (P(None, "tp"), P("tp", None)), P()).trace(x, w)
    choice = seen["choice"]
    assert choice.platform == "cpu" and choice.path == "reference"
    logged = [r.getMessage() for r in caplog.records if "fo_jax.overlapped_matmul x" in
              r.getMessage()]
    assert logged and all(str(choice) in m for m in logged), (choice, logged)
