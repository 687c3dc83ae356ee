"""fo_jax.matmul hands a GEMM to XLA's dot where the measured table says XLA's is faster
(fo_jax/_gemm_choice.py, prefer_xla_dot): describe() and the DEBUG log say so and why, the program
built for CUDA holds XLA's dot instead of fo_jax's GEMM there (the backward GEMMs chosen one by
one), a tile configuration or allow_fallback=False keeps fo_jax's GEMM, and the overlap's producer
always keeps it. CPU only: each test installs its own table; the lowering tests need the compiled
CUDA module (they lower for the "cuda" platform from CPU)."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh, use_gemm_table
from fo_jax import _checks, _cuda, _gemm_choice

BF16 = jnp.bfloat16
# x[M, K] @ w[K, N] as (M, N, K). The table below says XLA's dot is faster at XLA_SHAPE and
# fo_jax's GEMM at DX_SHAPE, the shape of XLA_SHAPE's dx GEMM (dy[M, N] @ w^T[N, K]); FO_SHAPE,
# and XLA_SHAPE's dw GEMM (x^T[K, M] @ dy[M, N]), have no measured neighbour within RADIUS.
XLA_SHAPE = (512, 1024, 2048)
DX_SHAPE = (512, 2048, 1024)
DW_SHAPE = (2048, 1024, 512)
FO_SHAPE = (4096, 4096, 4096)
POINTS = {"bfloat16": ((*XLA_SHAPE, 0.70), (*DX_SHAPE, 1.20))}
# fo_jax's GEMM custom calls in a lowered program (any version of its FFI target names).
GEMM_CALL = re.compile(r"@fo_jax_gemm\w*\(")


@pytest.fixture
def table(monkeypatch):
    """The XLA points above (no fitted tile model: the kernel library's rule picks tiles)."""
    return use_gemm_table(monkeypatch, points=POINTS)


@pytest.fixture
def on_cuda(monkeypatch, table):
    """describe() and the DEBUG log as on a CUDA device with the module loaded (they only read
    the platform and the module's availability: nothing here runs a CUDA kernel)."""
    monkeypatch.setattr(_checks, "trace_platform", lambda: "cuda")
    monkeypatch.setattr(_cuda, "module_available", lambda: True)


def operands(shape, dtype=BF16):
    m, n, k = shape
    return jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype)


def test_the_table_sends_exactly_the_forward_gemm_to_xla(table):
    assert _gemm_choice.prefer_xla_dot(*XLA_SHAPE, BF16)
    for shape in (DX_SHAPE, DW_SHAPE, FO_SHAPE):
        assert not _gemm_choice.prefer_xla_dot(*shape, BF16), shape
    assert not _gemm_choice.prefer_xla_dot(*XLA_SHAPE, jnp.float16)  # no float16 points


def _describe_size_one(shape, config=None, collective="reduce_scatter"):
    mesh = cpu_mesh((1,), ("tp",))
    seen = {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective=collective,
                                         config=config)
        return x @ w

    x, w = operands(shape)
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P())).trace(x, w)
    return seen["choice"]


def test_describe_size_one_says_xla_and_why(on_cuda):
    for collective in ("reduce_scatter", "all_reduce"):
        c = _describe_size_one(XLA_SHAPE, collective=collective)
        assert (c.path, c.platform, c.axis_size) == ("xla", "cuda", 1), c
        assert c.reason.startswith("axis of size 1, the collective is the identity: XLA's dot "
                                   "measured faster around M=512, N=1024, K=2048 (bfloat16"), c
        # Its own point (0.70), a reading beyond the runs' noise, decides alone (DX_SHAPE's
        # 1.20 is in reach too).
        assert "~0.70x of its speed on test GPU" in c.reason, c
    assert _describe_size_one(FO_SHAPE).path == "cuda"


def test_a_tile_config_or_no_fallback_keeps_fo_jax_gemm(on_cuda):
    for config in (fo_jax.OverlapConfig(allow_fallback=False),
                   fo_jax.OverlapConfig(gemm_config="pp_128x128x64_c1")):
        c = _describe_size_one(XLA_SHAPE, config)
        assert c.path == "cuda" and c.reason.endswith("fo_jax's GEMM on CUDA devices"), c
    c = _describe_size_one(XLA_SHAPE, fo_jax.OverlapConfig(force_reference=True))
    assert c.path == "reference", c


def test_the_overlap_producer_keeps_fo_jax_gemm(on_cuda, table, monkeypatch):
    # An all-reduce over 2 GPUs whose per-GPU GEMM the table sends to XLA, long enough for the
    # overlap (estimated GEMM >= 250 us): fo_jax's kernel runs it (it signals its tiles).
    shape = (8192, 8192, 2048)
    monkeypatch.setattr(table, "XLA_POINTS", {"bfloat16": ((*shape, 0.5),)})
    assert _gemm_choice.prefer_xla_dot(*shape, BF16)
    mesh = cpu_mesh((2,), ("tp",))
    seen = {}
    config = fo_jax.OverlapConfig(transport="nccl")

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective="all_reduce",
                                         config=config)
        return x @ w

    m, n, k = shape
    x = jax.ShapeDtypeStruct((m, 2 * k), BF16)
    w = jax.ShapeDtypeStruct((2 * k, n), BF16)
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                          out_specs=P(), check_vma=False)).trace(x, w)
    c = seen["choice"]
    assert (c.path, c.transport, c.axis_size) == ("cuda", "nccl", 2), c


def test_describe_without_axis_name_describes_matmul(on_cuda):
    c = fo_jax.describe(*operands(XLA_SHAPE))
    assert (c.op, c.path, c.platform, c.collective, c.axis_size) == \
        ("matmul", "xla", "cuda", None, None), c
    assert c.reason.startswith("XLA's dot measured faster around M=512, N=1024, K=2048 "
                               "(bfloat16"), c
    # Leading dimensions of x join the rows, as in the op.
    m, n, k = XLA_SHAPE
    batched = jax.ShapeDtypeStruct((2, m // 2, k), BF16)
    assert fo_jax.describe(batched, operands(XLA_SHAPE)[1]).path == "xla"
    assert fo_jax.describe(*operands(FO_SHAPE)).path == "cuda"
    for config in (fo_jax.OverlapConfig(allow_fallback=False),
                   fo_jax.OverlapConfig(gemm_config="pp_128x128x64_c1")):
        c = fo_jax.describe(*operands(XLA_SHAPE), config=config)
        assert c.path == "cuda" and c.reason == "fo_jax's GEMM on CUDA devices", c


def test_describe_of_matmul_is_what_the_debug_log_says(on_cuda, caplog):
    # Paths whose tracing needs no CUDA module (fo_jax's own GEMM plans with the module's list).
    forced = fo_jax.OverlapConfig(force_reference=True)
    for shape, config in ((XLA_SHAPE, None), (FO_SHAPE, forced)):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="fo_jax"):
            # A fresh function each time: jit's trace cache would skip the log.
            jax.jit(lambda x, w: fo_jax.matmul(x, w, config=config)).trace(*operands(shape))
        logged = [r.getMessage() for r in caplog.records if "fo_jax.matmul x" in r.getMessage()]
        described = fo_jax.describe(*operands(shape), config=config)
        assert len(logged) == 1 and str(described) in logged[0], logged


def test_describe_of_matmul_validates_like_matmul(on_cuda):
    x, w = operands(XLA_SHAPE)
    with pytest.raises(TypeError, match="collective='all_reduce' needs axis_name"):
        fo_jax.describe(x, w, collective="all_reduce")
    with pytest.raises(ValueError, match="contraction sizes differ"):
        fo_jax.describe(x, jax.ShapeDtypeStruct((w.shape[1], w.shape[0]), BF16))
    with pytest.raises(TypeError, match="w_transposed applies to float8_e4m3fn operands only"):
        fo_jax.describe(x, w, w_transposed=True)


def test_debug_log_of_matmul_says_xla_and_why(on_cuda, caplog):
    x, w = operands(XLA_SHAPE)
    with caplog.at_level(logging.DEBUG, logger="fo_jax"):
        jax.jit(fo_jax.matmul).trace(x, w)
    logged = [r.getMessage() for r in caplog.records if "fo_jax.matmul x" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "path='xla'" in logged[0] and "XLA's dot measured faster around M=512" in logged[0]


def test_matmul_on_cpu_still_computes_x_at_w(table):
    rng = np.random.default_rng(3)
    m, n, k = XLA_SHAPE
    x = jnp.asarray(rng.standard_normal((m, k)) / np.sqrt(k), BF16)
    w = jnp.asarray(rng.standard_normal((k, n)), BF16)
    got = np.asarray(jax.jit(fo_jax.matmul)(x, w), np.float64)
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------------
# The program built for CUDA (needs the compiled module)
# --------------------------------------------------------------------------------------------
def cuda_text(f, *args) -> str:
    if not fo_jax.cuda_module_available():
        pytest.skip("CUDA module not built here (copy _fo_jax_cuda*.so into fo_jax/)")
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_cuda_program_holds_xla_dot_where_the_table_prefers_it(table):
    m, n, _ = XLA_SHAPE
    text = cuda_text(fo_jax.matmul, *operands(XLA_SHAPE))
    assert not GEMM_CALL.search(text)
    # XLA's dot in the input dtype (one rounding, as users write x @ w), not the reference's
    # float32 product and separate conversion.
    assert "dot_general" in text and f"tensor<{m}x{n}xf32>" not in text
    assert len(GEMM_CALL.findall(cuda_text(fo_jax.matmul, *operands(FO_SHAPE)))) == 1


def test_cuda_program_of_the_backward_chooses_per_gemm(table):
    def loss(x, w):
        return jnp.sum(fo_jax.matmul(x, w).astype(jnp.float32))

    grad = jax.value_and_grad(loss, argnums=(0, 1))  # the value keeps the forward GEMM
    # Forward to XLA; dx and dw on fo_jax's GEMM.
    assert len(GEMM_CALL.findall(cuda_text(grad, *operands(XLA_SHAPE)))) == 2
    assert len(GEMM_CALL.findall(cuda_text(grad, *operands(FO_SHAPE)))) == 3


def test_cuda_program_of_an_overlapped_call_over_one_device(table):
    mesh = cpu_mesh((1,), ("tp",))

    def f(x, w):
        return jax.shard_map(
            lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp",
                                                  collective="reduce_scatter"),
            mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P("tp", None))(x, w)

    assert not GEMM_CALL.search(cuda_text(f, *operands(XLA_SHAPE)))
    assert len(GEMM_CALL.findall(cuda_text(f, *operands(FO_SHAPE)))) == 1
