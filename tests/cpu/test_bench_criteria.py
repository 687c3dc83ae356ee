"""The overlap report's distance to the bound (ms / max(gemm_only, comm_only)) and its PASS/FAIL
lines (fo_jax/bench/criteria.py), on synthetic rows: the numbers of a real run are not needed to
check the arithmetic and the thresholds."""

import pytest

from fo_jax.bench import criteria, report

SHAPES = ["4096x8192x2048", "8192x8192x2048", "8192x8192x7168", "16384x8192x7168",
          "16384x8192x2048"]


def _rows(collective, per_shape, tp=4):
    """per_shape: {shape: {method: ms}} -> bench rows."""
    rows = []
    for shape, methods in per_shape.items():
        m, n, k = (int(v) for v in shape.split("x"))
        for method, ms in methods.items():
            rows.append(dict(collective=collective, M=m, N=n, K=k, method=method, ms=ms, tp=tp))
    return rows


def _uniform(fo, base, gemm=0.30, comm=0.20, key_ms=None):
    out = {}
    for s in SHAPES:
        out[s] = {"fo_jax": fo, "jax.baseline": base, "fo_jax.sequential": gemm + comm,
                  "gemm_only": gemm, "comm_only": comm}
    if key_ms is not None:
        out["8192x8192x2048"]["fo_jax"] = key_ms
    return out


def _verdicts(lines):
    return [ln for ln in lines if ln.startswith(("PASS", "FAIL"))]


def test_over_bound_is_time_over_the_larger_part():
    assert criteria.over_bound(0.33, {"gemm_only": 0.30, "comm_only": 0.20}) == pytest.approx(1.1)
    assert criteria.over_bound(0.33, {"gemm_only": 0.10, "comm_only": 0.30}) == pytest.approx(1.1)
    assert criteria.over_bound(0.33, {"gemm_only": 0.30}) is None  # comm_only failed
    assert criteria.over_bound(None, {"gemm_only": 0.3, "comm_only": 0.2}) is None


def test_reduce_scatter_passes_at_the_thresholds():
    rows = _rows("reduce_scatter", _uniform(fo=0.40, base=0.40 * 1.43, key_ms=0.40))
    lines = criteria.summary(rows)
    assert lines[0].startswith("reduce_scatter: fo_jax geomean speedup over jax.baseline ")
    assert "8192x8192x2048 0.4000 ms" in lines[0] and "slower than jax.baseline: none" in lines[0]
    v = _verdicts(lines)
    assert len(v) == 3 and all(ln.startswith("PASS reduce_scatter") for ln in v), v


def test_reduce_scatter_fails_each_criterion_alone():
    slow_geo = criteria.summary(_rows("reduce_scatter", _uniform(0.40, 0.40 * 1.40, key_ms=0.40)))
    assert [ln[:4] for ln in _verdicts(slow_geo)] == ["FAIL", "PASS", "PASS"]
    slow_key = criteria.summary(_rows("reduce_scatter", _uniform(0.30, 0.60, key_ms=0.49)))
    assert [ln[:4] for ln in _verdicts(slow_key)] == ["PASS", "PASS", "FAIL"]
    assert "measured 0.4900 ms" in _verdicts(slow_key)[2]
    per = _uniform(0.30, 0.60, key_ms=0.40)
    per["16384x8192x2048"]["fo_jax"] = 0.61  # one shape slower than the baseline
    v = _verdicts(criteria.summary(_rows("reduce_scatter", per)))
    assert v[1].startswith("FAIL") and "16384x8192x2048" in v[1]


def test_all_reduce_threshold_and_a_missing_pair_fails():
    assert all(ln.startswith("PASS") for ln in
               _verdicts(criteria.summary(_rows("all_reduce", _uniform(0.5, 0.5 * 1.28)))))
    per = _uniform(0.5, 0.5 * 1.5)
    del per["4096x8192x2048"]["fo_jax"]  # fo_jax failed there: no time row
    v = _verdicts(criteria.summary(_rows("all_reduce", per)))
    assert v[0].startswith("FAIL") and "no fo_jax / jax.baseline pair for 4096x8192x2048" in v[0]


def test_all_gather_needs_every_shape_within_ten_percent_of_the_bound():
    ok = criteria.summary(_rows("all_gather", _uniform(0.33, 0.33 * 1.36, gemm=0.30)))
    v = _verdicts(ok)
    assert len(v) == 3 and all(ln.startswith("PASS all_gather") for ln in v), v
    per = _uniform(0.33, 0.33 * 1.36, gemm=0.30)
    per["8192x8192x7168"]["fo_jax"] = 0.34  # 1.13x the bound, still faster than the baseline
    v = _verdicts(criteria.summary(_rows("all_gather", per)))
    assert v[2].startswith("FAIL all_gather: every shape within 10%") and "8192x8192x7168" in v[2]
    assert "worst ms / bound 1.13 (8192x8192x7168)" in criteria.summary(_rows("all_gather", per))[0]


def test_markdown_has_the_bound_column_and_the_verdicts():
    rows = (_rows("reduce_scatter", _uniform(0.40, 0.60, key_ms=0.40))
            + _rows("all_gather", _uniform(0.33, 0.40, gemm=0.30)))
    md = report.markdown(rows, "title", None)
    assert "| ms / bound |" in md.splitlines()[2]
    assert "| all_gather | 4096x8192x2048 | fo_jax | 0.330 | 1.21x | 0.85 | 1.10 |" in md
    assert "| reduce_scatter | 4096x8192x2048 | gemm_only | 0.300 | 2.00x | - | 1.00 |" in md
    assert "PASS reduce_scatter: 8192x8192x2048 <= 0.48 ms" in md
    assert "FAIL all_gather: geomean speedup >= 1.35x (measured 1.212x)" in md


def test_single_gpu_rows_get_no_verdicts():
    rows = [dict(collective="all_gather", M=64, N=48, K=32, method=m, ms=0.1, tp=1)
            for m in ("fo_jax", "jax.baseline")]
    assert "Criteria" not in report.markdown(rows, "title", None)


def _layouts(collective, one, many, processes=4):
    """{shape: ms} of one process and of `processes` -> rows of both runs."""
    rows = []
    for layout, per_shape in ((1, one), (processes, many)):
        for shape, ms in per_shape.items():
            m, n, k = (int(v) for v in shape.split("x"))
            rows.append(dict(collective=collective, M=m, N=n, K=k, method="fo_jax", ms=ms,
                             processes=layout))
            rows.append(dict(collective=collective, M=m, N=n, K=k, method="jax.baseline",
                             ms=2 * ms, processes=layout))
    return rows


def test_processes_within_five_percent_of_one_process():
    one = {s: 1.0 for s in SHAPES}
    many = dict(one, **{SHAPES[2]: 1.049, SHAPES[3]: 0.952})
    rows = _layouts("reduce_scatter", one, many) + _layouts("all_reduce", one, dict(
        one, **{SHAPES[0]: 1.06}))
    lines = criteria.processes_summary(rows, 4)
    assert lines[0].startswith("PASS reduce_scatter: fo_jax in 4 processes within 5%")
    assert "worst +4.9% at 8192x8192x7168" in lines[0]
    assert lines[1].startswith("FAIL all_reduce") and "worst +6.0% at 4096x8192x2048" in lines[1]
    compared = criteria.processes_comparison(rows)
    assert len(compared) == 10 and all(c[2] == 1.0 for c in compared)


def test_processes_summary_names_what_is_missing_and_is_not_judged_off_gpus():
    one = {s: 1.0 for s in SHAPES}
    many = {s: 1.0 for s in SHAPES}
    rows = _layouts("reduce_scatter", one, many)
    rows = [r for r in rows if not (r["processes"] == 1 and r["M"] == 4096)]  # failed there
    lines = criteria.processes_summary(rows, 4)
    assert lines == ["FAIL reduce_scatter: fo_jax in 4 processes within 5% of one process on "
                     "every shape (worst +0.0% at 8192x8192x2048) (no time in both layouts: "
                     "4096x8192x2048)"]
    cpu = criteria.processes_summary(_layouts("all_reduce", one, many), 2, platform="cpu")
    assert cpu[0].startswith("NOT CHECKED all_reduce: fo_jax in 2 processes") and "cpu" in cpu[0]
    # Nothing timed in N processes (the copy engine refused every call): a FAIL, not a PASS.
    nothing = [r for r in _layouts("all_reduce", one, many) if r["processes"] == 1]
    nothing.append(dict(collective="all_reduce", M=4096, N=8192, K=2048, method="fo_jax",
                        ms=None, processes=4))
    assert criteria.processes_summary(nothing, 4)[0].startswith("FAIL all_reduce")
