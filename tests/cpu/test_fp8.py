"""fp8 (float8_e4m3fn) on the CPU: trace-time validation, quantize_fp8's bounds and gradient, the
reference path's numerics against float64 NumPy of the dequantized operands, jax transforms,
overlapped_matmul at TP=2/4 on CPU meshes, and the fp8 GEMM's lowering for CUDA (plan, target)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh
from numerics import measured_config_times

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = 448.0


def _quantized(key, shape, scale=1.0):
    x = scale * jax.random.normal(key, shape, jnp.float32)
    return fo_jax.quantize_fp8(x)


def _dequant64(q, s):
    return np.asarray(q, np.float64) * float(s)


def _operands(m=64, k=128, n=32, seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    xq, xs = _quantized(kx, (m, k), 3.0)
    wq, ws = _quantized(kw, (k, n), 0.05)
    return xq, xs, wq, ws


# --- validation --------------------------------------------------------------------------------
def test_fp8_needs_both_scales():
    xq, xs, wq, ws = _operands()
    with pytest.raises(TypeError, match="fo_jax.matmul: float8_e4m3fn operands need w_scale"):
        fo_jax.matmul(xq, wq, x_scale=xs)
    with pytest.raises(TypeError, match="need x_scale"):
        fo_jax.matmul(xq, wq)


def test_fp8_scale_must_be_f32_scalar():
    xq, xs, wq, ws = _operands()
    with pytest.raises(TypeError, match=r"x_scale must be a float32 scalar \(shape \(\)\), got "
                                        r"float32\[1\]"):
        fo_jax.matmul(xq, wq, x_scale=xs.reshape(1), w_scale=ws)
    with pytest.raises(TypeError, match="w_scale must be a float32 scalar"):
        fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="w_scale must be a float32 JAX scalar"):
        fo_jax.matmul(xq, wq, x_scale=xs, w_scale=2.0)


def test_scales_rejected_for_16_bit_operands():
    x = jnp.ones((16, 32), jnp.bfloat16)
    w = jnp.ones((32, 16), jnp.bfloat16)
    with pytest.raises(TypeError, match="x_scale, w_scale apply to float8_e4m3fn operands only; "
                                        "the operands are bfloat16"):
        fo_jax.matmul(x, w, x_scale=jnp.float32(1), w_scale=jnp.float32(1))
    with pytest.raises(TypeError, match="out_dtype apply to float8_e4m3fn operands only"):
        fo_jax.matmul(x, w, out_dtype=jnp.bfloat16)
    with pytest.raises(TypeError, match="w_transposed applies to float8_e4m3fn operands only"):
        fo_jax.matmul(x, w, w_transposed=True)


def test_fp8_dtype_and_shape_checks():
    xq, xs, wq, ws = _operands()
    with pytest.raises(TypeError, match="x and w must have the same dtype"):
        fo_jax.matmul(xq, wq.astype(jnp.bfloat16), x_scale=xs, w_scale=ws)
    with pytest.raises(TypeError, match="fp8 operands must be float8_e4m3fn, got float8_e5m2"):
        fo_jax.matmul(xq.astype(jnp.float8_e5m2), wq.astype(jnp.float8_e5m2), x_scale=xs,
                      w_scale=ws)
    with pytest.raises(TypeError, match="out_dtype float16 is not supported for fp8 operands"):
        fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws, out_dtype=jnp.float16)
    with pytest.raises(ValueError, match="contraction sizes differ"):
        fo_jax.matmul(xq, wq[:64], x_scale=xs, w_scale=ws)


def test_quantize_fp8_validation():
    with pytest.raises(TypeError, match="fo_jax.quantize_fp8: dtype must be float8_e4m3fn"):
        fo_jax.quantize_fp8(jnp.ones(4), dtype=jnp.float8_e5m2)
    with pytest.raises(TypeError, match="x must be float32, bfloat16 or float16, got int32"):
        fo_jax.quantize_fp8(jnp.ones(4, jnp.int32))


# --- quantize_fp8 ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_quantize_round_trip_bounds(dtype):
    x = (7.0 * jax.random.normal(jax.random.key(3), (256, 64), jnp.float32)).astype(dtype)
    q, s = fo_jax.quantize_fp8(x)
    assert q.dtype == E4M3 and s.dtype == jnp.float32 and s.shape == ()
    x64 = np.asarray(x, np.float64)
    np.testing.assert_allclose(float(s), np.abs(x64).max() / E4M3_MAX, rtol=1e-6)
    assert np.abs(np.asarray(q, np.float64)).max() == E4M3_MAX  # amax maps to the top
    err = np.abs(_dequant64(q, s) - x64)
    # Round to nearest with 3 mantissa bits: half a unit in the last place, at most 2^-4 of the
    # value for normals; subnormals (below 2^-6 * scale) have an absolute step of 2^-9 * scale.
    bound = np.maximum(np.abs(x64) * 2.0**-4, 2.0**-10 * float(s))
    assert np.all(err <= bound * (1 + 1e-6))


def test_quantize_all_zero_and_saturation():
    q, s = fo_jax.quantize_fp8(jnp.zeros((8, 8)))
    assert float(s) == 1.0 and not np.any(np.asarray(q, np.float32))
    # The scale comes from amax, so nothing saturates on its own; a value beyond the range
    # clips (no inf or NaN, which e4m3fn would otherwise give).
    x = jnp.array([1.0, -2.0, 4.0])
    q, s = fo_jax.quantize_fp8(x)
    assert np.all(np.isfinite(np.asarray(q, np.float32)))
    from fo_jax import fp8

    big = fp8.saturate(jnp.array([1e6, -1e6, 3.0]), E4M3)
    np.testing.assert_array_equal(np.asarray(big, np.float32), [E4M3_MAX, -E4M3_MAX, 3.0])


def test_quantize_straight_through_gradient():
    x = 5.0 * jax.random.normal(jax.random.key(4), (32, 16), jnp.float32)
    c = 100.0 * jax.random.normal(jax.random.key(5), (32, 16), jnp.float32)
    # q's cotangent (scale * c, scale ~ 0.04) in e4m3's normal range: the round trip's gradient
    # is c, up to that cotangent's rounding to fp8.
    g = jax.grad(lambda x: jnp.sum(fo_jax.fp8.dequantize(*fo_jax.quantize_fp8(x)) * c))(x)
    normal = np.abs(np.asarray(c)) * 5.0 * 4 / E4M3_MAX >= 2.0**-6
    np.testing.assert_allclose(np.asarray(g)[normal], np.asarray(c)[normal], rtol=2.0**-4)


# --- reference numerics ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(64, 128, 32), (48, 80, 24), (3, 16, 8)])
def test_reference_numerics(shape):
    m, k, n = shape
    # On the CPU (committed operands): the reference path, whatever the default backend is.
    xq, xs, wq, ws = jax.device_put(_operands(m, k, n, seed=m), jax.devices("cpu")[0])
    y = jax.jit(lambda *a: fo_jax.matmul(a[0], a[2], x_scale=a[1], w_scale=a[3]))(xq, xs, wq, ws)
    assert y.dtype == jnp.bfloat16 and y.shape == (m, n)
    ref = _dequant64(xq, xs) @ _dequant64(wq, ws)
    # Exact fp8 inputs, float32 accumulation, one bf16 rounding (2^-8 relative).
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2.0**-8,
                               atol=1e-5 * np.abs(ref).max())


def test_w_transposed_and_leading_dims():
    xq, xs, wq, ws = _operands(64, 128, 32)
    y = fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws)
    yt = fo_jax.matmul(xq, wq.T, x_scale=xs, w_scale=ws, w_transposed=True)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(yt, np.float32))
    y3 = fo_jax.matmul(xq.reshape(4, 16, 128), wq, x_scale=xs, w_scale=ws)
    np.testing.assert_array_equal(np.asarray(y3, np.float32).reshape(64, 32),
                                  np.asarray(y, np.float32))


# --- gradients and transforms ------------------------------------------------------------------
def test_grad_is_the_fp32_derivative():
    xq, xs, wq, ws = _operands(32, 64, 16)
    c = jax.random.normal(jax.random.key(6), (32, 16), jnp.float32)

    def loss(xq, wq, xs, ws):
        return jnp.sum(fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws).astype(jnp.float32) * c)

    dxq, dwq, dxs, dws = jax.grad(loss, argnums=(0, 1, 2, 3))(xq, wq, xs, ws)
    assert dxq.dtype == E4M3 and dwq.dtype == E4M3 and dxs.dtype == jnp.float32
    # The output is bf16, so its cotangent is c rounded to bf16.
    X, W = _dequant64(xq, xs), _dequant64(wq, ws)
    C = np.asarray(c.astype(jnp.bfloat16), np.float64)
    gX, gW = C @ W.T, X.T @ C  # dL/d(dequantized operands)
    np.testing.assert_allclose(float(dxs), np.sum(gX * np.asarray(xq, np.float64)), rtol=1e-4)
    np.testing.assert_allclose(float(dws), np.sum(gW * np.asarray(wq, np.float64)), rtol=1e-4)
    # d/dq = scale * dL/d(dequantized), rounded to e4m3 (where it is a normal number).
    for got, want in ((dxq, float(xs) * gX), (dwq, float(ws) * gW)):
        normal = np.abs(want) >= 2.0**-6
        np.testing.assert_allclose(np.asarray(got, np.float64)[normal], want[normal],
                                   rtol=2.0**-4)


def test_training_through_quantize_matches_bf16_gradient():
    x = jax.random.normal(jax.random.key(7), (64, 128), jnp.float32)
    w = jax.random.normal(jax.random.key(8), (128, 32), jnp.float32)
    # Gradients of this size keep the fp8 cotangents (scale * dL/dX) in e4m3's normal range.
    c = 100.0 * jax.random.normal(jax.random.key(9), (64, 32), jnp.float32)

    def fp8_loss(x, w):
        (xq, xs), (wq, ws) = fo_jax.quantize_fp8(x), fo_jax.quantize_fp8(w)
        y = fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws)
        return jnp.sum(y.astype(jnp.float32) * c)

    def bf16_loss(x, w):
        return jnp.sum(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST) * c)

    g8 = jax.grad(fp8_loss, argnums=(0, 1))(x, w)
    g16 = jax.grad(bf16_loss, argnums=(0, 1))(x, w)
    for a, b in zip(g8, g16):
        rel = float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
        assert rel < 0.06, rel  # fp8 rounding of the operands and of the cotangents


def test_vmap_scan_checkpoint():
    xq, xs, wq, ws = _operands(32, 64, 16)
    f = lambda x: fo_jax.matmul(x, wq, x_scale=xs, w_scale=ws)  # noqa: E731
    xb = jnp.stack([xq, xq])
    yv = jax.vmap(f)(xb)
    y = f(xq)
    np.testing.assert_array_equal(np.asarray(yv[1], np.float32), np.asarray(y, np.float32))
    # Batched weights and scales: one GEMM each.
    wsb = jnp.stack([ws, 2 * ws])
    yw = jax.vmap(lambda s: fo_jax.matmul(xq, wq, x_scale=xs, w_scale=s))(wsb)
    np.testing.assert_allclose(np.asarray(yw[1], np.float32), 2 * np.asarray(y, np.float32),
                               rtol=2.0**-7)

    def body(carry, x):
        return carry + jnp.sum(jax.checkpoint(f)(x).astype(jnp.float32)), None

    total, _ = jax.lax.scan(body, jnp.float32(0), xb)
    np.testing.assert_allclose(float(total), 2 * float(jnp.sum(y.astype(jnp.float32))),
                               rtol=1e-5)
    g = jax.grad(lambda s: jax.lax.scan(body, jnp.float32(0), xb)[0] * s)(jnp.float32(1))
    np.testing.assert_allclose(float(g), float(total), rtol=1e-6)


# --- overlapped_matmul on CPU meshes -----------------------------------------------------------
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_overlapped_fp8_reference(size, collective):
    mesh = cpu_mesh((size,), ("tp",))
    m, k, n = 64, 64 * size, 32
    xq, xs, wq, ws = _operands(m, k, n, seed=size)
    out_spec = P("tp", None) if collective == "reduce_scatter" else P(None, None)
    f = jax.jit(jax.shard_map(
        lambda x, w, a, b: fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                                    x_scale=a, w_scale=b),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(), P()), out_specs=out_spec))
    y = f(xq, wq, xs, ws)
    assert y.dtype == jnp.bfloat16 and y.shape == (m, n)
    # Each rank rounds its partial product to bf16 before the sum: size roundings of 2^-8.
    ref = _dequant64(xq, xs) @ _dequant64(wq, ws)
    parts = [_dequant64(xq, xs)[:, r * 64:(r + 1) * 64] @ _dequant64(wq, ws)[r * 64:(r + 1) * 64]
             for r in range(size)]
    tol = 2.0**-8 * sum(np.abs(p) for p in parts) + 2.0**-8 * np.abs(ref)
    assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= tol + 1e-6)


def test_overlapped_fp8_grad_under_vmap():
    mesh = cpu_mesh((2,), ("tp",))
    x = jax.random.normal(jax.random.key(10), (3, 64, 128))
    w = 0.1 * jax.random.normal(jax.random.key(11), (128, 32))
    specs = dict(mesh=mesh, in_specs=(P(None, None, "tp"), P("tp", None)),
                 out_specs=(P(None, None, "tp"), P("tp", None)))

    def fp8_loss(x, w):  # each rank quantizes its own shards (its own scales)
        (xq, xs), (wq, ws) = fo_jax.quantize_fp8(x), fo_jax.quantize_fp8(w)
        y = jax.vmap(lambda xb: fo_jax.overlapped_matmul(xb, wq, axis_name="tp", x_scale=xs,
                                                         w_scale=ws))(xq)
        return jnp.sum(y.astype(jnp.float32) * 100.0)

    def loss(x, w):
        y = jax.vmap(lambda xb: jax.lax.psum_scatter(
            jnp.dot(xb, w, precision=jax.lax.Precision.HIGHEST), "tp", scatter_dimension=0,
            tiled=True))(x)
        return jnp.sum(y * 100.0)

    g8 = jax.jit(jax.shard_map(jax.grad(fp8_loss, argnums=(0, 1)), **specs))(x, w)
    g = jax.jit(jax.shard_map(jax.grad(loss, argnums=(0, 1)), **specs))(x, w)
    for a, b in zip(g8, g):
        assert float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) < 0.08  # fp8 roundings


def test_overlapped_fp8_describe_on_cpu():
    mesh = cpu_mesh((2,), ("tp",))
    xq, xs, wq, ws = _operands(64, 64, 32)

    def desc(x, w):
        for coll in ("all_reduce", "all_gather"):
            c = fo_jax.describe(x, w, axis_name="tp", collective=coll)
            assert c.path == "reference" and "platform 'cpu'" in c.reason
        return x

    jax.jit(jax.shard_map(desc, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                          out_specs=P(None, "tp")))(xq, wq)


# --- CUDA lowering from the CPU ----------------------------------------------------------------
def _has_fp8_kernels():
    if not fo_jax.cuda_module_available():
        return False
    from fo_jax import _plan

    return any("float8_e4m3fn" in c.get("dtypes", ()) for c in _plan.gemm_configs())


needs_fp8_module = pytest.mark.skipif(not _has_fp8_kernels(),
                                      reason="CUDA module with fp8 kernels not built here")


@needs_fp8_module
def test_fp8_gemm_lowers_for_cuda():
    from fo_jax import _plan

    xq, xs, wq, ws = _operands(256, 512, 384)
    f = jax.jit(lambda x, w, a, b: fo_jax.matmul(x, w, x_scale=a, w_scale=b))
    text = f.trace(xq, wq, xs, ws).lower(lowering_platforms=("cuda",)).as_text()
    assert "fo_jax_gemm_fp8_v1" in text and "fo_jax_gemm_v2" not in text
    assert "stablehlo.transpose" in text  # the weight, K-major for the kernel
    plan = _plan.plan_matmul("t", jnp.dtype(E4M3), 256, 384, 512, None)
    cfg = _plan.gemm_configs()[plan.config_index]
    assert cfg["name"].startswith("fp8_") and cfg["tile_k"] == 128
    assert cfg["dtypes"] == ("float8_e4m3fn",) and not cfg["takes_addends"]
    assert f"config = {plan.config_index} : i32" in text
    # A pre-transposed weight needs no transpose.
    g = jax.jit(lambda x, w, a, b: fo_jax.matmul(x, w, x_scale=a, w_scale=b, w_transposed=True))
    text_t = g.trace(xq, wq.T, xs, ws).lower(lowering_platforms=("cuda",)).as_text()
    assert "fo_jax_gemm_fp8_v1" in text_t and "stablehlo.transpose" not in text_t


@needs_fp8_module
def test_fp8_configs_and_16_bit_configs_are_apart():
    from fo_jax import _cuda, _plan

    mod = _cuda.module()
    configs = _plan.gemm_configs()
    fp8_rows = [c["index"] for c in configs if "float8_e4m3fn" in c["dtypes"]]
    assert fp8_rows and all(c["dtypes"] == ("bfloat16", "float16")
                            for c in configs if c["index"] not in fp8_rows)
    for m, n, k in ((128, 128, 128), (8192, 8192, 2048), (1024, 4096, 7168)):
        assert mod.select_gemm_config(mod.GemmDtype.float8_e4m3fn, m, n, k, 1, 0) in fp8_rows
        assert mod.select_gemm_config(mod.GemmDtype.bfloat16, m, n, k, 1, 0) not in fp8_rows
    with pytest.raises(ValueError, match="unknown gemm_config 'pp_128x128x64_c1' for "
                                         "float8_e4m3fn operands"):
        _plan.plan_matmul("t", jnp.dtype(E4M3), 256, 256, 256,
                          fo_jax.OverlapConfig(gemm_config="pp_128x128x64_c1"))


FP8_CONFIG_SWEEP = "gemm_fp8_h100_2026-11-24_f8ea3c2.jsonl"  # bench_fp8.py --configs all


@needs_fp8_module
def test_fp8_rule_picks_the_fastest_measured_configuration():
    """The fp8 tile rule (SelectGemmConfig's wave model) against the committed measurement of
    every fp8 configuration on 16 shapes (one H100): its pick is within 1% of the fastest
    configuration on each (the rule before it lost up to 1.38x at small shapes)."""
    from fo_jax import _cuda, _plan

    mod = _cuda.module()
    names = [c["name"] for c in _plan.gemm_configs()]
    times = measured_config_times(FP8_CONFIG_SWEEP)
    assert len(times) == 16 and all(len(t) == 3 for t in times.values()), times
    for (m, n, k), t in times.items():
        pick = names[mod.select_gemm_config(mod.GemmDtype.float8_e4m3fn, m, n, k, 1, 0)]
        assert t[pick] <= 1.01 * min(t.values()), ((m, n, k), pick, t)


@needs_fp8_module
def test_overlap_handler_refuses_an_fp8_config_for_bf16():
    import dataclasses

    from fo_jax import _cuda_ops, _plan

    plan = _plan.plan_overlap("t", "reduce_scatter", 2, jnp.dtype(jnp.bfloat16), 4096, 1024,
                              1024, None, "nccl")
    fp8_row = _plan.gemm_configs_for(E4M3)[0]
    broken = dataclasses.replace(plan, gemm=dataclasses.replace(
        plan.gemm, config_index=fp8_row["index"]))
    with pytest.raises(Exception, match=f"GEMM config {fp8_row['name']} has no bf16/f16 kernel"):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(broken), jnp.bfloat16, 4096,
                                     1024, 1024)


def test_replicated_scales_grad_inside_shard_map():
    """Scales replicated over the axis (in_specs P()) while x and w are sharded: their cotangents
    are summed over the axis to keep the scales' type (check_vma), for fo_jax.matmul as for
    overlapped_matmul, and equal JAX's derivative of the dequantized float32 product."""
    mesh = cpu_mesh((2,), ("tp",))
    xq, xs, wq, ws = _operands(32, 128, 16, seed=4)
    specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(), P()),
                 out_specs=(P(None, "tp"), P("tp", None), P(), P()))

    def loss(x, w, a, b):
        y = fo_jax.matmul(x, w, x_scale=a, w_scale=b)
        return jnp.sum(jax.lax.psum(y.astype(jnp.float32), "tp"))

    def loss_f32(x, w, a, b):
        y = jnp.dot(x * a, w * b, precision=jax.lax.Precision.HIGHEST)
        return jnp.sum(jax.lax.psum(y, "tp"))

    g = jax.jit(jax.shard_map(jax.grad(loss, argnums=(0, 1, 2, 3)), **specs))(xq, wq, xs, ws)
    want = jax.jit(jax.shard_map(jax.grad(loss_f32, argnums=(0, 1, 2, 3)), **specs))(
        xq.astype(jnp.float32), wq.astype(jnp.float32), xs, ws)
    for got, exact in zip(g[2:], want[2:]):
        np.testing.assert_allclose(float(got), float(exact), rtol=1e-4)
