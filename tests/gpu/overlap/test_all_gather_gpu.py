"""The overlapped all-gather + GEMM (OverlapConfig(all_gather="overlap")) on GPUs.

One GPU: the copy-engine transport's data path with the GPU playing the receiving rank of 2 to 8
(the senders' rows in its memory, pushed by the transport's own copy-graph launches and flag writes,
in its arrival order, each sender late), against the plain GEMM bit for bit (bf16, fp16 and fp8,
whose bands move as bytes), and with one sender released instead (its rows and the product's rows
from them all NaN, the rest exact); and the whole call (the FFI handler, the own rows copied into
the gathered output, the band flags zeroed and set in stream order, the consumer GEMM waiting on
them) over a 1-rank group, against fo_jax's plain GEMM of the same tile configuration:
bit-identical, call after call. 2 or 4 GPUs: both transports (NCCL, and the copy engine where the
GPUs have peer access) against XLA's all_gather followed by fo_jax's plain GEMM of the same
configuration (bit-identical: the consumer changes only the tile visit order), bf16/fp16, shapes
with several bands per rank and odd N and K, 1000 back-to-back calls, XLA's own collectives in the
same jit, and gradients through the paired VJPs against the reference's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import gpu_devices_or_skip, tp_or_skip
from numerics import assert_close, random_operands

pytestmark = pytest.mark.gpu


def _mesh(n):
    devs = gpu_devices_or_skip(n)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    return Mesh(np.array(devs), ("tp",))


def _config(bands=None, **extra):
    # Test shapes are small: without allow_fallback=False they would take XLA's path.
    return fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False, num_groups=bands,
                                **extra)


def _plan(size, rows, n, k, dtype, config, transport="nccl"):
    from fo_jax import _plan as plan_mod

    return plan_mod.plan_overlap("test", "all_gather", size, jnp.dtype(dtype), rows, n, k, config,
                                 transport)


TRANSPORTS = ["nccl", "copy_engine"]


def _transport_config(bands, transport, tp):
    """The opted-in config on `transport`; skips the copy engine where it cannot run."""
    from fo_jax import _transport

    if transport == "copy_engine":
        problem = _transport.all_gather_copy_engine_problem(tp)
        if problem is not None:
            pytest.skip(problem)
    return _config(bands, transport=transport)


def _plain_gemm(g, w, config_name):
    """fo_jax's plain GEMM of the named configuration (the consumer's own tile math)."""
    return fo_jax.matmul(g, w, config=fo_jax.OverlapConfig(gemm_config=config_name,
                                                           allow_fallback=False))


@pytest.mark.parametrize("dtype,ranks,rank,rows,n,k,bands,config", [
    (dtype, *case) for dtype in ("bfloat16", "float16") for case in [
        (2, 0, 512, 768, 1024, 1, ""),
        (4, 1, 1024, 392, 136, 4, ""),        # odd N and K, 4 bands per rank
        (4, 3, 512, 4096, 2048, 2, "pp_128x192x64_c2"),
        (8, 5, 256, 1024, 512, 1, "pp_128x128x64_c1"),
    ]] + [  # fp8 (the bands move as bytes; K a multiple of 16; the consumer configs' tiles)
    ("float8_e4m3fn", 2, 1, 512, 768, 1024, 1, ""),
    ("float8_e4m3fn", 4, 2, 1024, 392, 144, 4, "fp8_coop_128x128x128_c1"),
    ("float8_e4m3fn", 4, 0, 512, 4096, 2048, 2, "fp8_coop_128x192x128_c2"),
])
def test_copy_engine_data_path_on_one_gpu(ranks, rank, rows, n, k, bands, config, dtype):
    from fo_jax import _cuda

    gpu_devices_or_skip(1)
    got = _cuda.module().all_gather_copy_check(
        ranks=ranks, rank=rank, rows=rows, n=n, k=k, bands_per_rank=bands, dtype=dtype,
        config=config, calls=5, delay_us=300, seed=ranks * 100 + rank)
    assert got["error"] == "" and not got["timed_out"], got
    assert got["gathered_equal"], got
    assert got["product_equal"] and got["mismatches"] == 0, got


# sm_budget 0: the check's default (all SMs but 16, for the other senders' same-GPU copies);
# "all": two ranks and the sender released, so nothing pushes and the GEMM holds every SM while
# it waits: the release's fill must need none.
@pytest.mark.parametrize("dtype,ranks,rank,released,rows,n,k,bands,config,sm_budget", [
    ("bfloat16", 2, 0, 1, 512, 768, 1024, 1, "", "all"),
    ("float16", 2, 1, 0, 1024, 4096, 2048, 2, "pp_128x192x64_c2", "all"),
    ("float16", 4, 1, 3, 1024, 392, 136, 4, "", 0),
    ("bfloat16", 4, 3, 0, 512, 4096, 2048, 2, "pp_128x192x64_c2", 0),
    ("bfloat16", 8, 5, 2, 256, 1024, 512, 1, "pp_128x128x64_c1", 0),
    ("float8_e4m3fn", 2, 1, 0, 512, 768, 1024, 1, "", "all"),
    ("float8_e4m3fn", 4, 0, 2, 512, 4096, 2048, 2, "fp8_coop_128x192x128_c2", 0),
    ("float8_e4m3fn", 4, 2, 1, 1024, 392, 144, 4, "fp8_coop_128x128x128_c1", 0),
])
def test_a_released_sender_reads_as_nan_rows_on_one_gpu(dtype, ranks, rank, released, rows, n,
                                                       k, bands, config, sm_budget):
    """Reliability: a sender whose bands will not come (it never reached the call, or could not
    enqueue its copies) is released by the transport's EnqueueBandRelease, over gathered rows
    holding finite stale values: its gathered rows and the product's rows from them are all NaN
    in every call, every other row exactly as without the release."""
    from fo_jax import _cuda

    devs = gpu_devices_or_skip(1)
    budget = devs[0].core_count if sm_budget == "all" else sm_budget
    got = _cuda.module().all_gather_copy_check(
        ranks=ranks, rank=rank, rows=rows, n=n, k=k, bands_per_rank=bands, dtype=dtype,
        config=config, sm_budget=budget, calls=3, delay_us=300, seed=ranks * 10 + released,
        released_sender=released)
    assert got["error"] == "" and not got["timed_out"], got
    assert got["released_gathered_nan"] and got["released_product_nan"], got
    assert got["gathered_equal"], got
    assert got["product_equal"] and got["mismatches"] == 0, got


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("rows,n,k,bands", [(512, 768, 1024, None), (1024, 392, 136, 4),
                                            (256, 4096, 2048, 2)])
def test_one_rank_call_is_bit_identical_to_the_plain_gemm(rows, n, k, bands, dtype):
    from fo_jax._cuda_ops import all_gather_matmul_cuda

    mesh = _mesh(1)
    plan = _plan(1, rows, n, k, dtype, _config(bands))
    f = jax.jit(jax.shard_map(
        functools.partial(all_gather_matmul_cuda, axis_name="tp", plan=plan), mesh=mesh,
        in_specs=(P(), P()), out_specs=(P(), P()), check_vma=False))
    plain = jax.jit(functools.partial(_plain_gemm, config_name=plan.gemm.config_name))
    rng = np.random.default_rng(rows + n)
    x, w, _, _ = random_operands(rng, rows, k, n, dtype)
    expect = np.asarray(plain(x, w))
    for _ in range(100):  # the flags are zeroed and set again by every call
        y, g = f(x, w)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(y), expect)


def _ag_fn(mesh, config):
    def body(x, w):
        return fo_jax.all_gather_matmul(x, w, axis_name="tp", config=config)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
                                 out_specs=(P(None, "tp"), P("tp", None))))


def _expected(mesh, x, w, config_name):
    """XLA's all_gather, then fo_jax's plain GEMM of the consumer's configuration."""
    def body(x, w):
        g = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
        return _plain_gemm(g, w, config_name), g

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
                                 out_specs=(P(None, "tp"), P("tp", None))))(x, w)


SHAPES = [  # rows per rank, N per rank, K, bands per rank
    (512, 1024, 2048, None),
    (1024, 392, 136, 2),
    (2048, 4096, 1024, 4),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("rows,n,k,bands", SHAPES)
def test_all_gather_is_bit_identical(rows, n, k, bands, dtype, transport):
    tp = tp_or_skip()
    mesh = _mesh(tp)
    config = _transport_config(bands, transport, tp)
    plan = _plan(tp, rows, n, k, dtype, config, transport)
    rng = np.random.default_rng(rows * tp + n)
    x, w, x64, w64 = random_operands(rng, rows * tp, k, n * tp, dtype)
    y, g = _ag_fn(mesh, config)(x, w)
    y_ref, g_ref = _expected(mesh, x, w, plan.gemm.config_name)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(g_ref))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ref))
    assert_close(y, x64 @ w64, dtype)


def test_describe_on_gpus():
    tp = tp_or_skip()
    mesh = _mesh(tp)
    seen = {}

    def body(x, w):
        seen["on"] = fo_jax.describe(x, w, axis_name="tp", collective="all_gather",
                                     config=_config())
        seen["off"] = fo_jax.describe(x, w, axis_name="tp", collective="all_gather")
        return x

    x = jnp.zeros((512 * tp, 1024), jnp.bfloat16)
    w = jnp.zeros((1024, 1024 * tp), jnp.bfloat16)
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
                          out_specs=P("tp", None))).trace(x, w)
    assert seen["on"].path == "cuda" and seen["on"].transport in ("nccl", "copy_engine")
    assert seen["off"].path == "xla" and "opt-in" in seen["off"].reason


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_thousand_calls_with_xla_collectives_in_one_jit(transport):
    """1000 calls in a row, each jit also running XLA's own psum and all_gather around the
    overlapped call (shared NCCL resources, XLA's buffers reused across calls; on the copy
    engine more calls than its ring of "call started" events)."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    config = _transport_config(2, transport, tp)
    rows, n, k = 512, 512, 1024
    plan = _plan(tp, rows, n, k, jnp.bfloat16, config, transport)

    def body(x, w):
        y, g = fo_jax.all_gather_matmul(x, w, axis_name="tp", config=config)
        s = jax.lax.psum(jnp.sum(x.astype(jnp.float32)), "tp")
        g2 = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
        # The largest difference on any device (pmax: one value for P() on every device).
        diff = jnp.max(jnp.abs(g.astype(jnp.float32) - g2.astype(jnp.float32)))
        return y, g, s, jax.lax.pmax(diff, "tp")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
                              out_specs=(P(None, "tp"), P("tp", None), P(), P())))
    rng = np.random.default_rng(11)
    xs = [random_operands(rng, rows * tp, k, n * tp, jnp.bfloat16)[:2] for _ in range(4)]
    expects = [_expected(mesh, x, w, plan.gemm.config_name)[0] for x, w in xs]
    outs = []
    for i in range(1000):
        x, w = xs[i % 4]
        outs.append(f(x, w))
    for i, (y, _, _, diff) in enumerate(outs[-8:]):
        assert float(diff) == 0.0
        np.testing.assert_array_equal(np.asarray(y), np.asarray(expects[(1000 - 8 + i) % 4]))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_grads_through_the_paired_vjps(dtype, transport):
    """all_gather_matmul's VJP (dx through GEMM + reduce-scatter) and the reduce-scatter's (dx
    through the opted-in all-gather + GEMM) against the reference ops' gradients on the same
    GPUs."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    config = _transport_config(None, transport, tp)
    rows, n, k = 1024, 1024, 2048
    rng = np.random.default_rng(5)
    x, w1, _, _ = random_operands(rng, rows * tp, k, n * tp, dtype)
    w2 = jnp.asarray(rng.standard_normal((n * tp, k)) / np.sqrt(n * tp), dtype)

    def loss(use_fo):
        def f(x, w1, w2):
            if use_fo:
                h, _ = fo_jax.all_gather_matmul(x, w1, axis_name="tp", config=config)
                y = fo_jax.overlapped_matmul(h, w2, axis_name="tp", config=config)
            else:
                h, _ = fo_jax.reference.all_gather_matmul(x, w1, "tp")
                y = fo_jax.reference.overlapped_matmul(h, w2, "tp", "reduce_scatter")
            return jax.lax.psum(jnp.sum(jnp.square(y.astype(jnp.float32))), "tp")
        return f

    def run(use_fo):
        g = jax.value_and_grad(loss(use_fo), argnums=(0, 1, 2))
        return jax.jit(jax.shard_map(g, mesh=mesh,
                                     in_specs=(P("tp", None), P(None, "tp"), P("tp", None)),
                                     out_specs=(P(), (P("tp", None), P(None, "tp"),
                                                      P("tp", None)))))(x, w1, w2)

    (v, grads), (v_ref, grads_ref) = run(True), run(False)
    np.testing.assert_allclose(float(v), float(v_ref), rtol=5e-2)
    for got, ref in zip(grads, grads_ref):
        assert_close(got, np.asarray(ref, np.float64), dtype, factor=4.0)
