"""The fp8 benchmarks compare XLA's fp8 dot with fo_jax's on the same stored weight: XLA's fp8 dot
on a [K, N] weight takes 1.3-3.2x as long as on [N, K] (one H200), so a comparison across layouts
times different work (docs/gemm_performance.md, "fp8"). On CPU (fo_jax's reference path): which
operands each method reads, and that every fp8 method of bench_fp8_overlap.py computes the same
product in both layouts. The fo_jax methods of bench_fp8.py time fo_jax's kernels, also where the
GPU model's table hands fo_jax.matmul to XLA."""

import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_fp8  # noqa: E402
import bench_fp8_overlap  # noqa: E402

import fo_jax  # noqa: E402
from conftest import cpu_devices, use_gemm_table  # noqa: E402


def test_bench_fp8_compares_xla_and_fo_jax_on_one_layout():
    keys = {method: key for dtype, method, key, _, _ in bench_fp8.methods([])
            if dtype == "float8_e4m3fn"}
    # the ratio columns: XLA's two precisions against fo_jax.matmul_wt and fo_jax.matmul_fast
    assert keys["xla.dot"] == keys["xla.dot_fp32acc"] == "fp8_t"
    assert keys["fo_jax.matmul_wt"] == keys["fo_jax.matmul_fast"] == "fp8_t"
    ops = bench_fp8.operands(32, 48, 64, seed=0)
    xq, wq, xs, ws = ops["fp8"]
    assert ops["fp8_t"][1].shape == (48, 64) and wq.shape == (64, 48)
    ref = np.asarray(bench_fp8.xla_fp8_dot(*ops["fp8_t"]), np.float64)
    exact = (np.asarray(xq, np.float64) * float(xs)) @ (np.asarray(wq, np.float64) * float(ws))
    assert np.linalg.norm(ref - exact) <= 1e-2 * np.linalg.norm(exact)


FP8_METHODS = ("fo_jax", "fo_jax.fast", "fo_jax.fp8_then_xla", "jax.baseline")


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "all_gather"])
def test_bench_fp8_overlap_methods_agree_in_both_layouts(collective):
    mesh = Mesh(np.array(cpu_devices(2)), ("tp",))
    m, n, k = 64, 32, 64
    out = {}
    for layout in ("kn", "nk"):
        ops = bench_fp8_overlap.operands(mesh, collective, m, n, k, seed=1, w_layout=layout)
        wq = ops[1]
        kn_shape = (k, 2 * n) if collective == "all_gather" else (2 * k, n)
        assert wq.shape == (kn_shape if layout == "kn" else kn_shape[::-1])
        assert wq.sharding.spec == bench_fp8_overlap.weight_spec(collective, layout)
        for method in FP8_METHODS:
            y = bench_fp8_overlap.build(mesh, collective, method, layout)(*ops)
            out[layout, method] = np.asarray(jax.device_get(y), np.float64)
    ref = out["kn", "jax.baseline"]
    for (layout, method), y in out.items():
        assert y.shape == ref.shape, (layout, method)
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert err < 2e-2, (layout, method, err)


@pytest.mark.skipif(not fo_jax.cuda_module_available(),
                    reason="CUDA module not built here (copy _fo_jax_cuda*.so into fo_jax/)")
def test_bench_fp8_times_fo_jax_kernels_where_the_table_hands_over(monkeypatch):
    # A table that sends this shape to XLA in every dtype and accumulation: the benchmark's
    # fo_jax methods must still run fo_jax's GEMM (its ratio columns are over fo_jax's kernels).
    m, n, k = 512, 1024, 2048
    use_gemm_table(monkeypatch, points={key: ((m, n, k, 0.5),) for key in
                                        ("bfloat16", "float8_e4m3fn", "float8_e4m3fn_fast")})
    bf16 = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    s = jax.ShapeDtypeStruct((), jnp.float32)
    e4m3 = jnp.float8_e4m3fn
    fp8 = {"fp8": (jax.ShapeDtypeStruct((m, k), e4m3), jax.ShapeDtypeStruct((k, n), e4m3), s, s),
           "fp8_t": (jax.ShapeDtypeStruct((m, k), e4m3), jax.ShapeDtypeStruct((n, k), e4m3), s, s)}
    ops = {"bf16": bf16, **fp8}
    fo = [(method, key, f) for _, method, key, f, _ in bench_fp8.methods([])
          if method.startswith("fo_jax")]
    assert len(fo) == 4, fo
    for method, key, f in fo:
        text = jax.jit(f).trace(*ops[key]).lower(lowering_platforms=("cuda",)).as_text()
        assert re.search(r"@fo_jax_gemm\w*\(", text), method


def test_bench_fp8_report_rebuilds_the_markdown_of_a_run_cut_short(tmp_path):
    # A run past its call's limit keeps the shapes it finished in its .jsonl; --report writes
    # the markdown the run would have, its ratios from those rows.
    base = dict(suite="gemm_fp8", device="NVIDIA H200", num_devices=1, date="2026-11-30",
                commit="abc1234", fo_jax_version="0.1.0", jax_version="0.11.2", M=4096, N=8192,
                K=2048)
    times = {("bfloat16", "xla.dot"): 0.24, ("bfloat16", "fo_jax.matmul"): 0.25,
             ("float8_e4m3fn", "xla.dot"): 0.12, ("float8_e4m3fn", "xla.dot_fp32acc"): 0.13,
             ("float8_e4m3fn", "fo_jax.matmul"): 0.14, ("float8_e4m3fn", "fo_jax.matmul_wt"): 0.125,
             ("float8_e4m3fn", "fo_jax.matmul_fast"): 0.1}
    rows = [dict(base, dtype=d, method=m, config=None, ms=ms) for (d, m), ms in times.items()]
    rows.append(dict(base, M=8192, dtype="bfloat16", method="xla.dot", config=None, ms=None,
                     error="timed out"))
    path = tmp_path / "gemm_fp8_h200_2026-11-30_abc1234.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = (tmp_path / os.path.basename(bench_fp8.report(str(path)))).read_text()
    assert "commit abc1234" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 4096 |"))
    # fp32acc over fo_jax (w [N, K]), XLA over fast, bf16 over fp8 (w [N, K]) and over fast
    assert "| 1.040 | 1.200 | 2.000 | 2.500 |" in line, line
    assert "| 8192 |" in md  # the shape without times keeps its row, with dashes
