"""fp8 (float8_e4m3fn) operands through overlapped_matmul on the CPU: the reference path's
numerics at TP=2/4 against float64 NumPy of the dequantized operands (leading dimensions, vmap,
scan, checkpoint) and its gradients against the float64 derivative; with the compiled CUDA
module (fp8 kernels built), the fp8 plans at TP 2/4/8 on both transports (fp8 tile
configurations, never the ring), the handler's validation of them and its refusals, and the
lowering for CUDA (target fo_jax_overlapped_matmul_fp8_v1, the scale operands, the plan)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh

E4M3 = jnp.dtype(jnp.float8_e4m3fn)
HI = jax.lax.Precision.HIGHEST


def _dequant64(q, s):
    return np.asarray(q, np.float64) * float(s)


def _operands(lead, k, n, seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    xq, xs = fo_jax.quantize_fp8(3.0 * jax.random.normal(kx, (*lead, k), jnp.float32))
    wq, ws = fo_jax.quantize_fp8(0.05 * jax.random.normal(kw, (k, n), jnp.float32))
    return xq, xs, wq, ws


def _partials64(xq, xs, wq, ws, size):
    """Each rank's float64 partial product (x's columns and w's rows split over `size` ranks)."""
    x, w = _dequant64(xq, xs), _dequant64(wq, ws)
    kl = x.shape[-1] // size
    return [x[..., r * kl:(r + 1) * kl] @ w[r * kl:(r + 1) * kl] for r in range(size)]


def _within_bf16_roundings(y, parts):
    """y (bf16) against the float64 sum of the partials: each rank rounds its partial to bf16
    (2^-8 relative) and the bf16 sum rounds once more."""
    ref = sum(parts)
    tol = 2.0**-8 * sum(np.abs(p) for p in parts) + 2.0**-8 * np.abs(ref) + 1e-6
    err = np.abs(np.asarray(y, np.float64) - ref)
    assert np.all(err <= tol), float(np.max(err - tol))


def _fp8_call(collective, config=None):
    return lambda x, w, a, b: fo_jax.overlapped_matmul(
        x, w, axis_name="tp", collective=collective, config=config, x_scale=a, w_scale=b)


# --- reference path: forward --------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_leading_dims_vs_float64(size, collective):
    mesh = cpu_mesh((size,), ("tp",))
    xq, xs, wq, ws = _operands((8 * size, 3), 32 * size, 24, seed=size)
    out_spec = P("tp", None, None) if collective == "reduce_scatter" else P()
    f = jax.jit(jax.shard_map(_fp8_call(collective), mesh=mesh,
                              in_specs=(P(None, None, "tp"), P("tp", None), P(), P()),
                              out_specs=out_spec))
    y = f(xq, wq, xs, ws)
    assert y.dtype == jnp.bfloat16 and y.shape == (8 * size, 3, 24)
    _within_bf16_roundings(y, _partials64(xq, xs, wq, ws, size))


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_vmap_scan_checkpoint_vs_float64(size, collective):
    """A vmapped x (the batch folds into the GEMM's rows, reordered for the reduce-scatter so
    that each rank gets its rows of every element), vmapped scales (one call per element), and
    the call under lax.scan and jax.checkpoint all give each element's own product."""
    mesh = cpu_mesh((size,), ("tp",))
    b, m, k, n = 3, 8 * size, 32 * size, 16
    xq, xs, wq, ws = _operands((b, m), k, n, seed=10 + size)
    call = _fp8_call(collective)
    rs = collective == "reduce_scatter"
    out_spec = P(None, "tp", None) if rs else P()
    specs = dict(mesh=mesh, in_specs=(P(None, None, "tp"), P("tp", None), P(), P()),
                 out_specs=out_spec)

    def vmapped(x, w, a, c):
        return jax.vmap(call, in_axes=(0, None, None, None))(x, w, a, c)

    def vmapped_scales(x, w, a, c):  # batched scales: one overlapped call per element
        a3 = jnp.stack([a, a, a])
        return jax.vmap(call, in_axes=(0, None, 0, None))(x, w, a3, c)

    def scanned(x, w, a, c):
        return jax.lax.scan(lambda carry, xb: (carry, call(xb, w, a, c)), 0, x)[1]

    def checkpointed(x, w, a, c):
        return jax.vmap(jax.checkpoint(call), in_axes=(0, None, None, None))(x, w, a, c)

    parts = _partials64(xq, xs, wq, ws, size)
    for body in (vmapped, vmapped_scales, scanned, checkpointed):
        y = jax.jit(jax.shard_map(body, **specs))(xq, wq, xs, ws)
        assert y.shape == (b, m, n) and y.dtype == jnp.bfloat16, body.__name__
        _within_bf16_roundings(y, parts)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "all_gather"])
def test_weight_given_transposed(collective):
    """w_transposed=True with the weight stored [N, K] gives the [K, N] call's result exactly,
    forward and gradients (the cotangent of the [N, K] weight is the [K, N] one's transpose), and
    describe() reads N and K the same way."""
    size = 2
    mesh = cpu_mesh((size,), ("tp",))
    ag = collective == "all_gather"
    m, k, n = 8 * size, 32 * size, 8 * size
    xq, xs, wq, ws = _operands((m,), k, n, seed=41)
    x_spec, w_spec = (P("tp", None), P(None, "tp")) if ag else (P(None, "tp"), P("tp", None))
    w_nk_spec = P(w_spec[1], w_spec[0])
    out = {"reduce_scatter": P("tp", None), "all_gather": P(None, "tp")}.get(collective, P())

    def build(transposed):
        def body(x, w, a, b):
            y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective, x_scale=a,
                                         w_scale=b, w_transposed=transposed)
            return y, jax.lax.psum(jnp.sum(y.astype(jnp.float32)), "tp")
        return jax.jit(jax.shard_map(body, mesh=mesh, out_specs=(out, P()), check_vma=False,
                                     in_specs=(x_spec, w_nk_spec if transposed else w_spec,
                                               P(), P())))

    y_kn, _ = build(False)(xq, wq, xs, ws)
    y_nk, _ = build(True)(xq, wq.T, xs, ws)
    np.testing.assert_array_equal(np.asarray(y_nk, np.float32), np.asarray(y_kn, np.float32))
    g_kn = jax.grad(lambda w, a: build(False)(xq, w, xs, a)[1], argnums=(0, 1),
                    allow_int=True)(wq, ws)
    g_nk = jax.grad(lambda w, a: build(True)(xq, w, xs, a)[1], argnums=(0, 1),
                    allow_int=True)(wq.T, ws)
    np.testing.assert_array_equal(np.asarray(g_nk[0], np.float32).T,
                                  np.asarray(g_kn[0], np.float32))
    np.testing.assert_array_equal(np.asarray(g_nk[1]), np.asarray(g_kn[1]))

    seen = {}
    for transposed, w in ((False, wq), (True, wq.T)):
        def probe(x, w, t=transposed):
            seen[t] = fo_jax.describe(x, w, axis_name="tp", collective=collective,
                                      w_transposed=t)
            return x
        jax.shard_map(probe, mesh=mesh, in_specs=(x_spec, w_nk_spec if transposed else w_spec),
                      out_specs=x_spec, check_vma=False)(xq, w)
    assert seen[True] == seen[False]


def test_weight_given_transposed_needs_fp8():
    mesh = cpu_mesh((2,), ("tp",))
    x, w = jnp.ones((8, 16), jnp.bfloat16), jnp.ones((16, 8), jnp.bfloat16)
    for op in (fo_jax.overlapped_matmul, fo_jax.describe):
        call = jax.shard_map(lambda x, w, op=op: op(x, w, axis_name="tp", w_transposed=True),
                             mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                             out_specs=P(), check_vma=False)
        with pytest.raises(TypeError, match="w_transposed applies to float8_e4m3fn operands only"):
            call(x, w)


# --- reference path: gradients ------------------------------------------------------------------
def _bf16_exact(key, shape):
    return jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_grads_vs_float64(collective, size, check_vma):
    """d/dx, d/dw (fp8, rounded from the float32 derivative) and d/dxs, d/dws (float32) of
    sum(y * c) against JAX's own derivative of the same loss on the dequantizing float32
    reference (XLA's collective and its transposes, as check_vma defines them: without it, a
    replicated scale's cotangent is each rank's share) and, with check_vma=True, against the
    float64 closed form (the reduce-scatter's dy is gathered over the axis, the all-reduce's is
    every rank's own)."""
    mesh = cpu_mesh((size,), ("tp",))
    m, k, n = 8 * size, 32 * size, 16
    xq, xs, wq, ws = _operands((m,), k, n, seed=20 + size)
    rs = collective == "reduce_scatter"
    c = _bf16_exact(jax.random.key(5), (m, n))  # the cotangent, exact in bf16
    call = _fp8_call(collective)

    def total(y, c):
        local = jnp.sum(y.astype(jnp.float32) * c)
        return jax.lax.psum(local, "tp") if rs else local

    def loss(x, w, a, b, c):
        return total(call(x, w, a, b), c)

    def loss_f32(xf, wf, a, b, c):  # x and w as float32 values of the fp8 ones
        y = jax.lax.dot(xf * a, wf * b, precision=HI)
        return total(fo_jax.reference.apply_collective(y, "tp", collective), c)

    specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(), P(),
                                      P("tp", None) if rs else P()),
                 out_specs=(P(None, "tp"), P("tp", None), P(), P()), check_vma=check_vma)
    dx, dw, dxs, dws = jax.jit(jax.shard_map(jax.grad(loss, argnums=(0, 1, 2, 3)), **specs))(
        xq, wq, xs, ws, c)
    assert dx.dtype == E4M3 and dw.dtype == E4M3 and dxs.dtype == dws.dtype == jnp.float32
    want = [np.asarray(g, np.float64) for g in jax.jit(jax.shard_map(
        jax.grad(loss_f32, argnums=(0, 1, 2, 3)), **specs))(
            xq.astype(jnp.float32), wq.astype(jnp.float32), xs, ws, c)]
    if check_vma:  # every rank's dy is the whole c: dL/dX = c @ W^T, dL/dW = X^T @ c
        x, w, c64 = _dequant64(xq, xs), _dequant64(wq, ws), np.asarray(c, np.float64)
        np.testing.assert_allclose(want[0], float(xs) * (c64 @ w.T), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(want[1], float(ws) * (x.T @ c64), rtol=1e-5, atol=1e-6)
    # fp8 cotangents: the exact value rounded to e4m3, so within one e4m3 step of it (2^-3
    # relative; 2^-9 among subnormals).
    for got, exact in zip((dx, dw), want[:2]):
        err = np.abs(np.asarray(got, np.float64) - exact)
        assert np.all(err <= 2.0**-3 * np.abs(exact) + 2.0**-9), float(np.max(err))
    # Scale cotangents (float32 sums of q * dL/dQ).
    np.testing.assert_allclose(float(dxs), want[2], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(float(dws), want[3], rtol=1e-4, atol=1e-3)


# --- all-gather (fo_jax/_fp8_all_gather.py) ----------------------------------------------------
def _gather_operands(size, m, k, n, shared, seed):
    """x[size * m, 3, K] quantized per device's rows (its own scale, `xs` [size]) or with one
    scale for all (`xs` a scalar); w[K, N]."""
    kx, kw = jax.random.split(jax.random.key(seed))
    x = 3.0 * jax.random.normal(kx, (size, m, 3, k), jnp.float32)
    x = x * (1.0 + jnp.arange(size, dtype=jnp.float32))[:, None, None, None]  # scales differ
    if shared:
        xq, xs = fo_jax.quantize_fp8(x.reshape(size * m, 3, k))
    else:
        pairs = [fo_jax.quantize_fp8(x[d]) for d in range(size)]
        xq = jnp.concatenate([q for q, _ in pairs])
        xs = jnp.stack([s for _, s in pairs])
    wq, ws = fo_jax.quantize_fp8(0.05 * jax.random.normal(kw, (k, n), jnp.float32))
    return xq, xs, wq, ws


def _gather_ref64(xq, xs, wq, ws, size):
    x = np.asarray(xq, np.float64).reshape(size, -1, *xq.shape[1:])
    x = x * np.broadcast_to(np.asarray(xs, np.float64), (size,))[:, None, None, None]
    w = _dequant64(wq, ws)
    x = x.reshape(-1, *xq.shape[1:])
    return x @ w, np.abs(x) @ np.abs(w)


def _gather_call(shared):
    def call(x, w, a, b):
        a = a if shared else a.reshape(())  # each device's own scale
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_gather",
                                        x_scale=a, w_scale=b)
    return call


def _gather_specs(mesh, shared, check_vma):
    return dict(mesh=mesh, in_specs=(P("tp", None, None), P(None, "tp"),
                                     P() if shared else P("tp"), P()),
                out_specs=P(None, None, "tp"), check_vma=check_vma)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("size", [2, 4])
def test_all_gather_vs_float64(size, shared, check_vma):
    """all_gather(x * xs) @ (w * ws) in bf16 against float64 NumPy, with one scale shared by
    the axis and with a scale per device (each device's gathered rows keep their own); one GEMM
    only where the types prove the scale shared (check_vma=True), else one per device's rows."""
    mesh = cpu_mesh((size,), ("tp",))
    m, k, n = 8, 32, 8 * size
    xq, xs, wq, ws = _gather_operands(size, m, k, n, shared, seed=30 + size)
    f = jax.jit(jax.shard_map(_gather_call(shared), **_gather_specs(mesh, shared, check_vma)))
    y = f(xq, wq, xs, ws)
    assert y.dtype == jnp.bfloat16 and y.shape == (size * m, 3, n)
    ref, mag = _gather_ref64(xq, xs, wq, ws, size)
    err = np.abs(np.asarray(y, np.float64) - ref)
    assert np.all(err <= 2.0**-8 * np.abs(ref) + 1e-5 * mag + 1e-6), float(np.max(err))
    jaxpr = str(jax.make_jaxpr(f)(xq, wq, xs, ws))
    one_gemm = shared and check_vma
    assert ("scan" in jaxpr) != one_gemm  # the per-device GEMMs map over the devices' rows


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_all_gather_grads_vs_float32_reference(shared, check_vma):
    """d/dx, d/dw (fp8) and d/dxs, d/dws (float32) of sum(y * c) against JAX's own derivative
    of the dequantizing float32 reference (XLA's all_gather and its transpose, the
    reduce-scatter), as check_vma defines them."""
    size, m, k, n = 4, 8, 32, 16
    mesh = cpu_mesh((size,), ("tp",))
    xq, xs, wq, ws = _gather_operands(size, m, k, n, shared, seed=40)
    c = _bf16_exact(jax.random.key(6), (size * m, 3, n))
    call = _gather_call(shared)

    def loss(x, w, a, b, c):
        return jnp.sum(call(x, w, a, b).astype(jnp.float32) * c)

    def loss_f32(xf, wf, a, b, c):
        a = a if shared else a.reshape(())
        g = jax.lax.all_gather(xf * a, "tp", axis=0, tiled=True)
        y = jnp.einsum("mik,kn->min", g, wf * b, precision=HI)
        return jnp.sum(y * c)

    specs = _gather_specs(mesh, shared, check_vma)
    specs = dict(specs, in_specs=(*specs["in_specs"], P(None, None, "tp")),
                 out_specs=specs["in_specs"])
    got = jax.jit(jax.shard_map(jax.grad(loss, argnums=(0, 1, 2, 3)), **specs))(
        xq, wq, xs, ws, c)
    want = [np.asarray(g, np.float64) for g in jax.jit(jax.shard_map(
        jax.grad(loss_f32, argnums=(0, 1, 2, 3)), **specs))(
            xq.astype(jnp.float32), wq.astype(jnp.float32), xs, ws, c)]
    assert got[0].dtype == E4M3 and got[1].dtype == E4M3
    for g, exact in zip(got[:2], want[:2]):
        err = np.abs(np.asarray(g, np.float64) - exact)
        assert np.all(err <= 2.0**-3 * np.abs(exact) + 2.0**-9), float(np.max(err))
    for g, exact in zip(got[2:], want[2:]):
        np.testing.assert_allclose(np.asarray(g, np.float64), exact, rtol=1e-4, atol=1e-3)


def test_all_gather_vmap_scan_checkpoint():
    size, m, k, n = 2, 8, 32, 16
    mesh = cpu_mesh((size,), ("tp",))
    xq, xs, wq, ws = _gather_operands(size, m, k, n, True, seed=50)  # x[size * m, 3, K]
    xb = jnp.moveaxis(xq, 1, 0)  # [3, size * m, K]: vmap over the 3
    call = _gather_call(True)
    specs = dict(mesh=mesh, in_specs=(P(None, "tp", None), P(None, "tp"), P(), P()),
                 out_specs=P(None, None, "tp"))
    bodies = {
        "vmap": lambda x, w, a, c: jax.vmap(call, in_axes=(0, None, None, None))(x, w, a, c),
        "scan": lambda x, w, a, c: jax.lax.scan(
            lambda carry, xe: (carry, call(xe, w, a, c)), 0, x)[1],
        "checkpoint": lambda x, w, a, c: jax.vmap(jax.checkpoint(call),
                                                  in_axes=(0, None, None, None))(x, w, a, c),
    }
    ref, mag = _gather_ref64(xq, xs, wq, ws, size)
    ref, mag = np.moveaxis(ref, 1, 0), np.moveaxis(mag, 1, 0)
    for name, body in bodies.items():
        y = jax.jit(jax.shard_map(body, **specs))(xb, wq, xs, ws)
        assert y.shape == (3, size * m, n), name
        err = np.abs(np.asarray(y, np.float64) - ref)
        assert np.all(err <= 2.0**-8 * np.abs(ref) + 1e-5 * mag + 1e-6), name


def test_quantize_with_axis_name_shares_the_scale():
    """quantize_fp8(x, axis_name=) gives every device the largest amax over the axis, and its
    type says it does not vary over the axis; outside shard_map it names the problem."""
    from fo_jax import _vma

    size = 4
    mesh = cpu_mesh((size,), ("tp",))
    x = jax.random.normal(jax.random.key(7), (size * 8, 16)) * 3.0

    def body(x):
        q, s = fo_jax.quantize_fp8(x, axis_name="tp")
        assert "tp" not in _vma.varying_axes(s)
        return q, s[None]

    q, s = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp", None),
                                 out_specs=(P("tp", None), P("tp"))))(x)
    want = float(jnp.max(jnp.abs(x))) / float(jnp.finfo(E4M3).max)
    np.testing.assert_allclose(np.asarray(s), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(q, np.float32) * want, np.asarray(x),
                               rtol=2.0**-4, atol=2.0**-9 * want)
    with pytest.raises(ValueError, match="axis name 'tp' is not bound here"):
        fo_jax.quantize_fp8(x, axis_name="tp")


# --- with the compiled module: plans, validation, lowering --------------------------------------
def _has_fp8_kernels():
    if not fo_jax.cuda_module_available():
        return False
    from fo_jax import _plan

    return any("float8_e4m3fn" in c.get("dtypes", ()) for c in _plan.gemm_configs())


needs_fp8_module = pytest.mark.skipif(not _has_fp8_kernels(),
                                      reason="CUDA module with fp8 kernels not built here")
SHAPE = (8192, 8192, 2048)  # rows of x per rank, N, K


def _fp8_plan(collective, size, transport, config=None, shape=SHAPE):
    from fo_jax import _plan

    m, n, k = shape
    return _plan.plan_overlap("test", collective, size, E4M3, m, n, k, config, transport)


@needs_fp8_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("size", [2, 4, 8])
def test_fp8_plans(size, collective, transport):
    """An fp8 row of the table, the direct form (never the ring), the transport's batch, and the
    handler's own decoding and validation accept the plan for fp8 operands."""
    from fo_jax import _cuda_ops, _plan

    plan = _fp8_plan(collective, size, transport)
    c = _plan.gemm_configs()[plan.gemm.config_index]
    assert c["dtypes"] == ("float8_e4m3fn",) and c["name"].startswith("fp8_")
    assert not plan.ring
    rs = collective == "reduce_scatter"
    assert plan.gemm.batch == (size if rs and transport == "nccl" else 1)
    m, n, k = SHAPE
    got = _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), E4M3, m, n, k, rank=1)
    assert got["config"] == plan.gemm.config_index and got["batch"] == plan.gemm.batch
    assert got["output_rows"] == (m // size if rs else m)
    assert got["num_groups"] == plan.num_groups


@needs_fp8_module
@pytest.mark.parametrize("fast", [False, True])
def test_fp8_plans_with_the_h200_fp8_models(monkeypatch, fast):
    """The H200 table's fitted fp8 tile models pick the producers' rows from M = 512 (the
    128x160 rows and ping-pong 64x192 among them, which the library's rules do not pick there):
    on every sweep shape, both collectives, both transports and 2-8 ranks, each plan takes a row
    of its accumulation (the model's pick on every SM where the copy engine runs the producer),
    and the handler's own decoding and validation accept it."""
    import os
    import sys

    from fo_jax import _cuda_ops, _gemm_choice, _gemm_tables, _plan, _transport

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import bench_gemm_sweep  # the sweep's shapes

    h200 = _gemm_tables.tables()["NVIDIA H200"]
    monkeypatch.setattr(_gemm_choice, "table", lambda: h200)
    monkeypatch.setattr(_gemm_choice, "device_sms", lambda: 132)
    config = fo_jax.OverlapConfig(fp8_fast_accumulation=fast)
    configs = _plan.gemm_configs()
    picked = set()
    for m, n, k, _ in bench_gemm_sweep.sweep_shapes():
        model = _gemm_choice.select_fp8_config(m, n, k, 1, 0, configs, fast, 132)
        for size in (2, 4, 8):
            for collective in ("reduce_scatter", "all_reduce"):
                for transport in ("nccl", "copy_engine"):
                    # As the lowering does (_transport.choose): the copy engine only where it
                    # can take the call (bands of whole tile-row units of the pick).
                    if transport == "copy_engine" and _transport.copy_engine_problem(
                            collective, size, E4M3, m, n, k, config):
                        continue
                    plan = _plan.plan_overlap("test", collective, size, E4M3, m, n, k, config,
                                              transport)
                    c = configs[plan.gemm.config_index]
                    assert c["dtypes"] == ("float8_e4m3fn",) and bool(c["fast_accum"]) == fast
                    if transport == "copy_engine":
                        assert plan.gemm.config_index == model, (m, n, k, c["name"])
                    picked.add(c["name"])
                    got = _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), E4M3,
                                                       m, n, k, rank=1)
                    assert got["config"] == plan.gemm.config_index
                    assert got["num_groups"] == plan.num_groups
    want = ({"fp8fast_pp_128x160x128_c2"} if fast
            else {"fp8_coop_128x160x128_c2", "fp8_pp_64x192x128_c2"})
    assert want <= picked, picked


@needs_fp8_module
def test_fp8_plan_refusals():
    from fo_jax import _cuda_ops

    with pytest.raises(ValueError, match="copy_engine_ring=True.*no fp8 kernel takes an addend"):
        _fp8_plan("reduce_scatter", 2, "copy_engine", fo_jax.OverlapConfig(copy_engine_ring=True))
    m, n, k = SHAPE
    # The handler: a ring plan refused for fp8 with its reason; a 16-bit all-gather plan (its
    # consumer config has no fp8 kernel) refused for fp8 operands.
    ring = dataclasses.replace(_fp8_plan("reduce_scatter", 2, "copy_engine"), ring=True)
    with pytest.raises(Exception, match="fp8 operands cannot run the ring"):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(ring), E4M3, m, n, k)
    from fo_jax import _plan

    gather = _plan.plan_overlap("test", "all_gather", 2, jnp.dtype(jnp.bfloat16), m // 2, n, k,
                                None, "nccl")
    with pytest.raises(Exception, match="pp_128x192x64_c2 has no fp8 kernel"):
        _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(gather), E4M3, m, n, k)


@needs_fp8_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("size", [2, 4, 8])
def test_fp8_all_gather_plans(size, transport):
    """The fp8 all-gather's plan: an fp8 row with the consumer kernel, one group per band, and
    the handler's own decoding and validation accept it for fp8 operands."""
    from fo_jax import _cuda_ops, _plan

    m, n, k = SHAPE  # rows per rank
    plan = _fp8_plan("all_gather", size, transport)
    c = _plan.gemm_configs()[plan.gemm.config_index]
    assert c["dtypes"] == ("float8_e4m3fn",) and c["has_consumer"], c
    assert plan.num_groups == size * _plan.all_gather_bands_per_rank(None)
    got = _cuda_ops.check_overlap_plan(_cuda_ops.overlap_attribute(plan), E4M3, m * size, n, k,
                                       rank=1)
    assert got["config"] == plan.gemm.config_index and got["num_groups"] == plan.num_groups
    # A named fp8 config without the consumer form is refused, naming those that have it.
    with pytest.raises(ValueError, match="has no consumer kernel.*fp8_coop_128x128x128_c1"):
        _fp8_plan("all_gather", size, transport,
                  fo_jax.OverlapConfig(gemm_config="fp8_pp_64x192x128_c2"))


@needs_fp8_module
def test_fp8_choice():
    """Over more than one device the fp8 call overlaps on CUDA devices (a transport); too small,
    it is the fp8 GEMM then XLA's collective (no transport); over one device the fp8 GEMM."""
    from fo_jax import overlap

    m, n, k = SHAPE
    for coll in ("reduce_scatter", "all_reduce"):
        c = overlap._choose_fp8_overlapped(None, m, n, k, "cuda", coll, 4)
        assert c.path == "cuda" and c.transport in ("nccl", "copy_engine"), c
        assert "overlapped" in c.reason
        small = overlap._choose_fp8_overlapped(None, 256, 256, 256, "cuda", coll, 4)
        assert small.path == "cuda" and small.transport is None
        assert "too small to gain from overlap" in small.reason
        forced = overlap._choose_fp8_overlapped(fo_jax.OverlapConfig(allow_fallback=False), 256,
                                                256, 256, "cuda", coll, 4)
        assert forced.transport is not None
    one = overlap._choose_fp8_overlapped(None, m, n, k, "cuda", "all_reduce", 1)
    assert one.path == "cuda" and one.transport is None
    gather = overlap._choose_fp8_overlapped(None, m, n, k, "cuda", "all_gather", 4)
    assert gather.path == "cuda" and gather.transport is None
    assert gather.reason.startswith("XLA's all_gather of the fp8 x, then fo_jax's fp8 GEMM")
    assert "opt-in" in gather.reason
    opted = overlap._choose_fp8_overlapped(fo_jax.OverlapConfig(all_gather="overlap"), m, n, k,
                                           "cuda", "all_gather", 4)
    assert opted.path == "cuda" and opted.transport in ("nccl", "copy_engine"), opted
    assert opted.reason.startswith("with x_scale provably the same on every device")
    assert "otherwise XLA's all_gather of the fp8 x" in opted.reason


@needs_fp8_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_fp8_overlap_lowers_for_cuda(collective, transport):
    from fo_jax import _plan

    size, m, kl, n = 4, 1024, 512, 256
    config = fo_jax.OverlapConfig(allow_fallback=False, transport=transport)
    mesh = cpu_mesh((size,), ("tp",))
    rs = collective == "reduce_scatter"
    f = jax.jit(jax.shard_map(_fp8_call(collective, config), mesh=mesh,
                              in_specs=(P(None, "tp"), P("tp", None), P(), P()),
                              out_specs=P("tp", None) if rs else P()))
    xq, xs, wq, ws = _operands((m,), kl * size, n)
    text = f.trace(xq, wq, xs, ws).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    fp8_calls = [line for line in calls if "@fo_jax_overlapped_matmul_fp8_v1(" in line]
    assert len(fp8_calls) == 1 and not any("@fo_jax_overlapped_matmul_v2(" in c for c in calls)
    call = fp8_calls[0]
    # x [m, K/P] and the weight K-major [n, K/P] in e4m3, the two f32 scalar scales; bf16 out.
    assert f"(tensor<{m}x{kl}xf8E4M3FN>, tensor<{n}x{kl}xf8E4M3FN>, tensor<f32>, tensor<f32>)" \
        in call
    out_rows = m // size if rs else m
    assert f"tensor<{out_rows}x{n}xbf16>" in call
    assert "stablehlo.transpose" in text  # the weight, K-major for the kernel
    plan = _plan.plan_overlap("test", collective, size, E4M3, m, n, kl, config, transport)
    assert plan.transport == transport and not plan.ring
    assert f"config = {plan.gemm.config_index} : i32" in call
    assert f"axis_size = {size} : i32" in call and "ring = false" in call


@needs_fp8_module
def test_fp8_overlap_lowers_a_transposed_weight_for_cuda():
    """A weight given [N, K] (w_transposed=True) reaches the custom call as the same K-major
    operand; the two transposes around it are XLA's to fold (on GPUs the compiled program holds
    no transpose: dev/probes_py/fp8_transposed_weight_hlo.py)."""
    size, m, kl, n = 2, 1024, 512, 256
    config = fo_jax.OverlapConfig(allow_fallback=False, transport="nccl")
    mesh = cpu_mesh((size,), ("tp",))
    f = jax.jit(jax.shard_map(
        lambda x, w, a, b: fo_jax.overlapped_matmul(x, w, axis_name="tp", config=config,
                                                    x_scale=a, w_scale=b, w_transposed=True),
        mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp"), P(), P()), out_specs=P("tp", None)))
    xq, xs, wq, ws = _operands((m,), kl * size, n)
    text = f.trace(xq, wq.T, xs, ws).lower(lowering_platforms=("cuda",)).as_text()
    call, = [line for line in text.splitlines() if "@fo_jax_overlapped_matmul_fp8_v1(" in line]
    assert f"(tensor<{m}x{kl}xf8E4M3FN>, tensor<{n}x{kl}xf8E4M3FN>, tensor<f32>, tensor<f32>)" \
        in call


@needs_fp8_module
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("shared", [True, False])
def test_fp8_all_gather_lowers_for_cuda(shared, transport):
    """Opted in (OverlapConfig(all_gather="overlap")): with a scale the types prove shared, one
    fp8 overlapped call (x[m, K] e4m3, the weight K-major, the two f32 scalars; bf16 out and the
    gathered e4m3 x) planned with an fp8 consumer config; with a scale per device, no overlapped
    call (XLA's all-gather, then one fp8 GEMM per device's rows)."""
    from fo_jax import _plan

    size, m, k, n = 4, 1024, 512, 256  # rows per rank, K, N per rank
    config = fo_jax.OverlapConfig(all_gather="overlap", transport=transport, allow_fallback=False)
    mesh = cpu_mesh((size,), ("tp",))
    xq, xs, wq, ws = _gather_operands(size, m, k, n * size, shared, seed=70)
    xq = xq[:, 0]  # [size * m, K]

    def call(x, w, a, b):
        a = a if shared else a.reshape(())
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_gather",
                                        x_scale=a, w_scale=b, config=config)

    f = jax.jit(jax.shard_map(call, mesh=mesh,
                              in_specs=(P("tp", None), P(None, "tp"), P() if shared else P("tp"),
                                        P()),
                              out_specs=P(None, "tp")))
    text = f.trace(xq, wq, xs, ws).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    fp8_calls = [line for line in calls if "@fo_jax_overlapped_matmul_fp8_v1(" in line]
    if not shared:
        assert not fp8_calls and "all_gather" in text
        return
    assert len(fp8_calls) == 1, calls
    call_text = fp8_calls[0]
    assert f"(tensor<{m}x{k}xf8E4M3FN>, tensor<{n}x{k}xf8E4M3FN>, tensor<f32>, tensor<f32>)" \
        in call_text
    assert f"tensor<{m * size}x{n}xbf16>, tensor<{m * size}x{k}xf8E4M3FN>" in call_text
    plan = _plan.plan_overlap("test", "all_gather", size, E4M3, m, n, k, config, transport)
    assert plan.gemm.config_name.startswith("fp8_coop_")
    assert f"config = {plan.gemm.config_index} : i32" in call_text
