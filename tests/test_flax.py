"""fo_jax.flax tensor-parallel layers on CPU devices: shapes, partition specs, init, and forward and
gradients equal to unsharded flax.linen models holding the same (gathered) parameters."""

import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cpu_mesh
from jax.sharding import PartitionSpec as P

from fo_jax.flax import (
    ColumnParallelDense,
    ParallelAttentionOutput,
    ParallelMLP,
    RowParallelDense,
    init_sharded,
)

COLLECTIVES = ["reduce_scatter", "all_reduce"]
MESHES = {"tp4": ((4,), ("tp",), None), "data2xtp4": ((2, 4), ("data", "tp"), "data")}
B, S, D, F = 8, 4, 16, 32  # batch (divisible by data * tp), sequence, d_model, d_ff
HEADS, HEAD_DIM = 8, 4


class DenseMLP(nn.Module):
    """The unsharded twin of ParallelMLP (same parameter names and shapes, gathered)."""

    hidden: int

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(self.hidden, name="up")(x))
        return nn.Dense(x.shape[-1], name="down")(h)


def _mesh(name):
    shape, names, data = MESHES[name]
    return cpu_mesh(shape, names), data


def _io_specs(collective, data, ndim):
    """Input and output specs of a block: replicated over tp (all_reduce) or leading axis split
    over (data, tp) (reduce_scatter: sequence-parallel layout)."""
    rest = (None,) * (ndim - 1)
    if collective == "all_reduce":
        return P(data, *rest), P(data, *rest)
    rows = (data, "tp") if data else "tp"
    return P(rows, *rest), P(rows, *rest)


def _compare(tp_module, dense_module, x, x_spec, out_spec, mesh, seed=0, check_vma=True):
    """Init both models from one key; check init, forward and gradients (params and input)."""
    key = jax.random.key(seed)
    variables = init_sharded(tp_module, mesh, key, x, in_specs=(x_spec,))
    specs = nn.get_partition_spec(variables)
    params = nn.unbox(variables)
    dense_params = dense_module.init(key, x)
    assert jax.tree.structure(params) == jax.tree.structure(dense_params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(dense_params)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same draws as unsharded

    tp_apply = jax.shard_map(tp_module.apply, mesh=mesh, in_specs=(specs, x_spec),
                             out_specs=out_spec, check_vma=check_vma)
    y = jax.jit(tp_apply)(params, x)
    y_ref = jax.jit(dense_module.apply)(params, x)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)

    ct = jax.random.normal(jax.random.key(seed + 1), y.shape, y.dtype)

    def grads(apply):
        return jax.jit(jax.grad(lambda p, x: jnp.sum(apply(p, x) * ct), argnums=(0, 1)))(params, x)

    got, want = grads(tp_apply), grads(dense_module.apply)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    return variables, y


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_parallel_mlp_matches_dense(mesh_name, collective):
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(7), (B, S, D), jnp.float32)
    x_spec, out_spec = _io_specs(collective, data, 3)
    variables, y = _compare(ParallelMLP(F, collective=collective), DenseMLP(F), x, x_spec,
                            out_spec, mesh)

    up, down = variables["params"]["up"], variables["params"]["down"]
    specs = nn.get_partition_spec(variables)["params"]
    assert specs["up"] == {"kernel": P(None, "tp"), "bias": P("tp")}
    assert specs["down"] == {"kernel": P("tp", None), "bias": P(None)}
    assert nn.unbox(up)["kernel"].shape == (D, F) and nn.unbox(down)["kernel"].shape == (F, D)
    for a, sharding in zip(jax.tree.leaves(nn.unbox(variables)),
                           jax.tree.leaves(nn.get_sharding(variables, mesh))):
        assert a.sharding.is_equivalent_to(sharding, a.ndim)  # usable as jit shardings too
    local = {s.data.shape for s in nn.unbox(up)["kernel"].addressable_shards}
    assert local == {(D, F // 4)}
    local = {s.data.shape for s in nn.unbox(down)["kernel"].addressable_shards}
    assert local == {(F // 4, D)}
    shards = (2 if data else 1) * (4 if collective == "reduce_scatter" else 1)
    rows = B // shards
    assert y.shape == (B, S, D)
    assert {s.data.shape for s in y.addressable_shards} == {(rows, S, D)}


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_parallel_mlp_without_vma_checks(collective):
    mesh, data = _mesh("data2xtp4")
    x = jax.random.normal(jax.random.key(12), (B, S, D), jnp.float32)
    x_spec, out_spec = _io_specs(collective, data, 3)
    _compare(ParallelMLP(F, collective=collective), DenseMLP(F), x, x_spec, out_spec, mesh,
             check_vma=False)


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_row_parallel_dense_matches_dense(mesh_name, collective):
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(8), (B, S, F), jnp.float32)
    x_spec = P(data, None, "tp")  # input features sharded
    _, out_spec = _io_specs(collective, data, 3)
    variables, _ = _compare(RowParallelDense(D, collective=collective), nn.Dense(D), x, x_spec,
                            out_spec, mesh)
    assert nn.get_partition_spec(variables)["params"] == {"kernel": P("tp", None),
                                                          "bias": P(None)}


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_column_parallel_dense_matches_dense(mesh_name, use_bias):
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(9), (B, S, D), jnp.float32)
    variables, _ = _compare(ColumnParallelDense(F, use_bias=use_bias),
                            nn.Dense(F, use_bias=use_bias), x, P(data), P(data, None, "tp"), mesh)
    want = {"kernel": P(None, "tp"), "bias": P("tp")} if use_bias else {"kernel": P(None, "tp")}
    assert nn.get_partition_spec(variables)["params"] == want


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_attention_output_matches_dense_general(mesh_name, collective):
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(10), (B, S, HEADS, HEAD_DIM), jnp.float32)
    x_spec = P(data, None, "tp", None)  # heads sharded
    _, out_spec = _io_specs(collective, data, 3)
    variables, y = _compare(ParallelAttentionOutput(D, collective=collective),
                            nn.DenseGeneral(D, axis=(-2, -1)), x, x_spec, out_spec, mesh)
    assert y.shape == (B, S, D)
    assert nn.get_partition_spec(variables)["params"]["kernel"] == P("tp", None, None)
    assert nn.unbox(variables)["params"]["kernel"].shape == (HEADS, HEAD_DIM, D)


def test_bf16_compute_dtype():
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(11), (B, S, D), jnp.bfloat16)
    module = ParallelMLP(F, collective="reduce_scatter", dtype=jnp.bfloat16)
    variables = init_sharded(module, mesh, jax.random.key(0), x, in_specs=(P("tp"),))
    params = nn.unbox(variables)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    f = jax.shard_map(module.apply, mesh=mesh, in_specs=(nn.get_partition_spec(variables),
                                                         P("tp")), out_specs=P("tp"))
    y = jax.jit(f)(params, x)
    ref = DenseMLP(F).apply(params, x.astype(jnp.float32))
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref), rtol=5e-2, atol=5e-2)


def test_reduce_scatter_needs_divisible_leading_axis():
    mesh, _ = _mesh("tp4")
    x = jnp.ones((2, 4, F), jnp.float32)  # leading axis 2 cannot be scattered over 4 devices
    with pytest.raises(ValueError, match="leading axis"):
        init_sharded(RowParallelDense(D), mesh, jax.random.key(0), x,
                     in_specs=(P(None, None, "tp"),))


def test_import_fo_jax_does_not_import_flax():
    code = "import sys, fo_jax; assert not {'flax', 'fo_jax.flax'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
