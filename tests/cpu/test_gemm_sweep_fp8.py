"""benchmarks/bench_gemm_sweep.py in fp8: its methods compute the product they are timed for (on
CPU, where fo_jax.matmul is XLA's dot), and the report reads the fp8 target from the rows: the
three ratios and their floor from 4096 rows on (rows built by hand)."""

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_gemm_sweep  # noqa: E402
import gemm_sweep_report  # noqa: E402

FP8 = "float8_e4m3fn"


@pytest.mark.parametrize("m,n,k", [(64, 48, 256), (8, 128, 96)])
def test_fp8_methods_match_the_dequantized_product(m, n, k):
    dtype = jnp.dtype(FP8)
    args = bench_gemm_sweep.operands(m, n, k, dtype, seed=3)
    xq, wq, xs, ws = args
    assert xq.shape == (m, k) and wq.shape == (n, k)  # the weight stored [N, K]
    assert xq.dtype == dtype and wq.dtype == dtype and xs.dtype == jnp.float32
    ref = bench_gemm_sweep.reference(args, dtype)
    assert ref.shape == (m, n) and ref.dtype == jnp.bfloat16
    exact = (np.asarray(xq, np.float64) * float(xs)) @ (np.asarray(wq, np.float64).T * float(ws))
    assert np.linalg.norm(np.asarray(ref, np.float64) - exact) <= 1e-2 * np.linalg.norm(exact)
    names = [name for name, _, _ in bench_gemm_sweep.methods_for(dtype, m, n, k, [], False)]
    assert names == ["xla.dot", "xla.dot_fp32acc", "fo_jax.matmul", "fo_jax.matmul_fast"]
    for name, _, f in bench_gemm_sweep.methods_for(dtype, m, n, k, [], False):
        y = f(*args)
        assert y.shape == (m, n) and y.dtype == jnp.bfloat16, name
        err = float(np.linalg.norm(np.asarray(y, np.float64) - exact) / np.linalg.norm(exact))
        assert err <= bench_gemm_sweep.TOLERANCE[FP8], (name, err)


def test_16_bit_operands_have_no_fp8_reference():
    args = bench_gemm_sweep.operands(16, 8, 32, jnp.dtype(jnp.bfloat16), seed=0)
    assert len(args) == 2 and bench_gemm_sweep.reference(args, jnp.dtype(jnp.bfloat16)) is None


def _rows(times: dict) -> list:
    """Rows of one fp8 run: times {(M, N, K): (xla.dot, xla.dot_fp32acc, fo_jax.matmul,
    fo_jax.matmul_fast)} in ms."""
    out = []
    for (m, n, k), ms in times.items():
        for method, v in zip(["xla.dot", "xla.dot_fp32acc", "fo_jax.matmul",
                              "fo_jax.matmul_fast"], ms):
            out.append(dict(suite="gemm_sweep", device="NVIDIA H200", date="2026-11-30",
                            commit="abc", dtype=FP8, M=m, N=n, K=k, layer="", method=method,
                            config="fp8fast_pp" if method.endswith("fast") else "fp8_coop",
                            ms=v))
    return out


def test_report_reads_the_fp8_target_from_4096_rows_on():
    rows = _rows({
        (2048, 4096, 512): (0.010, 0.020, 0.020, 0.009),   # 0.5x, but under 4096 rows
        (8192, 4096, 512): (0.050, 0.060, 0.054, 0.040),   # default 0.926x: under the floor
        (8192, 8192, 7168): (0.500, 0.700, 0.450, 0.420),
    })
    md = gemm_sweep_report.markdown(rows)
    assert "| HIGHEST / fo_jax | xla / fast |" in md
    assert "| 8192x4096x512 |  | fp8_coop | 0.0500 | 0.0540 | 0.926 | fp8fast_pp | 0.0600 |" \
           " 0.0400 | 1.111 | 1.250 |" in md
    what_default, what_acc, what_fast = (what for what, _, _ in gemm_sweep_report.FP8_PAIRS)
    assert (f"{what_default}, M >= 4096 (2 shapes): min 0.926x at 8192x4096x512; under 0.95x: "
            "8192x4096x512 (0.926x).") in md
    assert f"{what_acc}, M >= 4096 (2 shapes): min 1.111x at 8192x4096x512; under 0.95x: none." \
        in md
    assert f"{what_fast}, M >= 4096 (2 shapes): min 1.190x at 8192x8192x7168; under 0.95x: " \
           "none." in md
    # over all three shapes, the 2048-row one included
    assert f"{what_default}: geomean **" in md and "over 3 shapes, min 0.500x" in md


def test_report_of_16_bit_rows_has_no_fp8_columns():
    rows = [dict(dtype="bfloat16", M=4096, N=4096, K=4096, layer="", method=meth, config=None,
                 ms=v, device="d", date="x", commit="c")
            for meth, v in (("xla.dot", 0.2), ("fo_jax.matmul", 0.19))]
    md = gemm_sweep_report.markdown(rows)
    assert "HIGHEST" not in md and "fo_jax.matmul: geomean **1.053x** over 1 shapes" in md


def test_report_reads_the_best_fp8_row_per_accumulation():
    rows = _rows({(8192, 4096, 512): (0.050, 0.060, 0.054, 0.040)})
    for config, ms in (("fp8_coop_128x128x128_c1", 0.058), ("fp8_coop_128x192x128_c2/k2", 0.048),
                       ("fp8fast_pp_128x192x128_c2", 0.041), ("fp8fast_pp_128x128x128_c1", 0.045)):
        rows.append(dict(rows[0], method="fo_jax.gemm", config=config, ms=ms))
    md = gemm_sweep_report.markdown(rows)
    # fp32 promotion's best (the split row) against HIGHEST, fast's best against XLA's default
    assert "| fp8_coop_128x192x128_c2/k2 | 1.250 | fp8fast_pp_128x192x128_c2 | 1.220 |" in md
    assert ("Best measured fp32-promotion configuration per shape against XLA at HIGHEST: "
            "geomean **1.250x**") in md
    assert ("Best measured fast-accumulation configuration per shape against XLA's default: "
            "geomean **1.220x**") in md
    # the 16-bit summaries, which would mix the two accumulations, are left out
    assert "Best measured config per shape" not in md and "without a split" not in md


def test_own_adds_fo_jax_own_kernels_of_both_accumulations():
    """--own in fp8: fo_jax.matmul with allow_fallback=False in both accumulations (fo_jax's
    kernel even where fo_jax.matmul hands the shape to XLA), computing the same product."""
    m, n, k = 64, 48, 256
    dtype = jnp.dtype(FP8)
    args = bench_gemm_sweep.operands(m, n, k, dtype, seed=5)
    methods = bench_gemm_sweep.methods_for(dtype, m, n, k, [], False, own=True)
    assert [name for name, _, _ in methods][4:] == ["fo_jax.own", "fo_jax.own_fast"]
    exact = (np.asarray(args[0], np.float64) * float(args[2])) @ (
        np.asarray(args[1], np.float64).T * float(args[3]))
    for name, _, f in methods[4:]:
        err = np.linalg.norm(np.asarray(f(*args), np.float64) - exact) / np.linalg.norm(exact)
        assert err <= bench_gemm_sweep.TOLERANCE[FP8], (name, err)
    assert not bench_gemm_sweep.FP8_OWN["fo_jax.own"].allow_fallback
    assert bench_gemm_sweep.FP8_OWN["fo_jax.own_fast"].fp8_fast_accumulation


def test_report_reads_fo_jax_own_fp8_kernels_like_with_like():
    rows = _rows({(8192, 4096, 512): (0.050, 0.060, 0.050, 0.050)})
    for method, config, ms in (("fo_jax.own", "fp8_coop_128x192x128_c2", 0.075),
                               ("fo_jax.own_fast", "fp8fast_pp_128x192x128_c2", 0.040)):
        rows.append(dict(rows[0], method=method, config=config, ms=ms))
    md = gemm_sweep_report.markdown(rows)
    assert "| own config | HIGHEST / own | own fast config | xla / own fast |" in md
    # HIGHEST 0.060 / own 0.075; default 0.050 / own fast 0.040
    assert "| fp8_coop_128x192x128_c2 | 0.800 | fp8fast_pp_128x192x128_c2 | 1.250 |" in md
    what_own, what_own_fast = (what for what, _, _ in gemm_sweep_report.FP8_OWN_PAIRS)
    assert f"{what_own}: geomean **0.800x**" in md
    assert f"{what_own_fast}, M >= 4096 (1 shapes): min 1.250x" in md
    assert "never XLA's dot)" not in md  # the 16-bit summary, which would read xla.dot / own


def test_report_flags_xla_fp8_rows_that_ran_more_than_their_gemm():
    """An XLA row whose main kernel took under MAIN_KERNEL_SHARE of its time is named: the
    baseline's scaling in a form XLA does not fold into its GEMM adds a kernel and slows it.
    Rows without kernel_share (older files) and fo_jax's rows are not read."""
    rows = _rows({(8192, 4096, 512): (0.073, 0.082, 0.050, 0.040),
                  (8192, 8192, 7168): (0.500, 0.700, 0.450, 0.420)})
    share = {(512, "xla.dot"): 0.48, (512, "xla.dot_fp32acc"): 0.52, (512, "fo_jax.matmul"): 0.5}
    for r in rows:
        r["kernel_share"] = share.get((r["K"], r["method"]), 0.99)
    md = gemm_sweep_report.markdown(rows)
    assert ("**XLA's time is not its GEMM alone** (main kernel under 90% of the time) at 2 rows: "
            "8192x4096x512 xla.dot (0.48), 8192x4096x512 xla.dot_fp32acc (0.52).") in md
    for r in rows:
        r["kernel_share"] = 0.99
    assert "not its GEMM alone" not in gemm_sweep_report.markdown(rows)
    for r in rows:
        del r["kernel_share"]
    assert "not its GEMM alone" not in gemm_sweep_report.markdown(rows)
