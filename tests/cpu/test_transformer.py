"""The tensor-parallel transformer layers (fo_jax.flax ParallelSelfAttention and
ParallelTransformerBlock; the nnx twins: tests/cpu/test_transformer_nnx.py) on CPU meshes: init
equal to the unsharded twins' draws, forward and gradients equal to the twins (plain flax:
LayerNorm / RMSNorm, Dense / DenseGeneral, jax.nn.dot_product_attention) in float32 and
bfloat16, the layouts that chain, clear errors; and benchmarks/train_tp_transformer.py run as a
script with a tiny configuration."""

import json
import os
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

MESHES = {"tp4": ((4,), ("tp",), None), "data2xtp4": ((2, 4), ("data", "tp"), "data")}
B, S, D, F = 8, 8, 16, 32  # batch and sequence (each divisible by data * tp), d_model, d_ff
HEADS, HEAD_DIM = 4, 4
HIGHEST = jax.lax.Precision.HIGHEST
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _on_cpu():
    """Eager twins and uncommitted inputs on CPU, the platform of the meshes."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _mesh(name):
    shape, names, data = MESHES[name]
    return cpu_mesh(shape, names), data


def _io_spec(collective, data, sequence_first):
    """Spec of a block's input and output [B, S, D] ([S, B, D] sequence first): the leading axis
    split over tp (sequence parallel) or replicated over it (all_reduce); the batch axis split
    over data."""
    lead = "tp" if collective == "reduce_scatter" else None
    if sequence_first:
        return P(lead, data, None)
    if data and lead:
        return P((data, lead), None, None)
    return P(data or lead, None, None)


def _shape(sequence_first):
    return (S, B, D) if sequence_first else (B, S, D)


def _twin_attend(qkv, causal, sequence_first):
    """The plain computation the twins share: split the fused [..., heads * 3 * head_dim]
    projection into q, k, v and attend."""
    qkv = qkv.reshape(*qkv.shape[:-1], HEADS, 3, HEAD_DIM)
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    if sequence_first:
        q, k, v = (jnp.swapaxes(a, 0, 1) for a in (q, k, v))
    o = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    return jnp.swapaxes(o, 0, 1) if sequence_first else o


# --- linen ------------------------------------------------------------------------------------

class TwinAttention(nn.Module):
    causal: bool = False
    sequence_first: bool = False

    @nn.compact
    def __call__(self, x):
        qkv = nn.Dense(HEADS * 3 * HEAD_DIM, precision=HIGHEST, name="qkv")(x)
        o = _twin_attend(qkv, self.causal, self.sequence_first)
        return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), precision=HIGHEST, name="out")(o)


class TwinMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(F, precision=HIGHEST, name="up")(x))
        return nn.Dense(x.shape[-1], precision=HIGHEST, name="down")(h)


class TwinBlock(nn.Module):
    """The unsharded twin of fx.ParallelTransformerBlock (same names, shapes and math)."""

    causal: bool = False
    sequence_first: bool = False
    norm: str = "layernorm"

    @nn.compact
    def __call__(self, x):
        norm = nn.RMSNorm if self.norm == "rmsnorm" else nn.LayerNorm
        x = x + TwinAttention(self.causal, self.sequence_first, name="attention")(
            norm(name="ln1")(x))
        return x + TwinMLP(name="mlp")(norm(name="ln2")(x))


def _assert_close_all(pairs, dtype):
    for a, b in pairs:
        assert a.shape == b.shape
        if dtype == jnp.float32:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        elif np.any(np.asarray(b, np.float32)):  # zero-init biases: exact zeros both sides
            # factor 2: activations, attention and cotangents round to 16 bits as well
            assert_close(np.asarray(a, np.float32), np.asarray(b), dtype, factor=2)


def _grads(apply, params, x, ct):
    return jax.jit(jax.grad(lambda p, x: jnp.sum(apply(p, x).astype(jnp.float32) * ct),
                            argnums=(0, 1)))(params, x)


def _compare_linen(tp_module, twin, x, io_spec, mesh, dtype=jnp.float32, check_vma=True):
    """Init from one key (bitwise the twin's draws), then forward and gradients (parameters and
    input) against the twin in float32 at HIGHEST precision on CPU; for 16-bit compute the twin
    holds the 16-bit-rounded parameters and input and the comparison uses the dtype's
    tolerance."""
    key = jax.random.key(0)
    variables = fx.init_sharded(tp_module, mesh, key, x, in_specs=(io_spec,),
                                check_vma=check_vma)
    params = nn.unbox(variables)
    want = twin.init(key, x)
    assert jax.tree.structure(params) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    f = jax.shard_map(tp_module.apply, mesh=mesh, in_specs=(fx.partition_specs(variables),
                                                            io_spec),
                      out_specs=io_spec, check_vma=check_vma)
    y = jax.jit(f)(params, x)
    ref_params, ref_x = params, x
    if dtype != jnp.float32:
        ref_params = jax.tree.map(lambda p: p.astype(dtype).astype(jnp.float32), params)
        ref_x = x.astype(jnp.float32)
    y_ref = jax.jit(twin.apply)(ref_params, ref_x)
    assert y.shape == y_ref.shape == x.shape and y.dtype == dtype
    ct = jax.random.normal(jax.random.key(1), y.shape, jnp.float32)
    got, ref = _grads(f, params, x, ct), _grads(twin.apply, ref_params, ref_x, ct)
    _assert_close_all([(y, y_ref)] + list(zip(jax.tree.leaves(got), jax.tree.leaves(ref))),
                      dtype)
    return variables, y


LINEN_CASES = {  # name: (mesh, collective, sequence_first, causal, norm)
    "tp4": ("tp4", "reduce_scatter", False, True, "layernorm"),
    "data2xtp4": ("data2xtp4", "reduce_scatter", False, False, "layernorm"),
    "sequence_first": ("data2xtp4", "reduce_scatter", True, True, "layernorm"),
    "rmsnorm": ("tp4", "reduce_scatter", True, False, "rmsnorm"),
    "all_reduce": ("data2xtp4", "all_reduce", False, True, "layernorm"),
    "all_reduce_sequence_first": ("tp4", "all_reduce", True, False, "rmsnorm"),
}


@pytest.mark.parametrize("case", list(LINEN_CASES))
def test_linen_block_matches_twin(case):
    mesh_name, collective, seq_first, causal, norm = LINEN_CASES[case]
    mesh, data = _mesh(mesh_name)
    x = jax.random.normal(jax.random.key(7), _shape(seq_first), jnp.float32)
    spec = _io_spec(collective, data, seq_first)
    block = fx.ParallelTransformerBlock(HEADS, F, collective=collective, causal=causal,
                                        sequence_first=seq_first, norm=norm)
    variables, y = _compare_linen(block, TwinBlock(causal, seq_first, norm), x, spec, mesh)
    specs = fx.partition_specs(variables)["params"]
    assert specs["attention"] == {"qkv": {"kernel": P(None, "tp"), "bias": P("tp")},
                                  "out": {"kernel": P("tp", None, None), "bias": P(None)}}
    assert specs["ln1"]["scale"] == P(None)
    logical = nn.get_partition_spec(variables)["params"]
    assert logical["attention"]["qkv"]["kernel"] == P("embed", "heads")
    assert logical["ln2"]["scale"] == P("embed")
    qkv = nn.unbox(variables)["params"]["attention"]["qkv"]["kernel"]
    assert {s.data.shape for s in qkv.addressable_shards} == {(D, 3 * HEADS * HEAD_DIM // 4)}
    rows = 4 * (2 if data and not seq_first else 1) if collective == "reduce_scatter" else (
        2 if data and not seq_first else 1)
    assert {s.data.shape[0] for s in y.addressable_shards} == {x.shape[0] // rows}


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_linen_attention_matches_twin(collective):
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(8), (B, S, D), jnp.float32)
    _compare_linen(fx.ParallelSelfAttention(HEADS, collective=collective, causal=True),
                   TwinAttention(causal=True), x, _io_spec(collective, None, False), mesh)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_linen_block_bf16_matches_float32_twin(collective):
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(9), (B, S, D), jnp.float32).astype(jnp.bfloat16)
    block = fx.ParallelTransformerBlock(HEADS, F, collective=collective, causal=True,
                                        dtype=jnp.bfloat16)
    _compare_linen(block, TwinBlock(causal=True), x, _io_spec(collective, None, False), mesh,
                   dtype=jnp.bfloat16)


def test_linen_block_without_vma_checks():
    mesh, data = _mesh("data2xtp4")
    x = jax.random.normal(jax.random.key(10), (S, B, D), jnp.float32)
    block = fx.ParallelTransformerBlock(HEADS, F, causal=True, sequence_first=True)
    _compare_linen(block, TwinBlock(True, True), x, _io_spec("reduce_scatter", data, True),
                   mesh, check_vma=False)


class _Stack(nn.Module):
    """Two blocks chained (the output layout is the next block's input layout)."""

    tp: bool

    @nn.compact
    def __call__(self, x):
        for i in range(2):
            if self.tp:
                x = fx.ParallelTransformerBlock(HEADS, F, causal=True, name=f"block{i}")(x)
            else:
                x = TwinBlock(causal=True, name=f"block{i}")(x)
        return x


def test_linen_blocks_chain():
    mesh, _ = _mesh("tp4")
    x = jax.random.normal(jax.random.key(11), (B, S, D), jnp.float32)
    _compare_linen(_Stack(True), _Stack(False), x, P("tp"), mesh)


def test_the_gathers_go_through_all_gather_matmul(monkeypatch):
    """Sequence parallel, both column-parallel GEMMs (QKV and MLP up) are all_gather_matmul
    calls on this device's rows."""
    from fo_jax.flax import _math

    calls = []

    def spy(x, w, **kw):
        calls.append((x.shape, w.shape))
        return fo_jax.all_gather_matmul(x, w, **kw)

    monkeypatch.setattr(_math, "all_gather_matmul", spy)
    mesh, _ = _mesh("tp4")
    x = jnp.ones((B, S, D), jnp.float32)
    fx.init_sharded(fx.ParallelTransformerBlock(HEADS, F), mesh, jax.random.key(0), x,
                    in_specs=(P("tp"),))
    # init_sharded traces the module twice (shapes, then the program): each trace makes both
    assert calls[:2] == [((B // 4, S, D), (D, 3 * HEADS * HEAD_DIM // 4)),
                         ((B // 4, S, D), (D, F // 4))]
    assert set(calls) == set(calls[:2])


@pytest.mark.parametrize("module, shape, match", [
    (fx.ParallelTransformerBlock(6, F, head_dim=4), (B, S, D), r"num_heads=6 is not divisible "
                                                                r"by the size of axis 'tp' \(4\)"),
    (fx.ParallelTransformerBlock(HEADS, F), (B * S, D), r"input must be \[batch, seq, d_model\]"),
    (fx.ParallelTransformerBlock(HEADS, F, norm="batchnorm"), (B, S, D), r"unknown norm"),
    (fx.ParallelSelfAttention(3), (B, S, D), r"d_model=16 is not divisible by num_heads=3"),
])
def test_linen_bad_configurations_raise(module, shape, match):
    mesh, _ = _mesh("tp4")
    with pytest.raises(ValueError, match=match):
        fx.init_sharded(module, mesh, jax.random.key(0), jnp.ones(shape, jnp.float32),
                        in_specs=(P("tp"),))


def test_outside_shard_map_raises_actionable_error():
    with pytest.raises(ValueError, match=r"ParallelTransformerBlock: axis name 'tp' is not bound"):
        fx.ParallelTransformerBlock(HEADS, F).init(jax.random.key(0), jnp.ones((B, S, D)))


def test_rules_that_contradict_the_norm_layout_raise():
    mesh, _ = _mesh("data2xtp4")
    x = jnp.ones((B, S, D), jnp.float32)
    with pytest.raises(ValueError, match=r"map 'embed' .* to mesh axes 'data', but this layer "
                                         r"holds that dimension whole"):
        fx.init_sharded(fx.ParallelTransformerBlock(HEADS, F), mesh, jax.random.key(0), x,
                        in_specs=(P(("data", "tp")),), rules=(("embed", "data"),))


# --- benchmarks/train_tp_transformer.py --------------------------------------------------------

def test_training_script_runs_and_writes_rows(tmp_path):
    """The script on 4 host CPU devices with a tiny model: both methods train, their losses
    agree step by step, and every row carries the documented fields."""
    out = tmp_path / "rows.jsonl"
    # The fo_jax this test process imported (installed, or the source tree), not another one.
    where = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "train_tp_transformer.py"),
           "--steps", "3", "--layers", "2", "--d-model", "32", "--heads", "4", "--d-ff", "64",
           "--seq", "16", "--batch", "2", "--out", str(out), "--profile",
           str(tmp_path / "trace")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "NOT GPU MEASUREMENTS" in p.stdout, p.stdout
    assert "step-time ratio" in p.stdout, p.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["method"] for r in rows} == {"fo_jax", "jax.baseline"}
    assert sorted(r["step"] for r in rows if r["method"] == "fo_jax") == [0, 1, 2]
    fields = {"suite", "method", "step", "loss", "step_ms", "device", "num_devices", "date",
              "commit", "dtype", "param_dtype", "d_model", "layers", "heads", "d_ff", "seq",
              "batch", "tp", "platform"}
    for r in rows:
        assert fields <= set(r), sorted(fields - set(r))
        assert r["suite"] == "train_tp_transformer" and r["num_devices"] == r["tp"] == 4
        # The same commit (a source tree's "+dirty" mark may differ between the two processes'
        # reads of `git status` while files change).
        commit = fo_jax.build_info()["commit"].split("+")[0]
        assert r["commit"].split("+")[0] == commit and r["platform"] == "cpu"
        assert (r["d_model"], r["layers"], r["seq"], r["batch"]) == (32, 2, 16, 2)
        assert np.isfinite(r["loss"]) and r["step_ms"] > 0
    by = {(r["method"], r["step"]): r["loss"] for r in rows}
    for step in range(3):
        np.testing.assert_allclose(by[("fo_jax", step)], by[("jax.baseline", step)], rtol=3e-2)
    assert any(files for _, _, files in os.walk(tmp_path / "trace"))



def test_block_training_step_lowers_for_cuda():
    """At the training benchmark's sizes (d_model 4096, d_ff 16384, 8192 rows) the block's
    training gradient lowers for the "cuda" platform from CPU devices with fo_jax's custom call
    for each reduce-scatter GEMM: attention out and MLP down forward (allow_fallback=False:
    attention out alone is estimated too small to gain), and the QKV and MLP-up input gradients
    backward. Abstract parameters: nothing runs."""
    if not fo_jax.cuda_module_available():
        pytest.skip("CUDA module not built here (no nvcc at install time)")
    mesh, _ = _mesh("tp4")
    block = fx.ParallelTransformerBlock(32, 16384, causal=True, sequence_first=True,
                                        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                        config=fo_jax.OverlapConfig(allow_fallback=False))
    x = jax.ShapeDtypeStruct((8192, 1, 4096), jnp.bfloat16)  # [seq, batch, d_model]
    key = jax.random.key(0)
    program, finish = fx.init_program(block, mesh, key, x, in_specs=(P("tp"),))
    variables = finish(jax.eval_shape(program, key, x))
    f = jax.shard_map(block.apply, mesh=mesh, in_specs=(fx.partition_specs(variables), P("tp")),
                      out_specs=P("tp"))
    grad = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.square(f(p, x).astype(jnp.float32)))))
    text = grad.trace(nn.unbox(variables), x).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call @fo_jax_overlapped_matmul_v2") >= 4
