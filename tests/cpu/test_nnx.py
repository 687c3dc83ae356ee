"""fo_jax.nnx tensor-parallel layers on CPU devices: built sharded with the unsharded twins'
draws (nnx.Linear, nnx.LinearGeneral), forward and gradients equal to the twins inside
shard_map, sharding metadata and logical rules, the error outside shard_map, init memory, and
a few optax training steps that follow the twin's step by step."""

import pytest

pytest.importorskip("flax", minversion="0.12", reason="fo_jax.nnx needs flax 0.12 or later")

try:  # flax.nnx raises AttributeError, not ImportError, on jax versions it does not support
    from flax import nnx
except Exception as e:  # noqa: BLE001
    pytest.skip(f"flax.nnx does not import with these flax/jax versions: {e!r}",
                allow_module_level=True)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from conftest import cpu_mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from numerics import assert_close  # noqa: E402

import fo_jax  # noqa: E402
import fo_jax.flax  # noqa: E402
import fo_jax.nnx as fnnx  # noqa: E402

COLLECTIVES = ["reduce_scatter", "all_reduce"]
MESHES = {"tp4": ((4,), ("tp",), None), "data2xtp4": ((2, 4), ("data", "tp"), "data")}
B, S, D, F = 8, 4, 16, 32  # batch (divisible by data * tp), sequence, d_model, d_ff
HEADS, HEAD_DIM = 8, 4
HIGHEST = jax.lax.Precision.HIGHEST


@pytest.fixture(autouse=True)
def _on_cpu():
    """Eager twins and uncommitted inputs on CPU, the platform of the meshes (on GPU machines
    the default device is a GPU)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


class TwinMLP(nnx.Module):
    """The unsharded twin of fo_jax.nnx.ParallelMLP (same attributes, draw order and math)."""

    def __init__(self, d, h, *, rngs):
        self.up = nnx.Linear(d, h, precision=HIGHEST, rngs=rngs)
        self.down = nnx.Linear(h, d, precision=HIGHEST, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.gelu(self.up(x)))


def _mesh(name):
    shape, names, data = MESHES[name]
    return cpu_mesh(shape, names), data


def _rows(collective, data):
    """Spec of the leading axis of a block's input and output."""
    if collective == "all_reduce":
        return data
    return (data, "tp") if data else "tp"


def _case(layer, collective, data, dtype=None):
    """(tp constructor, twin constructor, input shape, input spec, output spec)."""
    rows = _rows(collective, data)
    return {
        "row": (lambda: fnnx.RowParallelDense(F, D, collective=collective, dtype=dtype,
                                              rngs=nnx.Rngs(0)),
                lambda: nnx.Linear(F, D, precision=HIGHEST, rngs=nnx.Rngs(0)),
                (B, S, F), P(data, None, "tp"), P(rows)),
        "column": (lambda: fnnx.ColumnParallelDense(D, F, dtype=dtype, rngs=nnx.Rngs(0)),
                   lambda: nnx.Linear(D, F, precision=HIGHEST, rngs=nnx.Rngs(0)),
                   (B, S, D), P(data), P(data, None, "tp")),
        "column_gathered": (lambda: fnnx.ColumnParallelDense(D, F, gather_input=True, dtype=dtype,
                                                             rngs=nnx.Rngs(0)),
                            lambda: nnx.Linear(D, F, precision=HIGHEST, rngs=nnx.Rngs(0)),
                            (B, S, D), P((data, "tp") if data else "tp"),
                            P(data, None, "tp")),
        "mlp": (lambda: fnnx.ParallelMLP(D, F, collective=collective, dtype=dtype,
                                         rngs=nnx.Rngs(0)),
                lambda: TwinMLP(D, F, rngs=nnx.Rngs(0)),
                (B, S, D), P(rows), P(rows)),
        "attention": (lambda: fnnx.ParallelAttentionOutput(HEADS, HEAD_DIM, D,
                                                           collective=collective, dtype=dtype,
                                                           rngs=nnx.Rngs(0)),
                      lambda: nnx.LinearGeneral((HEADS, HEAD_DIM), D, axis=(-2, -1),
                                                precision=HIGHEST, rngs=nnx.Rngs(0)),
                      (B, S, HEADS, HEAD_DIM), P(data, None, "tp", None), P(rows)),
    }[layer]


def _pure_leaves(state):
    return jax.tree.leaves(nnx.to_pure_dict(state))


def _compare(layer, collective, mesh_name="tp4", dtype=jnp.float32, seed=0):
    """Builds the layer sharded and its twin from the same keys; checks the parameters, then the
    forward and gradients (parameters and input) inside shard_map against the twin in float32 at
    HIGHEST precision (for 16-bit compute: on the 16-bit-rounded values, at that dtype's
    tolerance)."""
    mesh, data = _mesh(mesh_name)
    make, make_twin, shape, x_spec, out_spec = _case(
        layer, collective, data, None if dtype == jnp.float32 else dtype)
    model, twin = fnnx.init_sharded(make, mesh), make_twin()
    graphdef, state = nnx.split(model)
    twin_graphdef, twin_state = nnx.split(twin)
    assert jax.tree.structure(nnx.to_pure_dict(state)) == jax.tree.structure(
        nnx.to_pure_dict(twin_state))
    for a, b in zip(_pure_leaves(state), _pure_leaves(twin_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the twin's draws
    specs = fnnx.partition_specs(state)
    for a, s in zip(jax.tree.leaves(state), jax.tree.leaves(specs)):
        assert a.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, s), a.ndim)

    def tp_apply(state, x):
        return nnx.merge(graphdef, state)(x)

    def twin_apply(state, x):
        return nnx.merge(twin_graphdef, state)(x)

    f = jax.shard_map(tp_apply, mesh=mesh, in_specs=(specs, x_spec), out_specs=out_spec)
    x = jax.random.normal(jax.random.key(seed + 7), shape, jnp.float32).astype(dtype)
    ref_state, ref_x = twin_state, x
    if dtype != jnp.float32:
        ref_state = jax.tree.map(lambda p: p.astype(dtype).astype(jnp.float32), twin_state)
        ref_x = x.astype(jnp.float32)
    y, y_ref = jax.jit(f)(state, x), jax.jit(twin_apply)(ref_state, ref_x)
    assert y.shape == y_ref.shape and y.dtype == dtype
    ct = jax.random.normal(jax.random.key(seed + 1), y.shape, jnp.float32)

    def grads(apply, state, x):
        return jax.jit(jax.grad(lambda s, x: jnp.sum(apply(s, x).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(state, x)

    (g_state, g_x), (w_state, w_x) = grads(f, state, x), grads(twin_apply, ref_state, ref_x)
    pairs = [(y, y_ref), (g_x, w_x)] + list(zip(_pure_leaves(g_state), _pure_leaves(w_state)))
    for a, b in pairs:
        assert a.shape == b.shape
        if dtype == jnp.float32:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        elif np.any(np.asarray(b, np.float32)):  # zero-init biases: exact zeros both sides
            # factor 2: the activation and the cotangents round to 16 bits as well
            assert_close(np.asarray(a, np.float32), np.asarray(b), dtype, factor=2)
    return state, specs, y


CASES = [(layer, c) for layer in ("row", "mlp", "attention") for c in COLLECTIVES] + [
    ("column", None), ("column_gathered", None)]  # ColumnParallelDense has no collective


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("layer, collective", CASES)
def test_layer_matches_twin(layer, collective, mesh_name):
    _compare(layer, collective or "reduce_scatter", mesh_name)


@pytest.mark.parametrize("layer, collective", CASES)
def test_bf16_compute_matches_float32_reference(layer, collective):
    _compare(layer, collective or "reduce_scatter", dtype=jnp.bfloat16)


def test_gathered_input_goes_through_all_gather_matmul(monkeypatch):
    """The sequence-parallel up-projection is one fo_jax.all_gather_matmul call."""
    from fo_jax.flax import _math

    calls = []

    def spy(x, w, **kw):
        calls.append((x.shape, w.shape, kw["axis_name"]))
        return fo_jax.all_gather_matmul(x, w, **kw)

    monkeypatch.setattr(_math, "all_gather_matmul", spy)
    _compare("mlp", "reduce_scatter")
    assert calls and set(calls) == {((B // 4, S, D), (D, F // 4), "tp")}
    calls.clear()
    _compare("mlp", "all_reduce")
    assert calls == []  # replicated input: a local GEMM


def test_parameters_carry_sharding_metadata():
    state, specs, _ = _compare("mlp", "reduce_scatter")
    up, down = state["up"], state["down"]
    assert up["kernel"].get_metadata("out_sharding") == ("embed", "mlp")
    assert down["kernel"].get_metadata("out_sharding") == ("mlp", "embed")
    assert down["bias"].get_metadata("out_sharding") == ("embed",)
    assert nnx.to_pure_dict(nnx.get_partition_spec(state)) == nnx.to_pure_dict(specs) == {
        "up": {"kernel": P(None, "tp"), "bias": P("tp")},
        "down": {"kernel": P("tp", None), "bias": P(None)}}
    assert {s.data.shape for s in up["kernel"][...].addressable_shards} == {(D, F // 4)}
    state, specs, _ = _compare("attention", "all_reduce")
    assert state["kernel"].get_metadata("out_sharding") == ("heads", "kv", "embed")
    assert specs["kernel"].get_value() == P("tp", None, None)


LAYERS = {
    "row": (lambda: fnnx.RowParallelDense(F, D, rngs=nnx.Rngs(0)), (B, S, F)),
    "column": (lambda: fnnx.ColumnParallelDense(D, F, rngs=nnx.Rngs(0)), (B, S, D)),
    "mlp": (lambda: fnnx.ParallelMLP(D, F, rngs=nnx.Rngs(0)), (B, S, D)),
    "attention": (lambda: fnnx.ParallelAttentionOutput(HEADS, HEAD_DIM, D, rngs=nnx.Rngs(0)),
                  (B, S, HEADS, HEAD_DIM)),
}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_outside_shard_map_raises_actionable_error(layer):
    make, shape = LAYERS[layer]
    model = make()  # builds without a mesh: global, unsharded arrays with annotations
    with pytest.raises(ValueError, match=r"fo_jax\.nnx\.\w+: axis name 'tp' is not bound here; "
                                         r"call it inside jax.shard_map"):
        model(jnp.ones(shape, jnp.float32))


def test_whole_parameters_inside_shard_map_raise():
    mesh, _ = _mesh("tp4")
    graphdef, state = nnx.split(fnnx.RowParallelDense(F, D, rngs=nnx.Rngs(0)))
    replicated = jax.tree.map(lambda _: P(), state)
    f = jax.shard_map(lambda s, x: nnx.merge(graphdef, s)(x), mesh=mesh,
                      in_specs=(replicated, P(None, None, "tp")), out_specs=P("tp"))
    with pytest.raises(ValueError, match=r"kernel has 32 entries along dimension 0 inside "
                                         r"shard_map, expected 32 / 4"):
        jax.jit(f)(state, jnp.ones((B, S, F), jnp.float32))


def test_eager_sharding_under_a_set_mesh():
    mesh, _ = _mesh("tp4")
    with jax.set_mesh(mesh):
        model = fnnx.ParallelMLP(D, F, rngs=nnx.Rngs(0))
    twin = TwinMLP(D, F, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    for a, b, s in zip(_pure_leaves(state), _pure_leaves(nnx.state(twin)),
                       jax.tree.leaves(fnnx.partition_specs(state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, s), a.ndim)


# Logical axis rules.

def test_logical_rules_restating_the_layout_are_accepted():
    mesh, _ = _mesh("data2xtp4")
    rules = (("batch", "data"),) + fo_jax.flax.logical_rules("tp")
    make = LAYERS["mlp"][0]
    with nn.logical_axis_rules(rules):
        model = fnnx.init_sharded(make, mesh)
        specs = nnx.get_partition_spec(nnx.state(model))
    assert nnx.to_pure_dict(specs) == nnx.to_pure_dict(
        fnnx.partition_specs(model, rules=rules))
    assert specs["up"]["kernel"].get_value() == P(None, "tp")
    renamed = fnnx.RowParallelDense(F, D, kernel_axes=("hidden", "model"), rngs=nnx.Rngs(0))
    got = fnnx.partition_specs(renamed, rules=(("hidden", "tp"),))
    assert got["kernel"].get_value() == P("tp", None)
    assert renamed.kernel.get_metadata("out_sharding") == ("hidden", "model")


@pytest.mark.parametrize("rules, match", [
    ((("mlp", "data"),), r"map 'mlp' .* to mesh axes 'data', but this layer shards that "
                         r"dimension over its axis_name='tp'"),
    ((("embed", "tp"),), r"map 'embed' .* to mesh axes 'tp', but this layer holds that "
                         r"dimension whole"),
])
def test_rules_that_contradict_the_layout_raise(rules, match):
    mesh, _ = _mesh("data2xtp4")
    make = LAYERS["mlp"][0]
    with pytest.raises(ValueError, match="fo_jax.nnx.ColumnParallelDense: logical axis rules "
                                         + match), nn.logical_axis_rules(rules):
        make()
    with pytest.raises(ValueError, match=match):
        fnnx.init_sharded(make, mesh, rules=rules)
    model = fnnx.init_sharded(make, mesh)
    with pytest.raises(ValueError, match=match):
        fnnx.partition_specs(model, rules=rules)
    graphdef, state = nnx.split(model)
    f = jax.shard_map(lambda s, x: nnx.merge(graphdef, s)(x), mesh=mesh,
                      in_specs=(fnnx.partition_specs(state), P("tp")), out_specs=P("tp"))
    with pytest.raises(ValueError, match=match), nn.logical_axis_rules(rules):
        jax.jit(f)(state, jnp.ones((B, S, D), jnp.float32))


# Memory of init_sharded.

def test_init_sharded_draws_about_one_shard_per_device():
    """Per-device compiled memory of building a [8192, 8192] float32 kernel (256 MiB) on 8
    devices: its 32 MiB shard as output plus threefry's temporaries on CPU (three buffers of one
    shard), at most half the kernel."""
    mesh = cpu_mesh((8,), ("tp",))
    n = 8192
    program, _ = fnnx.init_program(
        lambda: fnnx.RowParallelDense(n, n, use_bias=False, rngs=nnx.Rngs(0)), mesh)
    m = program.lower().compile().memory_analysis()
    shard = n * n * 4 // 8
    assert m.output_size_in_bytes == shard
    assert m.temp_size_in_bytes + m.output_size_in_bytes <= 4 * shard + (1 << 20)


# Training.

class TPModel(nnx.Module):
    def __init__(self, collective, *, rngs):
        self.block1 = fnnx.ParallelMLP(D, F, collective=collective, rngs=rngs)
        self.block2 = fnnx.ParallelMLP(D, F, collective=collective, rngs=rngs)

    def __call__(self, x):
        x = x + self.block1(x)
        return x + self.block2(x)


class TwinModel(nnx.Module):
    def __init__(self, *, rngs):
        self.block1 = TwinMLP(D, F, rngs=rngs)
        self.block2 = TwinMLP(D, F, rngs=rngs)

    def __call__(self, x):
        x = x + self.block1(x)
        return x + self.block2(x)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_optax_training_follows_the_twin(collective):
    """Five adam steps, each a forward, backward and update inside shard_map, against the same
    steps on the unsharded twin: the losses agree step by step and decrease."""
    mesh, _ = _mesh("tp4")
    rows = "tp" if collective == "reduce_scatter" else None
    model = fnnx.init_sharded(lambda: TPModel(collective, rngs=nnx.Rngs(0)), mesh)
    twin = TwinModel(rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    twin_graphdef, twin_state = nnx.split(twin)
    x = jax.random.normal(jax.random.key(1), (B, S, D), jnp.float32)
    target = jax.random.normal(jax.random.key(2), (B, S, D), jnp.float32)
    tx = optax.adam(1e-2)
    specs = fnnx.partition_specs(state)
    opt_state = tx.init(state)
    opt_specs = optax.tree_map_params(tx, lambda _, s: s, opt_state, specs,
                                      transform_non_params=lambda _: P())

    def tp_step(state, opt_state, x, target):
        def loss_fn(state):
            err = nnx.merge(graphdef, state)(x) - target
            local = jnp.sum(err * err)  # this device's rows (all rows for all_reduce)
            return (jax.lax.psum(local, rows) if rows else local) / (B * S * D)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    step = jax.jit(jax.shard_map(tp_step, mesh=mesh,
                                 in_specs=(specs, opt_specs, P(rows), P(rows)),
                                 out_specs=(specs, opt_specs, P())))

    @jax.jit
    def twin_step(state, opt_state, x, target):
        def loss_fn(state):
            return jnp.mean((nnx.merge(twin_graphdef, state)(x) - target) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    twin_opt = tx.init(twin_state)
    losses, twin_losses = [], []
    for _ in range(5):
        state, opt_state, loss = step(state, opt_state, x, target)
        twin_state, twin_opt, twin_loss = twin_step(twin_state, twin_opt, x, target)
        losses.append(float(loss))
        twin_losses.append(float(twin_loss))
    np.testing.assert_allclose(losses, twin_losses, rtol=1e-5)
    assert losses[-1] < 0.9 * losses[0], losses
    for a, b in zip(_pure_leaves(state), _pure_leaves(twin_state)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert {s.data.shape for s in state["block1"]["up"]["kernel"][...].addressable_shards} == {
        (D, F // 4)}
