"""fo_jax.flax (linen) tensor-parallel layers on CPU devices: init equal to the unsharded twins'
draws, forward and gradients equal to the twins holding the same (gathered) parameters, logical
axis names and rules, the error outside shard_map, and the per-device memory of init_sharded."""

import subprocess
import sys

import pytest

pytest.importorskip("flax", minversion="0.12",
                    reason="fo_jax.flax needs flax 0.12 or later")

import flax.linen as nn  # noqa: E402
import jax
import jax.numpy as jnp
import numpy as np
from conftest import cpu_mesh
from jax.sharding import PartitionSpec as P
from numerics import assert_close

import fo_jax
import fo_jax.flax as fx
from fo_jax.flax import (
    ColumnParallelDense,
    ParallelAttentionOutput,
    ParallelMLP,
    RowParallelDense,
    init_program,
    init_sharded,
    partition_specs,
)

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


class DenseMLP(nn.Module):
    """The unsharded twin of ParallelMLP (same parameter names and shapes, gathered)."""

    hidden: int
    dtype: object = None

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(self.hidden, dtype=self.dtype, precision=HIGHEST, name="up")(x))
        return nn.Dense(x.shape[-1], dtype=self.dtype, precision=HIGHEST, name="down")(h)


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


def _assert_init_equal(params, dense_params):
    assert jax.tree.structure(params) == jax.tree.structure(dense_params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(dense_params)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same draws as unsharded


def _compare(tp_module, dense_module, x, x_spec, out_spec, mesh, seed=0, check_vma=True,
             dtype=jnp.float32):
    """Init both models from one key; check init, forward and gradients (params and input).

    The reference is the twin in float32 at HIGHEST precision on CPU; for 16-bit compute it
    holds the same 16-bit-rounded parameters and input, and the comparison uses the dtype's
    tolerance (tests/numerics.py)."""
    key = jax.random.key(seed)
    variables = init_sharded(tp_module, mesh, key, x, in_specs=(x_spec,), check_vma=check_vma)
    params = nn.unbox(variables)
    _assert_init_equal(params, dense_module.init(key, x))

    tp_apply = jax.shard_map(tp_module.apply, mesh=mesh,
                             in_specs=(partition_specs(variables), x_spec), out_specs=out_spec,
                             check_vma=check_vma)
    y = jax.jit(tp_apply)(params, x)
    ref_params, ref_x = params, x
    if dtype != jnp.float32:  # reference: the 16-bit-rounded values in float32
        ref_params = jax.tree.map(lambda p: p.astype(dtype).astype(jnp.float32), params)
        ref_x = x.astype(jnp.float32)
    y_ref = jax.jit(dense_module.apply)(ref_params, ref_x)
    assert y.shape == y_ref.shape and y.dtype == dtype

    ct = jax.random.normal(jax.random.key(seed + 1), y.shape, jnp.float32)

    def grads(apply, p, x):
        return jax.jit(jax.grad(lambda p, x: jnp.sum(apply(p, x).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(p, x)

    got, want = grads(tp_apply, params, x), grads(dense_module.apply, ref_params, ref_x)
    pairs = [(y, y_ref)] + list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    for a, b in pairs:
        assert a.shape == b.shape
        if dtype == jnp.float32:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        elif np.any(np.asarray(b, np.float32)):  # zero-init biases: exact zeros both sides
            # factor 2: the activation and the cotangents round to 16 bits as well
            assert_close(np.asarray(a, np.float32), np.asarray(b), dtype, factor=2)
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
    assert nn.get_partition_spec(variables)["params"] == {  # logical names
        "up": {"kernel": P("embed", "mlp"), "bias": P("mlp")},
        "down": {"kernel": P("mlp", "embed"), "bias": P("embed")}}
    assert partition_specs(variables)["params"] == {  # the mesh layout
        "up": {"kernel": P(None, "tp"), "bias": P("tp")},
        "down": {"kernel": P("tp", None), "bias": P(None)}}
    assert nn.unbox(up)["kernel"].shape == (D, F) and nn.unbox(down)["kernel"].shape == (F, D)
    for a, sharding in zip(jax.tree.leaves(nn.unbox(variables)),
                           jax.tree.leaves(nn.get_sharding(variables, mesh))):
        assert a.sharding.is_equivalent_to(sharding, a.ndim)  # usable as jit shardings too
    local = {s.data.shape for s in nn.unbox(up)["kernel"].addressable_shards}
    assert local == {(D, F // 4)}
    local = {s.data.shape for s in nn.unbox(down)["kernel"].addressable_shards}
    assert local == {(F // 4, D)}
    shards = (2 if data else 1) * (4 if collective == "reduce_scatter" else 1)
    assert y.shape == (B, S, D)
    assert {s.data.shape for s in y.addressable_shards} == {(B // shards, S, D)}


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
    variables, _ = _compare(RowParallelDense(D, collective=collective),
                            nn.Dense(D, precision=HIGHEST), x, x_spec, out_spec, mesh)
    assert partition_specs(variables)["params"] == {"kernel": P("tp", None), "bias": P(None)}


@pytest.mark.parametrize("gather_input", [False, True])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_column_parallel_dense_matches_dense(mesh_name, use_bias, gather_input):
    """gather_input=True: the input is this device's rows (sequence-parallel layout), gathered
    into the GEMM; the output holds every row of the device's (data) group, its own columns."""
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(9), (B, S, D), jnp.float32)
    rows = ((data, "tp") if data else "tp") if gather_input else data
    variables, _ = _compare(ColumnParallelDense(F, gather_input=gather_input, use_bias=use_bias),
                            nn.Dense(F, use_bias=use_bias, precision=HIGHEST), x, P(rows),
                            P(data, None, "tp"), mesh)
    want = {"kernel": P(None, "tp"), "bias": P("tp")} if use_bias else {"kernel": P(None, "tp")}
    assert partition_specs(variables)["params"] == want


def test_gathered_input_goes_through_all_gather_matmul(monkeypatch):
    """The sequence-parallel up-projection is one fo_jax.all_gather_matmul call (its backward
    pairs the gather with fo_jax's GEMM + reduce-scatter), not all_gather then dot."""
    from fo_jax.flax import _math

    calls = []

    def spy(x, w, **kw):
        calls.append((x.shape, w.shape, kw["axis_name"]))
        return fo_jax.all_gather_matmul(x, w, **kw)

    monkeypatch.setattr(_math, "all_gather_matmul", spy)
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(3), (B, S, D), jnp.float32)
    variables = init_sharded(ParallelMLP(F), mesh, jax.random.key(0), x, in_specs=(P("tp"),))
    calls.clear()
    f = jax.shard_map(ParallelMLP(F).apply, mesh=mesh,
                      in_specs=(partition_specs(variables), P("tp")), out_specs=P("tp"))
    jax.jit(jax.grad(lambda p, x: jnp.sum(f(p, x)))).lower(nn.unbox(variables), x)
    assert calls == [((B // 4, S, D), (D, F // 4), "tp")]
    calls.clear()
    init_sharded(ParallelMLP(F, collective="all_reduce"), mesh, jax.random.key(0), x,
                 in_specs=(P(),))
    assert calls == []  # replicated input: a local GEMM


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_attention_output_matches_dense_general(mesh_name, collective):
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(10), (B, S, HEADS, HEAD_DIM), jnp.float32)
    x_spec = P(data, None, "tp", None)  # heads sharded
    _, out_spec = _io_specs(collective, data, 3)
    variables, y = _compare(ParallelAttentionOutput(D, collective=collective),
                            nn.DenseGeneral(D, axis=(-2, -1), precision=HIGHEST), x, x_spec,
                            out_spec, mesh)
    assert y.shape == (B, S, D)
    assert nn.get_partition_spec(variables)["params"]["kernel"] == P("heads", "kv", "embed")
    assert partition_specs(variables)["params"]["kernel"] == P("tp", None, None)
    assert nn.unbox(variables)["params"]["kernel"].shape == (HEADS, HEAD_DIM, D)


def _bf16_cases(collective):
    rs = collective == "reduce_scatter"
    collective = collective or "reduce_scatter"
    bf = jnp.bfloat16
    return {
        "mlp": (ParallelMLP(F, collective=collective, dtype=bf), DenseMLP(F), (B, S, D),
                P("tp") if rs else P()),
        "row": (RowParallelDense(D, collective=collective, dtype=bf),
                nn.Dense(D, precision=HIGHEST), (B, S, F), P(None, None, "tp")),
        "column": (ColumnParallelDense(F, dtype=bf), nn.Dense(F, precision=HIGHEST), (B, S, D),
                   P()),
        "attention": (ParallelAttentionOutput(D, collective=collective, dtype=bf),
                      nn.DenseGeneral(D, axis=(-2, -1), precision=HIGHEST),
                      (B, S, HEADS, HEAD_DIM), P(None, None, "tp", None)),
    }


BF16_CASES = [(layer, c) for layer in ("mlp", "row", "attention") for c in COLLECTIVES] + [
    ("column", None)]  # ColumnParallelDense has no collective


@pytest.mark.parametrize("layer, collective", BF16_CASES)
def test_bf16_compute_matches_float32_reference(layer, collective):
    mesh, _ = _mesh("tp4")
    tp, dense, shape, x_spec = _bf16_cases(collective)[layer]
    x = jax.random.normal(jax.random.key(11), shape, jnp.float32).astype(jnp.bfloat16)
    if layer == "column":
        out_spec = P(None, None, "tp")
    else:
        out_spec = P("tp") if collective == "reduce_scatter" else P()
    variables, _ = _compare(tp, dense, x, x_spec, out_spec, mesh, dtype=jnp.bfloat16)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(variables)))


def test_raw_uint32_keys_give_the_same_draws():
    mesh, _ = _mesh("tp4")
    x = jnp.ones((B, S, D), jnp.float32)
    key = jax.random.PRNGKey(3)
    variables = init_sharded(ParallelMLP(F), mesh, key, x, in_specs=(P("tp"),))
    _assert_init_equal(nn.unbox(variables), DenseMLP(F).init(key, x))


def test_boxed_variables_apply_directly():
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(4), (B, S, D), jnp.float32)
    module = ParallelMLP(F)
    variables = init_sharded(module, mesh, jax.random.key(0), x, in_specs=(P("tp"),))
    f = jax.shard_map(module.apply, mesh=mesh, in_specs=(partition_specs(variables), P("tp")),
                      out_specs=P("tp"))
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(variables, x)),
                                  np.asarray(jax.jit(f)(nn.unbox(variables), x)))


class _ScannedBlocks(nn.Module):
    """Two residual blocks under nn.scan (stacked parameters, leading logical axis "layers")
    and one under nn.remat; `tp` picks fo_jax's ParallelMLP or its twin."""

    tp: bool

    @nn.compact
    def __call__(self, x):
        mlp = ParallelMLP if self.tp else DenseMLP

        class Body(nn.Module):
            @nn.compact
            def __call__(self, c, _):
                return c + mlp(F, name="mlp")(c), None

        x, _ = nn.scan(Body, variable_axes={"params": 0}, split_rngs={"params": True}, length=2,
                       metadata_params={nn.PARTITION_NAME: "layers"})(name="scan")(x, None)
        return x + nn.remat(mlp)(F, name="remat")(x)


def test_layers_under_scan_and_remat():
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(13), (B, S, D), jnp.float32)
    variables, _ = _compare(_ScannedBlocks(tp=True), _ScannedBlocks(tp=False), x, P("tp"),
                            P("tp"), mesh)
    specs = partition_specs(variables)["params"]
    assert specs["scan"]["mlp"]["up"]["kernel"] == P(None, None, "tp")
    assert specs["remat"]["down"]["kernel"] == P("tp", None)
    logical = nn.get_partition_spec(variables)["params"]["scan"]["mlp"]["up"]["kernel"]
    assert logical == P("layers", "embed", "mlp")


LAYERS = {
    "row": (lambda: RowParallelDense(D), (B, S, F)),
    "column": (lambda: ColumnParallelDense(F), (B, S, D)),
    "mlp": (lambda: ParallelMLP(F), (B, S, D)),
    "attention": (lambda: ParallelAttentionOutput(D), (B, S, HEADS, HEAD_DIM)),
}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_outside_shard_map_raises_actionable_error(layer):
    make, shape = LAYERS[layer]
    x = jnp.ones(shape, jnp.float32)
    with pytest.raises(ValueError, match=r"axis name 'tp' is not bound here; call it inside "
                                         r"jax.shard_map"):
        make().init(jax.random.key(0), x)
    mesh, _ = _mesh("tp4")  # a mesh without the layer's axis name: the same message
    other = jax.sharding.Mesh(mesh.devices, ("model",))
    with pytest.raises(ValueError, match="axis name 'tp' is not bound"):
        init_sharded(make(), other, jax.random.key(0), x, in_specs=(P(),))


def test_reduce_scatter_needs_divisible_leading_axis():
    mesh, _ = _mesh("tp4")
    x = jnp.ones((2, 4, F), jnp.float32)  # leading axis 2 cannot be scattered over 4 devices
    with pytest.raises(ValueError, match="leading axis"):
        init_sharded(RowParallelDense(D), mesh, jax.random.key(0), x,
                     in_specs=(P(None, None, "tp"),))


# Logical axis names and rules.

def test_logical_rules_map_the_logical_names_to_the_mesh():
    mesh, _ = _mesh("data2xtp4")
    x = jax.random.normal(jax.random.key(5), (B, S, D), jnp.float32)
    module = ParallelMLP(F)
    rules = (("batch", "data"),) + fx.logical_rules("tp")
    variables = init_sharded(module, mesh, jax.random.key(0), x, in_specs=(P(("data", "tp")),),
                             rules=rules)
    with nn.logical_axis_rules(rules):
        specs = nn.logical_to_mesh(nn.get_partition_spec(variables))
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh)
        assert specs == partition_specs(variables)
        x_spec = nn.logical_to_mesh_axes(("batch", None, None))
    assert x_spec == P("data", None, None)
    for a, s in zip(jax.tree.leaves(nn.unbox(variables)), jax.tree.leaves(shardings)):
        assert a.sharding.is_equivalent_to(s, a.ndim)
    with nn.logical_axis_rules(rules):  # the layers run under the same rules
        f = jax.shard_map(module.apply, mesh=mesh, in_specs=(specs, P(("data", "tp"))),
                          out_specs=P(("data", "tp")))
        y = jax.jit(f)(nn.unbox(variables), x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(DenseMLP(F).apply(nn.unbox(variables),
                                                                            x)),
                               rtol=1e-5, atol=1e-5)


def test_kernel_axes_rename_the_logical_names():
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(6), (B, S, F), jnp.float32)
    module = RowParallelDense(D, kernel_axes=("hidden", "model"))
    variables = init_sharded(module, mesh, jax.random.key(0), x, in_specs=(P(None, None, "tp"),))
    assert nn.get_partition_spec(variables)["params"] == {"kernel": P("hidden", "model"),
                                                          "bias": P("model")}
    assert partition_specs(variables)["params"] == {"kernel": P("tp", None), "bias": P(None)}
    with nn.logical_axis_rules((("hidden", "tp"), ("model", None))):
        assert partition_specs(variables)["params"]["kernel"] == P("tp", None)
    with pytest.raises(ValueError, match=r"kernel_axes\[0\] names the dimension this layer "
                                         r"shards"):
        init_sharded(RowParallelDense(D, kernel_axes=(None, "embed")), mesh, jax.random.key(0),
                     x, in_specs=(P(None, None, "tp"),))


@pytest.mark.parametrize("rules, match", [
    ((("mlp", "data"),), r"map 'mlp' .* to mesh axes 'data', but this layer shards that "
                         r"dimension over its axis_name='tp'"),
    ((("embed", "tp"),), r"map 'embed' .* to mesh axes 'tp', but this layer holds that "
                         r"dimension whole"),
    ((("embed", "data"), ("mlp", "tp")), r"map 'embed' .* to mesh axes 'data'"),
])
def test_rules_that_contradict_the_layout_raise(rules, match):
    mesh, _ = _mesh("data2xtp4")
    x = jnp.ones((B, S, D), jnp.float32)
    module = ParallelMLP(F)
    with pytest.raises(ValueError, match="fo_jax.flax.ColumnParallelDense: logical axis rules "
                                         + match):
        init_sharded(module, mesh, jax.random.key(0), x, in_specs=(P("tp"),), rules=rules)
    variables = init_sharded(module, mesh, jax.random.key(0), x, in_specs=(P("tp"),))
    with pytest.raises(ValueError, match=match):
        partition_specs(variables, rules=rules)
    with pytest.raises(ValueError, match=match), nn.logical_axis_rules(rules):
        nn.get_sharding(variables, mesh)
    specs = partition_specs(variables)
    f = jax.shard_map(module.apply, mesh=mesh, in_specs=(specs, P("tp")), out_specs=P("tp"))
    with pytest.raises(ValueError, match=match), nn.logical_axis_rules(rules):
        jax.jit(f)(nn.unbox(variables), x)


# Memory of init_sharded.

def _compiled_bytes(program, *args):
    m = program.lower(*args).compile().memory_analysis()
    return m.temp_size_in_bytes + m.output_size_in_bytes


@pytest.mark.parametrize("layer", ["row", "column", "attention"])
def test_init_sharded_draws_about_one_shard_per_device(layer):
    """Per-device compiled memory (temporaries + outputs) of init_sharded for a [8192, 8192]
    float32 kernel (256 MiB) on 8 devices: the 32 MiB shard plus threefry's temporaries on CPU
    (its two uint32 state words and the drawn bits, one shard each), i.e. at most half the
    kernel; drawing the whole kernel on every device and slicing it (module.init inside
    shard_map) needs more than the whole kernel."""
    mesh = cpu_mesh((8,), ("tp",))
    n = 8192
    module, x, spec = {
        "row": (RowParallelDense(n, collective="all_reduce", use_bias=False),
                jnp.zeros((8, n)), P(None, "tp")),
        "column": (ColumnParallelDense(n, use_bias=False), jnp.zeros((8, n)), P()),
        "attention": (ParallelAttentionOutput(n, collective="all_reduce", use_bias=False),
                      jnp.zeros((8, 64, n // 64)), P(None, "tp", None)),
    }[layer]
    key = jax.random.key(0)
    kernel = n * n * 4
    shard = kernel // 8
    program, finish = init_program(module, mesh, key, x, in_specs=(spec,))
    lean = _compiled_bytes(program, key, x)
    assert lean <= 4 * shard + (1 << 20), f"{lean / shard:.2f} shards per device"
    specs = partition_specs(finish(jax.eval_shape(program, key, x)))
    whole = jax.jit(jax.shard_map(module.init, mesh=mesh, in_specs=(P(), spec), out_specs=specs))
    assert _compiled_bytes(whole, key, x) > kernel


def test_init_sharded_values_and_shardings_at_a_larger_size():
    mesh, _ = _mesh("tp4")
    x = jnp.zeros((4, 512), jnp.float32)
    key = jax.random.key(2)
    variables = init_sharded(ColumnParallelDense(1024), mesh, key, x, in_specs=(P(),))
    _assert_init_equal(nn.unbox(variables), nn.Dense(1024).init(key, x))
    kernel = nn.unbox(variables)["params"]["kernel"]
    assert {s.data.shape for s in kernel.addressable_shards} == {(512, 256)}


@pytest.mark.parametrize("partitionable", [True, False])
@pytest.mark.parametrize("init, param_dtype", [
    (nn.initializers.lecun_normal(), jnp.float32), (nn.initializers.uniform(), jnp.float32),
    (nn.initializers.orthogonal(), jnp.float32), (nn.initializers.lecun_normal(), jnp.bfloat16)])
def test_init_sharded_draws_equal_the_twin(init, param_dtype, partitionable):
    """Bitwise equal to nn.Dense's draws whatever the initializer, parameter dtype and threefry
    flavour (the flag changes the draws of both alike)."""
    mesh, _ = _mesh("tp4")
    x = jnp.zeros((4, 64), jnp.float32)
    key = jax.random.key(5)
    with jax.threefry_partitionable(partitionable):
        for tp, spec in ((ColumnParallelDense(128, kernel_init=init, param_dtype=param_dtype), P()),
                         (RowParallelDense(128, collective="all_reduce", kernel_init=init,
                                           param_dtype=param_dtype), P(None, "tp"))):
            variables = init_sharded(tp, mesh, key, x, in_specs=(spec,))
            twin = nn.Dense(128, kernel_init=init, param_dtype=param_dtype).init(key, x)
            _assert_init_equal(nn.unbox(variables), twin)


def test_import_fo_jax_does_not_import_flax():
    code = ("import sys, fo_jax; assert not {'flax', 'fo_jax.flax', 'fo_jax.nnx'} & "
            "set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
