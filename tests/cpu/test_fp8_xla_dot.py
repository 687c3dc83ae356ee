"""fo_jax.matmul hands an fp8 GEMM whose weight is stored [N, K] to XLA's fp8 dot where the
measured table says that is faster for the call's accumulation (fo_jax/_gemm_choice.py,
points_key; fo_jax/_xla_fp8.py): the choice and its reason per accumulation, the weight layouts
and configs that keep fo_jax's kernel, the DEBUG log, the program built for CUDA (XLA's fp8 dot
at precision HIGHEST for fp32 promotion, DEFAULT for fast accumulation, the scales' product
applied to its bfloat16 output in bfloat16) and the reference result on the CPU. CPU only: each test
installs its own table; the choice and lowering tests need the compiled CUDA module (they lower
for "cuda")."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from conftest import use_gemm_table
from fo_jax import _gemm_choice, _paths

E4M3 = jnp.float8_e4m3fn
FAST = fo_jax.OverlapConfig(fp8_fast_accumulation=True)
# x[M, K] @ w[K, N] as (M, N, K). XLA is faster at XLA_SHAPE for fp32 promotion only, and at
# FAST_SHAPE for fast accumulation only; FO_SHAPE has no measured neighbour within RADIUS.
XLA_SHAPE = (4096, 4096, 512)
FAST_SHAPE = (512, 1280, 8192)
FO_SHAPE = (64, 64, 128)
POINTS = {"float8_e4m3fn": ((*XLA_SHAPE, 0.78), (*FAST_SHAPE, 1.10)),
          "float8_e4m3fn_fast": ((*XLA_SHAPE, 1.05), (*FAST_SHAPE, 0.60))}
GEMM_CALL = re.compile(r"@fo_jax_gemm\w*\(")

needs_fp8_module = pytest.mark.skipif(
    not fo_jax.cuda_module_available(),
    reason="CUDA module not built here (copy _fo_jax_cuda*.so into fo_jax/)")


@pytest.fixture
def table(monkeypatch):
    return use_gemm_table(monkeypatch, points=POINTS)


def operands(shape, w_transposed=True):
    m, n, k = shape
    x = jax.ShapeDtypeStruct((m, k), E4M3)
    w = jax.ShapeDtypeStruct((n, k) if w_transposed else (k, n), E4M3)
    s = jax.ShapeDtypeStruct((), jnp.float32)
    return x, w, s, s


def matmul(w_transposed=True, config=None):
    return lambda x, w, a, b: fo_jax.matmul(x, w, x_scale=a, w_scale=b,
                                            w_transposed=w_transposed, config=config)


def test_points_key_per_accumulation():
    assert _gemm_choice.points_key(E4M3) == "float8_e4m3fn"
    assert _gemm_choice.points_key(E4M3, fast=True) == "float8_e4m3fn_fast"
    assert _gemm_choice.points_key(jnp.bfloat16, fast=True) == "bfloat16"


def test_each_accumulation_reads_its_own_points(table):
    assert _gemm_choice.prefer_xla_dot(*XLA_SHAPE, E4M3)
    assert not _gemm_choice.prefer_xla_dot(*XLA_SHAPE, E4M3, fast=True)
    assert _gemm_choice.prefer_xla_dot(*FAST_SHAPE, E4M3, fast=True)
    assert not _gemm_choice.prefer_xla_dot(*FAST_SHAPE, E4M3)
    assert not _gemm_choice.prefer_xla_dot(*FO_SHAPE, E4M3)
    assert not _gemm_choice.prefer_xla_dot(*XLA_SHAPE, jnp.bfloat16)  # no bfloat16 points


@needs_fp8_module
def test_choice_and_reason(table):
    c = _paths.choose_fp8("matmul", None, *XLA_SHAPE, "cuda", plain_nk=True)
    assert c.path == "xla", c
    assert c.reason == ("XLA's fp8 dot at precision HIGHEST (fp32 promotion, as fo_jax's "
                        "default) measured faster around M=4096, N=4096, K=512 (float8_e4m3fn: "
                        "fo_jax's fp8 GEMM at ~0.78x of its speed on test GPU)"), c
    fast = _paths.choose_fp8("matmul", FAST, *FAST_SHAPE, "cuda", plain_nk=True)
    assert fast.path == "xla" and "XLA's fp8 dot (fast accumulation, as asked)" in fast.reason
    # A [K, N] weight, a named configuration, allow_fallback=False, the overlap's producer
    # (no plain_nk) or a shape without measured neighbours keep fo_jax's kernel.
    for config, plain_nk, shape in ((None, False, XLA_SHAPE), (None, True, FO_SHAPE),
                                    (fo_jax.OverlapConfig(allow_fallback=False), True, XLA_SHAPE),
                                    (fo_jax.OverlapConfig(gemm_config="fp8_coop_128x128x128_c1"),
                                     True, XLA_SHAPE),
                                    (FAST, True, XLA_SHAPE)):
        c = _paths.choose_fp8("matmul", config, *shape, "cuda", plain_nk=plain_nk)
        assert c.path == "cuda" and c.reason.startswith("fo_jax's fp8 GEMM"), (config, shape, c)
    assert _paths.choose_fp8("matmul", None, *XLA_SHAPE, "cpu", plain_nk=True).path == "reference"


@needs_fp8_module
def test_debug_log_says_xla_and_why(table, monkeypatch, caplog):
    from fo_jax import _checks

    monkeypatch.setattr(_checks, "trace_platform", lambda: "cuda")
    with caplog.at_level(logging.DEBUG, logger="fo_jax"):
        jax.jit(matmul()).trace(*operands(XLA_SHAPE))
    logged = [r.getMessage() for r in caplog.records if "fo_jax.matmul x" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "path='xla'" in logged[0] and "precision HIGHEST" in logged[0], logged


@needs_fp8_module
def test_describe_without_axis_name_says_which_fp8_dot(table, monkeypatch):
    from fo_jax import _checks

    monkeypatch.setattr(_checks, "trace_platform", lambda: "cuda")
    x, w, _, _ = operands(XLA_SHAPE)
    c = fo_jax.describe(x, w, w_transposed=True)
    assert (c.op, c.path) == ("matmul", "xla") and "precision HIGHEST" in c.reason, c
    x, w, _, _ = operands(FAST_SHAPE)
    c = fo_jax.describe(x, w, w_transposed=True, config=FAST)
    assert c.path == "xla" and "fast accumulation, as asked" in c.reason, c
    # A [K, N] weight keeps fo_jax's kernel, as in the op.
    x, w, _, _ = operands(XLA_SHAPE, w_transposed=False)
    assert fo_jax.describe(x, w).path == "cuda"


def cuda_text(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@needs_fp8_module
def test_cuda_program_holds_xla_fp8_dot_of_the_same_accumulation(table):
    m, n, k = XLA_SHAPE
    text = cuda_text(matmul(), *operands(XLA_SHAPE))
    assert not GEMM_CALL.search(text)
    # XLA's fp8 dot of the fp8 operands to bf16 at HIGHEST (cuBLASLt's fp8 GEMM, as the
    # benchmarks' baseline), then the scales' product, rounded to bf16, applied in bf16: the
    # form XLA folds into the GEMM. The product never goes through float32, whose multiply XLA
    # leaves to a second kernel over the whole output.
    dot = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dot) == 1 and "precision = [HIGHEST, HIGHEST]" in dot[0], dot
    assert (f"(tensor<{m}x{k}xf8E4M3FN>, tensor<{n}x{k}xf8E4M3FN>) -> tensor<{m}x{n}xbf16>"
            in dot[0]), dot
    assert "stablehlo.multiply %arg2, %arg3 : tensor<f32>" in text
    assert "(tensor<f32>) -> tensor<bf16>" in text
    assert re.search(rf"stablehlo.multiply %\w+, %\w+ : tensor<{m}x{n}xbf16>", text), text
    assert f"{m}x{n}xf32" not in text
    fast = cuda_text(matmul(config=FAST), *operands(FAST_SHAPE))
    dot = [line for line in fast.splitlines() if "dot_general" in line]
    assert not GEMM_CALL.search(fast) and len(dot) == 1 and "HIGHEST" not in dot[0], dot
    # fo_jax's kernel where the table says so, and on a [K, N] weight.
    assert len(GEMM_CALL.findall(cuda_text(matmul(config=FAST), *operands(XLA_SHAPE)))) == 1
    assert len(GEMM_CALL.findall(cuda_text(matmul(False), *operands(XLA_SHAPE, False)))) == 1


@needs_fp8_module
def test_grad_and_vmap_of_a_handed_over_call_lower(table):
    def loss(x, w, a, b):
        return jnp.sum(matmul()(x, w, a, b).astype(jnp.float32))

    args = operands(XLA_SHAPE)
    text = cuda_text(jax.grad(loss, argnums=(2, 3)), *args)
    assert not GEMM_CALL.search(text)
    m, n, k = XLA_SHAPE
    batched = (jax.ShapeDtypeStruct((2, m // 2, k), E4M3), *args[1:])
    text = cuda_text(jax.vmap(matmul(), in_axes=(0, None, None, None)), *batched)
    assert not GEMM_CALL.search(text) and f"-> tensor<{m}x{n}xbf16>" in text


def test_the_cpu_result_is_the_dequantized_product(monkeypatch):
    rng = np.random.default_rng(5)
    m, n, k = 32, 48, 64
    (xq, xs), (wq, ws) = (fo_jax.quantize_fp8(jnp.asarray(rng.standard_normal(s), jnp.float32))
                          for s in ((m, k), (n, k)))
    use_gemm_table(monkeypatch, points={"float8_e4m3fn": ((m, n, k, 0.5),)})
    got = np.asarray(jax.jit(matmul())(xq, wq, xs, ws), np.float64)
    want = (np.asarray(xq, np.float64) * float(xs)) @ (np.asarray(wq, np.float64) * float(ws)).T
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
