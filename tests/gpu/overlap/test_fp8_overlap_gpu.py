"""fp8 (float8_e4m3fn) operands through the overlapped call on 1, 2 and 4 GPUs: the all-gather (one
GPU: the overlapped call over a one-rank group; several: against the fp8 GEMM of each device's
rows), and the reduce-scatter and the all-reduce on both transports against fo_jax's fp8 GEMM
followed by XLA's collective on the same GPUs, with the same fp8 tile configuration
(OverlapConfig.gemm_config), so that every rank's bf16 partial product is the same kernel's on the
same operands: the same per-tile accumulation order, the same one rounding to bf16, whatever the
overlap's groups, batch remap or tile-row rotation. What may differ is the order in which the P
partials are added (NCCL's ring or tree, XLA's collective, the copy engine's band sums in float32),
each addition rounded to bf16:

  - P = 2: a + b rounds the same in any order, so the results are bit-identical;
  - P > 2: each of the P - 1 additions rounds by at most 2^-8 of its partial sum, which is at
    most sum_r |partial_r|: |y - y_xla| <= 2 * (P - 1) * 2^-8 * sum_r |partial_r| (both sides
    round, hence the 2), checked per element with the partials computed on the GPUs.

Gradients, vmap: the overlapped call against the same baseline (the backward is the fp8 GEMM's
float32 rule on both sides: fo_jax/fp8.py, cotangents)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import gpu_devices_or_skip, tp_or_skip

pytestmark = pytest.mark.gpu

E4M3 = jnp.dtype(jnp.float8_e4m3fn)


def _mesh(tp):
    devs = gpu_devices_or_skip(tp)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    from fo_jax import _plan

    if not _plan.gemm_configs_for(E4M3):
        pytest.skip("the compiled CUDA module has no fp8 kernels")
    return Mesh(np.array(devs), ("tp",))


def _operands(m, k, n, seed):
    kx, kw = jax.random.split(jax.random.key(seed))
    xq, xs = fo_jax.quantize_fp8(2.0 * jax.random.normal(kx, (m, k), jnp.float32))
    wq, ws = fo_jax.quantize_fp8(0.05 * jax.random.normal(kw, (k, n), jnp.float32))
    return xq, xs, wq, ws


def _config(collective, tp, transport, m, n, k_local):
    """OverlapConfig forcing the transport and the overlap's own fp8 tile configuration (named,
    so that the baseline's fp8 GEMM runs the same one); skips where the copy engine cannot run."""
    from fo_jax import _plan, _transport

    if transport == "copy_engine":
        problem = _transport.copy_engine_problem(collective, tp, E4M3, m, n, k_local, None)
        if problem is not None:
            pytest.skip(f"copy-engine transport: {problem}")
    base = fo_jax.OverlapConfig(allow_fallback=False, transport=transport)
    plan = _plan.plan_overlap("test", collective, tp, E4M3, m, n, k_local, base, transport)
    assert plan.gemm.config_name.startswith("fp8_") and not plan.ring
    return fo_jax.OverlapConfig(allow_fallback=False, transport=transport,
                                gemm_config=plan.gemm.config_name)


def _out_spec(collective):
    return P("tp", None) if collective == "reduce_scatter" else P()


def _calls(mesh, collective, config):
    """(overlapped, baseline, partials): jitted shard_map functions of (x, w, xs, ws)."""
    specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(), P()))

    def overlapped(x, w, a, b):
        c = fo_jax.describe(x, w, axis_name="tp", collective=collective, config=config)
        assert c.path == "cuda" and c.transport == config.transport, c
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                        config=config, x_scale=a, w_scale=b)

    def partial(x, w, a, b):  # this rank's bf16 partial: fo_jax's fp8 GEMM, same config
        return fo_jax.matmul(x, w, x_scale=a, w_scale=b, config=config)

    def baseline(x, w, a, b):
        return fo_jax.reference.apply_collective(partial(x, w, a, b), "tp", collective)

    return (jax.jit(jax.shard_map(overlapped, out_specs=_out_spec(collective), **specs)),
            jax.jit(jax.shard_map(baseline, out_specs=_out_spec(collective), **specs)),
            jax.jit(jax.shard_map(lambda *a: partial(*a)[None], out_specs=P("tp"), **specs)))


def _sum_order_bound(parts, tp):
    """2 * (P - 1) * 2^-8 * sum_r |partial_r| per output element (module docstring)."""
    total = np.sum(np.abs(np.asarray(parts, np.float64)), axis=0)  # [m, n]
    return 2 * (tp - 1) * 2.0**-8 * total


SHAPES = [(2048, 1024, 1024), (4096, 768, 512)]  # M, N, K per rank


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_fp8_overlap_matches_fp8_gemm_then_xla_collective(collective, transport, shape):
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, kl = shape
    config = _config(collective, tp, transport, m, n, kl)
    xq, xs, wq, ws = _operands(m, kl * tp, n, seed=tp + kl)
    overlapped, baseline, partials = _calls(mesh, collective, config)
    y = np.asarray(overlapped(xq, wq, xs, ws), np.float64)
    y_xla = np.asarray(baseline(xq, wq, xs, ws), np.float64)
    # The global result: the reduce-scatter's rank blocks in order, i.e. all m rows either way.
    assert y.shape == y_xla.shape == (m, n) and np.all(np.isfinite(y))
    bound = _sum_order_bound(partials(xq, wq, xs, ws), tp)
    err = np.abs(y - y_xla)
    assert np.all(err <= bound), (
        f"max |y - y_xla| {err.max():.3e} above the sum-order bound at "
        f"{np.argwhere(err > bound)[:5].tolist()}")
    # Repeated calls (the counters, flags and epochs advance) give the same result.
    np.testing.assert_array_equal(np.asarray(overlapped(xq, wq, xs, ws), np.float64), y)


# Every fp8 row a choice may pick for an overlap's producer: the library's rules and the fitted
# fp8 models (fo_jax/_gemm_choice.py, select_fp8_config; the 128x160 rows and ping-pong 64x192
# only through a model at M >= 4096). N = 1000 leaves a partial tile in every row's width.
PRODUCER_ROWS = ["fp8_coop_128x128x128_c1", "fp8_coop_128x192x128_c2", "fp8_pp_64x192x128_c2",
                 "fp8_coop_128x160x128_c2", "fp8fast_pp_128x192x128_c2",
                 "fp8fast_pp_128x128x128_c1", "fp8fast_pp_128x160x128_c2"]


@pytest.mark.parametrize("row", PRODUCER_ROWS)
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_fp8_overlap_every_producer_row(collective, transport, row):
    """Each fp8 row as the overlap's producer (its groups' signals, the transport's bands) against
    the same row's plain GEMM then XLA's collective, within the sum-order bound."""
    from fo_jax import _plan, _transport

    tp = tp_or_skip()
    mesh = _mesh(tp)
    if row not in [c["name"] for c in _plan.gemm_configs()]:
        pytest.skip(f"{row} is not compiled in this build")
    m, n, kl = 2048, 1000, 512
    config = _plan.row_config(row, allow_fallback=False, transport=transport)
    if transport == "copy_engine":
        problem = _transport.copy_engine_problem(collective, tp, E4M3, m, n, kl, config)
        if problem is not None:
            pytest.skip(f"copy-engine transport: {problem}")
    xq, xs, wq, ws = _operands(m, kl * tp, n, seed=len(row) + tp)
    overlapped, baseline, partials = _calls(mesh, collective, config)
    y = np.asarray(overlapped(xq, wq, xs, ws), np.float64)
    y_xla = np.asarray(baseline(xq, wq, xs, ws), np.float64)
    assert y.shape == y_xla.shape == (m, n) and np.all(np.isfinite(y))
    bound = _sum_order_bound(partials(xq, wq, xs, ws), tp)
    assert np.all(np.abs(y - y_xla) <= bound), float(np.abs(y - y_xla).max())
    np.testing.assert_array_equal(np.asarray(overlapped(xq, wq, xs, ws), np.float64), y)


@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_fp8_overlap_transposed_weight_bit_identical(collective, transport):
    """The weight stored [N, K] (w_transposed=True, K sharded along its second dimension) gives
    the bits of the same weight given [K, N]: the kernel reads [N, K] either way (the op
    transposes a [K, N] weight first) and the plan is the same."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, kl = SHAPES[0]
    config = _config(collective, tp, transport, m, n, kl)
    xq, xs, wq, ws = _operands(m, kl * tp, n, seed=11)
    overlapped, _, _ = _calls(mesh, collective, config)

    def transposed(x, wt, a, b):
        return fo_jax.overlapped_matmul(x, wt, axis_name="tp", collective=collective,
                                        config=config, x_scale=a, w_scale=b, w_transposed=True)

    call = jax.jit(jax.shard_map(transposed, mesh=mesh,
                                 in_specs=(P(None, "tp"), P(None, "tp"), P(), P()),
                                 out_specs=_out_spec(collective)))
    np.testing.assert_array_equal(np.asarray(call(xq, wq.T, xs, ws), np.float32),
                                  np.asarray(overlapped(xq, wq, xs, ws), np.float32))


@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_fp8_overlap_two_gpus_bit_identical(collective, transport):
    """Over 2 GPUs a sum of two bf16 partials rounds once in any order: bit-identical."""
    mesh = _mesh(2)
    m, n, kl = SHAPES[0]
    config = _config(collective, 2, transport, m, n, kl)
    xq, xs, wq, ws = _operands(m, kl * 2, n, seed=7)
    overlapped, baseline, _ = _calls(mesh, collective, config)
    np.testing.assert_array_equal(np.asarray(overlapped(xq, wq, xs, ws), np.float32),
                                  np.asarray(baseline(xq, wq, xs, ws), np.float32))


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_fp8_overlap_grad_and_vmap(collective):
    """jax.grad through the overlapped fp8 call equals the baseline's gradient up to one e4m3
    step (the same float32 rule on both sides; the forward's sum order does not enter it), and a
    vmapped x (rows folded into one overlapped call) equals the baseline per element."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, kl = SHAPES[0]
    config = _config(collective, tp, "nccl", m, n, kl)
    xq, xs, wq, ws = _operands(m, kl * tp, n, seed=3)
    rs = collective == "reduce_scatter"

    def loss_of(f):
        def loss(x, w, a, b):
            s = jnp.sum(f(x, w, a, b).astype(jnp.float32))
            return jax.lax.psum(s, "tp") if rs else s
        return loss

    def fp8_call(x, w, a, b):
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                        config=config, x_scale=a, w_scale=b)

    def base_call(x, w, a, b):
        y = fo_jax.matmul(x, w, x_scale=a, w_scale=b, config=config)
        return fo_jax.reference.apply_collective(y, "tp", collective)

    specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(), P()),
                 out_specs=(P(None, "tp"), P("tp", None), P(), P()))
    g = jax.jit(jax.shard_map(jax.grad(loss_of(fp8_call), argnums=(0, 1, 2, 3)), **specs))(
        xq, wq, xs, ws)
    g_base = jax.jit(jax.shard_map(jax.grad(loss_of(base_call), argnums=(0, 1, 2, 3)),
                                   **specs))(xq, wq, xs, ws)
    for a, b in zip(g[:2], g_base[:2]):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.all(np.abs(a - b) <= 2.0**-3 * np.abs(b) + 2.0**-9)
    for a, b in zip(g[2:], g_base[2:]):
        np.testing.assert_allclose(float(a), float(b), rtol=1e-3)

    xb = jnp.stack([xq[: m // 2], xq[m // 2:]])  # 2 elements of m / 2 rows
    vspecs = dict(mesh=mesh, in_specs=(P(None, None, "tp"), P("tp", None), P(), P()),
                  out_specs=P(None, "tp", None) if rs else P())
    yv = jax.jit(jax.shard_map(jax.vmap(fp8_call, in_axes=(0, None, None, None)), **vspecs))(
        xb, wq, xs, ws)
    yv_base = jax.jit(jax.shard_map(jax.vmap(base_call, in_axes=(0, None, None, None)),
                                    **vspecs))(xb, wq, xs, ws)
    # Element e is rows [e * m / 2, (e + 1) * m / 2) of the whole product: the same partials.
    bound = _sum_order_bound(_calls(mesh, collective, config)[2](xq, wq, xs, ws), tp)
    err = np.abs(np.asarray(yv, np.float64) - np.asarray(yv_base, np.float64))
    assert yv.shape == (2, m // 2, n) and np.all(err <= bound.reshape(2, m // 2, n))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_fp8_all_gather_matches_fp8_gemm_per_device_rows(shared, overlap):
    """collective="all_gather" (XLA's all-gather of the fp8 x, then fo_jax's fp8 GEMM): with one
    scale for the axis (quantize_fp8(axis_name=)), one GEMM on the gathered rows; with a scale
    per device, one GEMM per device's rows. Either way each output row is the fp8 kernel's
    product of that row with its own device's scale: bit-identical to fo_jax.matmul of that
    device's rows alone (the same kernel, tile configuration and rounding). overlap: opted in
    (OverlapConfig(all_gather="overlap")), the shared scale takes the overlapped all-gather with
    the fp8 consumer GEMM."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, k, n = 1024, 2048, 1024 * tp
    kx, kw = jax.random.split(jax.random.key(60))
    x = 2.0 * jax.random.normal(kx, (tp * m, k), jnp.float32)
    wq, ws = fo_jax.quantize_fp8(0.05 * jax.random.normal(kw, (k, n), jnp.float32))
    cfg = fo_jax.OverlapConfig(gemm_config="fp8_coop_128x128x128_c1", allow_fallback=False,
                               all_gather="overlap" if overlap else None)

    def body(x, w, b):
        xq, xs = fo_jax.quantize_fp8(x, axis_name="tp" if shared else None)
        y = fo_jax.overlapped_matmul(xq, w, axis_name="tp", collective="all_gather",
                                     x_scale=xs, w_scale=b, config=cfg)
        return y, xq, xs[None]

    y, xq, xs = jax.jit(jax.shard_map(
        body, mesh=mesh, in_specs=(P("tp", None), P(None, "tp"), P()),
        out_specs=(P(None, "tp"), P("tp", None), P("tp"))))(x, wq, ws)
    assert y.dtype == jnp.bfloat16 and y.shape == (tp * m, n)
    for d in range(tp):
        rows = slice(d * m, (d + 1) * m)
        want = fo_jax.matmul(xq[rows], wq, x_scale=xs[d], w_scale=ws,
                             config=fo_jax.OverlapConfig(gemm_config="fp8_coop_128x128x128_c1",
                                                         allow_fallback=False))
        np.testing.assert_array_equal(np.asarray(y[rows]), np.asarray(want), err_msg=f"rows of {d}")


@pytest.mark.parametrize("rows,n,k,bands", [(512, 768, 1024, 1), (1024, 392, 256, 4),
                                            (256, 4096, 2048, 2)])
def test_fp8_all_gather_one_rank_call_bit_identical(rows, n, k, bands):
    """The overlapped fp8 all-gather's whole CUDA call over a one-rank group (one GPU): the
    gathered x is x, and the fp8 consumer GEMM's product is bit-identical to fo_jax's plain fp8
    GEMM of the same configuration, call after call (the band flags are zeroed and set again).
    NCCL's transport: the copy engine's needs two ranks."""
    import functools

    from fo_jax import _plan
    from fo_jax._cuda_ops import all_gather_matmul_fp8_cuda

    mesh = _mesh(1)
    config = fo_jax.OverlapConfig(all_gather="overlap", num_groups=bands, transport="nccl",
                                  allow_fallback=False)
    plan = _plan.plan_overlap("test", "all_gather", 1, E4M3, rows, n, k, config, "nccl")
    assert plan.gemm.config_name.startswith("fp8_coop_"), plan
    f = jax.jit(jax.shard_map(
        functools.partial(all_gather_matmul_fp8_cuda, axis_name="tp", plan=plan), mesh=mesh,
        in_specs=(P(), P(), P(), P()), out_specs=(P(), P()), check_vma=False))
    xq, xs, wq, ws = _operands(rows, k, n, seed=rows + n)
    want = fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws, config=fo_jax.OverlapConfig(
        gemm_config=plan.gemm.config_name, allow_fallback=False))
    want = np.asarray(want)
    w_nk = jnp.asarray(wq.T)
    for _ in range(50):
        y, g = f(xq, w_nk, xs, ws)
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(xq).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(y), want)
