"""The custom VJP of overlapped_matmul (fo_jax/autodiff.py) on CPU devices: numerical gradient
checks, equality with autodiff of the plain XLA reference (jit, eager, bf16, check_vma on and off,
1-D and 2-D meshes, grad inside shard_map), and proof that the custom rule is the one used."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cpu_mesh
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads
from numerics import random_operands

import fo_jax
from fo_jax import reference
from fo_jax.autodiff import overlapped_matmul_vjp

COLLECTIVES = ["reduce_scatter", "all_reduce"]
MESHES = {  # name: (mesh shape, axis names, data axis or None)
    "tp2": ((2,), ("tp",), None),
    "tp4": ((4,), ("tp",), None),
    "data2xtp4": ((2, 4), ("data", "tp"), "data"),
}
M, K, N = 32, 64, 24  # global x[M, K] @ w[K, N]; M divisible by data * tp


def _specs(mesh_name, collective):
    data = MESHES[mesh_name][2]
    if collective == "all_reduce":
        out = P(data, None)
    else:
        out = P((data, "tp") if data else "tp", None)
    return (P(data, "tp"), P("tp", None)), out


def sharded(impl, mesh_name, collective, check_vma=True):
    """Global function (x, w) -> y running `impl` ("fo_jax", "reference" or a forward callable
    wrapped by overlapped_matmul_vjp) per shard."""
    shape, names, _ = MESHES[mesh_name]
    mesh = cpu_mesh(shape, names)
    in_specs, out_spec = _specs(mesh_name, collective)

    def body(x, w):
        if impl == "fo_jax":
            return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective)
        if impl == "reference":
            return reference.overlapped_matmul(x, w, "tp", collective)
        return overlapped_matmul_vjp(impl, x, w, "tp", collective)

    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                         check_vma=check_vma)


def _operands(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x, w, _, _ = random_operands(rng, M, K, N, dtype)
    ct = jnp.asarray(rng.standard_normal((M, N)), dtype)
    return x, w, ct


def _grads(f, x, w, ct, use_jit=True):
    def loss(x, w):
        return jnp.sum(f(x, w).astype(jnp.float32) * ct.astype(jnp.float32))

    g = jax.grad(loss, argnums=(0, 1))
    return (jax.jit(g) if use_jit else g)(x, w)


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_check_grads_numerical(mesh_name, collective):
    x, w, _ = _operands(jnp.float32, seed=1)
    f = jax.jit(sharded("fo_jax", mesh_name, collective))
    check_grads(f, (x, w), order=1, modes=["rev"])


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_grads_equal_plain_reference_f32(mesh_name, collective, check_vma):
    x, w, ct = _operands(jnp.float32, seed=2)
    got = _grads(sharded("fo_jax", mesh_name, collective, check_vma), x, w, ct)
    want = _grads(sharded("reference", mesh_name, collective, check_vma), x, w, ct)
    for g, r, p in zip(got, want, (x, w)):
        assert g.dtype == p.dtype and g.shape == p.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)
    # and against the closed form of the global product
    x64, w64, ct64 = (np.asarray(a, np.float64) for a in (x, w, ct))
    np.testing.assert_allclose(np.asarray(got[0]), ct64 @ w64.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), x64.T @ ct64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_grads_bf16_and_eager(collective):
    x, w, ct = _operands(jnp.bfloat16, seed=3)
    for use_jit in (True, False):
        got = _grads(sharded("fo_jax", "data2xtp4", collective), x, w, ct, use_jit)
        want = _grads(sharded("reference", "data2xtp4", collective), x, w, ct, use_jit)
        for g, r in zip(got, want):
            assert g.dtype == jnp.bfloat16
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32),
                                       rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_grad_inside_shard_map(collective, check_vma):
    """jax.grad taken per device inside the shard_map body (the usual training-step layout)."""
    mesh = cpu_mesh((2, 4), ("data", "tp"))
    x, w, ct = _operands(jnp.float32, seed=4)
    in_specs, out_spec = _specs("data2xtp4", collective)

    def make(impl):
        def body(x, w, ct):
            def loss(x, w):
                if impl == "fo_jax":
                    y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective)
                else:
                    y = reference.overlapped_matmul(x, w, "tp", collective)
                return jnp.sum(y * ct)

            return jax.grad(loss, argnums=(0, 1))(x, w)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(*in_specs, out_spec),
                                     out_specs=in_specs, check_vma=check_vma))

    got, want = make("fo_jax")(x, w, ct), make("reference")(x, w, ct)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)


def _undifferentiable(collective):
    """A forward that computes the right values but whose derivative raises if JAX asks."""

    @jax.custom_jvp
    def forward(x, w):
        return reference.overlapped_matmul(x, w, "tp", collective)

    @forward.defjvp
    def _jvp(primals, tangents):
        raise AssertionError("the forward was differentiated; the custom VJP was bypassed")

    return forward


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_custom_rule_is_used(collective):
    x, w, ct = _operands(jnp.float32, seed=5)
    fwd = _undifferentiable(collective)
    with pytest.raises(AssertionError, match="bypassed"):  # the probe works
        _grads(jax.shard_map(lambda x, w: fwd(x, w), mesh=cpu_mesh((4,), ("tp",)),
                             in_specs=_specs("tp4", collective)[0],
                             out_specs=_specs("tp4", collective)[1]), x, w, ct)
    got = _grads(sharded(fwd, "data2xtp4", collective), x, w, ct)
    want = _grads(sharded("reference", "data2xtp4", collective), x, w, ct)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_public_op_goes_through_the_rule(collective):
    x, w, ct = _operands(jnp.float32, seed=6)
    f = sharded("fo_jax", "tp4", collective)
    assert "custom_vjp_call" in str(jax.make_jaxpr(f)(x, w))
    backward = str(jax.make_jaxpr(jax.vjp(f, x, w)[1])(ct))
    if collective == "reduce_scatter":
        assert "all_gather" in backward
    else:  # dy is replicated: the all_reduce backward communicates nothing
        for op in ("psum", "all_gather", "reduce_scatter", "all_to_all", "ppermute"):
            assert op not in backward, backward


def test_jit_cache_is_reused():
    """A fresh forward closure per call must not defeat jit caching of the caller."""
    traces = []
    mesh = cpu_mesh((4,), ("tp",))
    in_specs, out_spec = _specs("tp4", "reduce_scatter")

    def body(x, w):
        traces.append(None)
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter")

    f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)
    step = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w)), argnums=(0, 1)))
    x, w, _ = _operands(jnp.float32, seed=7)
    jax.block_until_ready(step(x, w))
    n = len(traces)
    jax.block_until_ready(step(x + 1, w))
    assert len(traces) == n
