"""fo_jax.nnx's ParallelSelfAttention and ParallelTransformerBlock on CPU meshes against their
unsharded nnx twins (the linen layers and the shared helpers: tests/cpu/test_transformer.py)."""

import pytest

pytest.importorskip("flax", minversion="0.12", reason="fo_jax.nnx needs flax 0.12 or later")

try:  # flax.nnx raises AttributeError, not ImportError, on jax versions it does not support
    from flax import nnx
except Exception as e:  # noqa: BLE001
    pytest.skip(f"flax.nnx does not import with these flax/jax versions: {e!r}",
                allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402,F401
from jax.sharding import PartitionSpec as P  # noqa: E402,F401
from conftest import cpu_mesh  # noqa: E402
from numerics import assert_close  # noqa: E402,F401

import fo_jax.nnx as fnnx  # noqa: E402
from test_transformer import (  # noqa: E402,F401
    B, D, F, HEADS, HEAD_DIM, HIGHEST, LINEN_CASES, S, _assert_close_all, _grads, _io_spec,
    _mesh, _on_cpu, _shape, _twin_attend)


def test_outside_shard_map_raises_actionable_error():
    with pytest.raises(ValueError, match=r"nnx.ParallelTransformerBlock: axis name 'tp' is not "
                                         r"bound"):
        fnnx.ParallelTransformerBlock(D, HEADS, F, rngs=nnx.Rngs(0))(jnp.ones((B, S, D)))


# --- nnx --------------------------------------------------------------------------------------

class NnxTwinAttention(nnx.Module):
    def __init__(self, causal, sequence_first, *, rngs):
        self.causal, self.sequence_first = causal, sequence_first
        self.qkv = nnx.Linear(D, HEADS * 3 * HEAD_DIM, precision=HIGHEST, rngs=rngs)
        self.out = nnx.LinearGeneral((HEADS, HEAD_DIM), D, axis=(-2, -1), precision=HIGHEST,
                                     rngs=rngs)

    def __call__(self, x):
        return self.out(_twin_attend(self.qkv(x), self.causal, self.sequence_first))


class NnxTwinMLP(nnx.Module):
    def __init__(self, *, rngs):
        self.up = nnx.Linear(D, F, precision=HIGHEST, rngs=rngs)
        self.down = nnx.Linear(F, D, precision=HIGHEST, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.gelu(self.up(x)))


class NnxTwinBlock(nnx.Module):
    def __init__(self, causal, sequence_first, norm, *, rngs):
        make = nnx.RMSNorm if norm == "rmsnorm" else nnx.LayerNorm
        self.ln1 = make(D, rngs=rngs)
        self.attention = NnxTwinAttention(causal, sequence_first, rngs=rngs)
        self.ln2 = make(D, rngs=rngs)
        self.mlp = NnxTwinMLP(rngs=rngs)

    def __call__(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _pure_leaves(state):
    return jax.tree.leaves(nnx.to_pure_dict(state))


def _compare_nnx(make, make_twin, x, io_spec, mesh, dtype=jnp.float32):
    """As _compare_linen for nnx modules built by `make` (sharded) and `make_twin`."""
    model, twin = fnnx.init_sharded(make, mesh), make_twin()
    graphdef, state = nnx.split(model)
    twin_graphdef, twin_state = nnx.split(twin)
    assert jax.tree.structure(nnx.to_pure_dict(state)) == jax.tree.structure(
        nnx.to_pure_dict(twin_state))
    for a, b in zip(_pure_leaves(state), _pure_leaves(twin_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    specs = fnnx.partition_specs(state)
    for a, s in zip(jax.tree.leaves(state), jax.tree.leaves(specs)):
        assert a.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, s), a.ndim)

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)

    def twin_apply(state, x):
        return nnx.merge(twin_graphdef, state)(x)

    f = jax.shard_map(apply, mesh=mesh, in_specs=(specs, io_spec), out_specs=io_spec)
    ref_state, ref_x = twin_state, x
    if dtype != jnp.float32:
        ref_state = jax.tree.map(lambda p: p.astype(dtype).astype(jnp.float32), twin_state)
        ref_x = x.astype(jnp.float32)
    y, y_ref = jax.jit(f)(state, x), jax.jit(twin_apply)(ref_state, ref_x)
    assert y.shape == y_ref.shape == x.shape and y.dtype == dtype
    ct = jax.random.normal(jax.random.key(1), y.shape, jnp.float32)
    (g_state, g_x), (w_state, w_x) = _grads(f, state, x, ct), _grads(twin_apply, ref_state,
                                                                     ref_x, ct)
    _assert_close_all([(y, y_ref), (g_x, w_x)]
                      + list(zip(_pure_leaves(g_state), _pure_leaves(w_state))), dtype)
    return state, specs


@pytest.mark.parametrize("case", list(LINEN_CASES))
def test_nnx_block_matches_twin(case):
    mesh_name, collective, seq_first, causal, norm = LINEN_CASES[case]
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(7), _shape(seq_first), jnp.float32)
    state, specs = _compare_nnx(
        lambda: fnnx.ParallelTransformerBlock(D, HEADS, F, collective=collective, causal=causal,
                                              sequence_first=seq_first, norm=norm,
                                              rngs=nnx.Rngs(0)),
        lambda: NnxTwinBlock(causal, seq_first, norm, rngs=nnx.Rngs(0)), x,
        _io_spec(collective, data, seq_first), mesh)
    pure = nnx.to_pure_dict(specs)
    assert pure["attention"]["qkv"] == {"kernel": P(None, "tp"), "bias": P("tp")}
    assert pure["attention"]["out"]["kernel"] == P("tp", None, None)
    assert pure["ln1"]["scale"] == P(None)
    assert state["ln2"]["scale"].get_metadata("out_sharding") == ("embed",)


def test_nnx_block_bf16_matches_float32_twin():
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(9), (B, S, D), jnp.float32).astype(jnp.bfloat16)
    _compare_nnx(lambda: fnnx.ParallelTransformerBlock(D, HEADS, F, causal=True,
                                                       dtype=jnp.bfloat16, rngs=nnx.Rngs(0)),
                 lambda: NnxTwinBlock(True, False, "layernorm", rngs=nnx.Rngs(0)), x, P("tp"),
                 mesh, dtype=jnp.bfloat16)


def test_nnx_attention_matches_twin():
    mesh, data = _mesh("data2xtp4")
    x = jax.random.normal(jax.random.key(8), (S, B, D), jnp.float32)
    _compare_nnx(lambda: fnnx.ParallelSelfAttention(D, HEADS, causal=True, sequence_first=True,
                                                    rngs=nnx.Rngs(0)),
                 lambda: NnxTwinAttention(True, True, rngs=nnx.Rngs(0)), x,
                 _io_spec("reduce_scatter", data, True), mesh)


def test_nnx_bad_configurations_raise():
    with pytest.raises(ValueError, match=r"d_model=16 is not divisible by num_heads=3"):
        fnnx.ParallelSelfAttention(D, 3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"unknown norm"):
        fnnx.ParallelTransformerBlock(D, HEADS, F, norm="batchnorm", rngs=nnx.Rngs(0))
    mesh, _ = _mesh("tp4")
    graphdef, state = nnx.split(fnnx.init_sharded(
        lambda: fnnx.ParallelSelfAttention(24, 6, rngs=nnx.Rngs(0)), cpu_mesh((2,), ("tp",))))
    f = jax.shard_map(lambda s, x: nnx.merge(graphdef, s)(x), mesh=mesh,
                      in_specs=(jax.tree.map(lambda _: P(), state), P("tp")), out_specs=P("tp"))
    with pytest.raises(ValueError, match=r"num_heads=6 is not divisible by the size of axis "
                                         r"'tp' \(4\)"):
        jax.jit(f)(state, jnp.ones((B, S, 24), jnp.float32))

