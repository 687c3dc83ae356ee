"""fo_jax's ops as JAX ops on one GPU, through the CUDA kernels: x[..., K], jax.grad of matmul
(forward and backward GEMMs on fo_jax's kernel), jax.vmap over x and over w, lax.scan with
jax.checkpoint, and overlapped_matmul over an axis of size 1 (fo_jax's GEMM alone), each against
a float64 NumPy reference. tests/cpu/test_jax_transforms.py checks the same on CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import gpu_devices_or_skip
from numerics import assert_close

pytestmark = pytest.mark.gpu


def _gpu():
    (dev,) = gpu_devices_or_skip(1)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    return dev


def _rand(rng, shape, dev, scale=1.0, dtype=jnp.bfloat16):
    a = jnp.asarray(rng.standard_normal(shape) * scale, dtype)
    return jax.device_put(a, dev), np.asarray(a, np.float64)


def test_matmul_leading_dims_and_custom_call():
    dev = _gpu()
    rng = np.random.default_rng(0)
    x, x64 = _rand(rng, (4, 256, 512), dev, scale=512 ** -0.5)
    w, w64 = _rand(rng, (512, 384), dev)
    f = jax.jit(fo_jax.matmul)
    assert "fo_jax_gemm" in f.lower(x, w).as_text()
    out = f(x, w)
    assert out.shape == (4, 256, 384) and out.dtype == jnp.bfloat16
    assert_close(out.reshape(-1, 384), (x64 @ w64).reshape(-1, 384), jnp.bfloat16)


def test_matmul_grad_runs_fo_jax_gemms():
    dev = _gpu()
    rng = np.random.default_rng(1)
    x, x64 = _rand(rng, (512, 256), dev, scale=256 ** -0.5)
    w, w64 = _rand(rng, (256, 384), dev)
    g, g64 = _rand(rng, (512, 384), dev)

    def loss(x, w):
        return jnp.sum((fo_jax.matmul(x, w) * g).astype(jnp.float32))

    # value_and_grad: the loss needs the forward GEMM (grad alone never uses it: it is linear).
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    text = f.lower(x, w).as_text()
    assert text.count("fo_jax_gemm_v2") == 3, "forward and both backward GEMMs on fo_jax's kernel"
    _, (dx, dw) = f(x, w)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
    assert_close(dx, g64 @ w64.T, jnp.bfloat16)
    assert_close(dw, x64.T @ g64, jnp.bfloat16)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)])
def test_matmul_vmap(in_axes):
    dev = _gpu()
    rng = np.random.default_rng(2)
    b = 3
    x, x64 = _rand(rng, (b, 256, 512) if in_axes[0] == 0 else (256, 512), dev,
                   scale=512 ** -0.5)
    w, w64 = _rand(rng, (b, 512, 256) if in_axes[1] == 0 else (512, 256), dev)
    out = jax.jit(jax.vmap(fo_jax.matmul, in_axes=in_axes))(x, w)
    expect = np.einsum("...mk,...kn->...mn", x64 if in_axes[0] == 0 else x64[None],
                       w64 if in_axes[1] == 0 else w64[None])
    expect = np.broadcast_to(expect, (b, 256, 256))
    assert out.shape == (b, 256, 256)
    assert_close(out.reshape(-1, 256), expect.reshape(-1, 256), jnp.bfloat16)


def test_matmul_scan_checkpoint_grad():
    dev = _gpu()
    rng = np.random.default_rng(3)
    ws, ws64 = _rand(rng, (3, 256, 256), dev, scale=256 ** -0.5)
    x, x64 = _rand(rng, (512, 256), dev)

    def net(x, ws, mm):
        def layer(h, w):
            return jax.checkpoint(mm)(h, w).astype(h.dtype), None
        return jnp.sum(jax.lax.scan(layer, x, ws)[0].astype(jnp.float32))

    got = jax.jit(jax.grad(lambda x, ws: net(x, ws, fo_jax.matmul), argnums=1))(x, ws)
    # float64 reference of a linear stack: d/dW_l sum(x W_0 ... W_L) = (x W_0..W_{l-1})^T 1
    # (W_{l+1} .. W_L)^T
    acts = [x64]
    for i in range(3):
        acts.append(acts[-1] @ ws64[i])
    ones = np.ones((512, 256))
    back = [None] * 3
    up = ones
    for i in reversed(range(3)):
        back[i] = acts[i].T @ up
        up = up @ ws64[i].T
    assert_close(got.reshape(-1, 256), np.concatenate(back).reshape(-1, 256), jnp.bfloat16,
                 factor=2.0)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_axis_of_size_one_is_fo_jax_gemm(collective):
    dev = _gpu()
    mesh = Mesh(np.array([dev]), ("tp",))
    rng = np.random.default_rng(4)
    x, x64 = _rand(rng, (2, 1024, 1024), dev, scale=1024 ** -0.5)
    w, w64 = _rand(rng, (1024, 512), dev)
    seen = {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective=collective)
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective)

    out_spec = P("tp", None, None) if collective == "reduce_scatter" else P()
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, None, "tp"), P("tp", None)),
                              out_specs=out_spec))
    text = f.lower(x, w).as_text()
    assert "fo_jax_gemm" in text and "fo_jax_overlapped_matmul" not in text
    choice = seen["choice"]
    assert choice.path == "cuda" and choice.axis_size == 1 and "size 1" in choice.reason, choice
    out = f(x, w)
    assert_close(out.reshape(-1, 512), (x64 @ w64).reshape(-1, 512), jnp.bfloat16)
