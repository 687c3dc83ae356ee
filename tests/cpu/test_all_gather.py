"""all_gather_matmul / overlapped_matmul(collective="all_gather") on CPU devices: the forward
against a float64 reference, the gathered input, N-d inputs, gradients against autodiff of the
reference ops (dx through the GEMM + reduce-scatter op, the gathered input's own cotangent,
recompute), vmap, and the reduce-scatter's backward that runs through it."""

import jax
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (check_grads)
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh


def _rand(rng, shape, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


def _run(tp, fn, in_specs, out_specs, *args, check_vma=True):
    mesh = cpu_mesh((tp,), ("tp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check_vma))(*args)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("lead", [(8,), (8, 3)])
def test_forward_and_gathered_input(tp, lead):
    rng = np.random.default_rng(0)
    x = _rand(rng, (*lead, 16))       # global rows sharded over tp (sequence parallel)
    w = _rand(rng, (16, 12 * tp))     # columns sharded over tp
    k_spec = (None,) * (len(lead) - 1)

    def body(x, w):
        y, g = fo_jax.all_gather_matmul(x, w, axis_name="tp")
        y2 = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_gather")
        return y, g, y2

    y, g, y2 = _run(tp, body, (P("tp", *k_spec, None), P(None, "tp")),
                    (P(None, *k_spec, "tp"), P(*(None,) * (len(lead) + 1)),
                     P(None, *k_spec, "tp")), x, w, check_vma=False)  # g: varying type
    expect = np.einsum("...k,kn->...n", np.asarray(x, np.float64), np.asarray(w, np.float64))
    np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y2, expect, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(g, x)  # every rank holds all rows


def _grads(op, x, w, ct_y, ct_g, tp, recompute=False):
    def loss(x, w):
        y, g = op(x, w)
        total = jnp.sum(y * ct_y)
        if ct_g is not None:
            total = total + jnp.sum(g * ct_g)
        return jax.lax.psum(total, "tp")

    return _run(tp, jax.value_and_grad(loss, argnums=(0, 1)), (P("tp", None), P(None, "tp")),
                (P(), (P("tp", None), P(None, "tp"))), x, w, check_vma=False)


@pytest.mark.parametrize("use_gathered", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_grads_match_reference(use_gathered, recompute):
    tp = 4
    rng = np.random.default_rng(1)
    x, w = _rand(rng, (16, 8)), _rand(rng, (8, 24))
    # Per-rank cotangents of the (replicated-rows, sharded-columns) outputs.
    ct_y = _rand(rng, (16, 24 // tp))
    ct_g = _rand(rng, (16, 8)) if use_gathered else None

    def ours(x, w):
        return fo_jax.all_gather_matmul(x, w, axis_name="tp", recompute=recompute)

    def ref(x, w):
        g = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
        return jnp.dot(g, w, precision=jax.lax.Precision.HIGHEST), g

    got = _grads(ours, x, w, ct_y, ct_g, tp)
    want = _grads(ref, x, w, ct_y, ct_g, tp)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_check_grads(collective):
    """Numerical gradients of the op (first and second order) inside shard_map; the
    reduce-scatter's dx runs through all_gather_matmul and the all-gather's through the
    reduce-scatter op."""
    tp = 2
    rng = np.random.default_rng(2)
    if collective == "all_gather":
        x, w = _rand(rng, (4, 6), 0.5), _rand(rng, (6, 8), 0.5)
        specs = (P("tp", None), P(None, "tp")), P(None, "tp")
    else:
        x, w = _rand(rng, (4, 8), 0.5), _rand(rng, (8, 6), 0.5)
        specs = (P(None, "tp"), P("tp", None)), P("tp", None)
    f = jax.shard_map(lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp",
                                                            collective=collective),
                      mesh=cpu_mesh((tp,), ("tp",)), in_specs=specs[0], out_specs=specs[1])
    with jax.default_matmul_precision("highest"):
        jax.test_util.check_grads(f, (x, w), order=2, modes=("rev",), atol=2e-2, rtol=2e-2)


def test_vmap_over_x():
    tp = 2
    rng = np.random.default_rng(3)
    x, w = _rand(rng, (3, 8, 16)), _rand(rng, (16, 12))

    def body(x, w):
        return jax.vmap(lambda xi: fo_jax.overlapped_matmul(xi, w, axis_name="tp",
                                                            collective="all_gather"))(x)

    out = _run(tp, body, (P(None, "tp", None), P(None, "tp")), P(None, None, "tp"), x, w)
    np.testing.assert_allclose(out, np.einsum("bmk,kn->bmn", x, w), rtol=1e-4, atol=1e-4)


def test_axis_of_size_one():
    rng = np.random.default_rng(4)
    x, w = _rand(rng, (8, 16)), _rand(rng, (16, 4))
    y, g = _run(1, lambda x, w: fo_jax.all_gather_matmul(x, w, axis_name="tp"),
                (P("tp", None), P(None, "tp")), (P(None, "tp"), P()), x, w, check_vma=False)
    np.testing.assert_allclose(y, np.asarray(x, np.float64) @ np.asarray(w, np.float64),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(g, x)


def test_describe_says_the_overlapped_all_gather_is_opt_in_on_cuda():
    from fo_jax import overlap

    choice = overlap._choose_overlapped(jnp.dtype(jnp.bfloat16), None, 2048, 8192, 8192, "cpu",
                                        "all_gather", 4)
    assert choice.path == "reference"
    if fo_jax.cuda_module_available():
        choice = overlap._choose_overlapped(jnp.dtype(jnp.bfloat16), None, 2048, 8192, 8192,
                                            "gpu", "all_gather", 4)
        assert choice.path == "xla" and "opt-in" in choice.reason
