"""dev/mma_twin_report.py: a row against its MMA-loop twins per shape (time ratio, difference per
tile and SM and per k-tile), on a hand-built sweep, and the figures docs/gemm_performance.md
quotes from the committed sweeps ("The order of release and promotion")."""

import os

import pytest
from conftest import dev_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
C1, C1_OWN = "fp8_coop_128x128x128_c1", "fp8_coop_128x128x128_c1_own_mma"


def _report():
    return dev_script("mma_twin_report")


def _load(name):
    import json

    with open(os.path.join(RESULTS, name)) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_the_difference_per_tile_counts_the_waves_and_k_tiles():
    report = _report()
    base = dict(method="fo_jax.gemm", M=1024, N=2048, K=1000, sms=100)
    # 8 x 16 = 128 tiles of 128x128 on 100 SMs: 2 waves; K = 1000: 8 k-tiles.
    found = report.comparisons([dict(base, config=C1, ms=0.100),
                                dict(base, config=C1_OWN, ms=0.104),
                                dict(base, method="xla.dot", config=None, ms=0.09)])
    assert len(found) == 1
    d = found[0]
    assert (d["row"], d["twin"], d["k_tiles"]) == (C1, C1_OWN, 8)
    assert d["ratio"] == pytest.approx(1.04)
    assert d["us_per_tile"] == pytest.approx(2.0)
    assert d["ns_per_k_tile"] == pytest.approx(250.0)
    assert report.comparisons([dict(base, config=C1, ms=0.1)]) == []


def test_the_documented_figures_of_cooperative_128x128():
    report = _report()
    found = report.comparisons(_load("gemm_sweep_h200_2026-12-02_453b8b9_fp8refit.jsonl"), C1)
    assert {d["twin"] for d in found} == {C1_OWN} and len(found) == 33
    g = {label: v for (_, label), (v, _) in report.geomeans(found).items()}
    assert g == pytest.approx({"K <= 2048": 0.953, "2048 < K <= 4096": 1.023,
                               "K > 4096": 1.096}, abs=5e-4)
    short = [d for d in found if d["shape"][2] <= 2048]
    long_ = [d for d in found if d["shape"][2] >= 6656]
    assert all(-0.325 <= d["us_per_tile"] <= -0.195 for d in short)
    assert all(26.5 <= d["ns_per_k_tile"] <= 55.5 for d in long_)
    k16384 = [d["us_per_tile"] for d in found if d["shape"][2] == 16384]
    assert min(k16384) >= 5.8 and max(k16384) <= 7.1


def test_the_documented_figures_of_cooperative_128x192():
    report = _report()
    found = {d["shape"]: d for d in report.comparisons(
        _load("gemm_sweep_h200_2026-12-02_336b43f_mma.jsonl"), "fp8_coop_128x192x128_c2")}
    # The twin is CUTLASS's mma(): what fo_jax's saves per tile.
    assert found[(16384, 8192, 2048)]["us_per_tile"] == pytest.approx(0.36, abs=0.005)
    assert found[(16384, 8192, 7168)]["us_per_tile"] == pytest.approx(0.24, abs=0.005)


def test_the_documented_figures_of_the_late_release():
    # The three forms of cooperative 128x128 in one trace at 8192x7168xK (the row then ran
    # CUTLASS's mma(); its late-release twin is the form it has taken since).
    report = _report()
    found = report.comparisons(_load("gemm_sweep_h200_2026-12-02_11b4856_c1loops.jsonl"), C1)
    late = {d["shape"][2]: d["ratio"] for d in found if d["twin"] == C1 + "_late_release"}
    own = {d["shape"][2]: d["ratio"] for d in found if d["twin"] == C1_OWN}
    assert sorted(late) == sorted(own) == [512, 1024, 2048, 4096, 8192]
    assert late == pytest.approx({512: 0.915, 1024: 0.957, 2048: 0.978, 4096: 0.989,
                                  8192: 0.999}, abs=5e-4)
    assert own == pytest.approx({512: 0.930, 1024: 0.934, 2048: 0.961, 4096: 1.011,
                                 8192: 1.135}, abs=5e-4)


def test_the_documented_figures_of_cooperative_128x192_in_the_late_order():
    # The row (fo_jax's mma(), its own early release) and its two twins in one trace at
    # 8192x7168xK: the late order is slower at every K, CUTLASS's loop more so.
    report = _report()
    c2 = "fp8_coop_128x192x128_c2"
    found = report.comparisons(_load("gemm_sweep_h200_2026-12-02_24be962_c2loops.jsonl"), c2)
    late, cutlass = ({d["shape"][2]: d for d in found if d["twin"] == c2 + suffix}
                     for suffix in ("_late_release", "_cutlass_mma"))
    assert sorted(late) == sorted(cutlass) == [512, 1024, 2048, 4096, 8192]
    assert {k: d["ratio"] for k, d in late.items()} == pytest.approx(
        {512: 1.013, 1024: 1.010, 2048: 1.009, 4096: 1.006, 8192: 1.005}, abs=5e-4)
    assert {k: d["ratio"] for k, d in cutlass.items()} == pytest.approx(
        {512: 1.110, 1024: 1.064, 2048: 1.037, 4096: 1.020, 8192: 1.013}, abs=5e-4)
    assert all(0.045 <= d["us_per_tile"] <= 0.195 for d in late.values())
    assert all(2.5 <= d["ns_per_k_tile"] <= 12.5 for d in late.values())
    assert late[8192]["ns_per_k_tile"] == pytest.approx(3, abs=0.5)
    # What the row's own loop saves against CUTLASS's: flat per tile, not shrinking with K.
    assert all(0.365 <= d["us_per_tile"] <= 0.455 for d in cutlass.values())
    assert cutlass[8192]["us_per_tile"] == pytest.approx(0.45, abs=0.005)
    assert cutlass[8192]["ns_per_k_tile"] == pytest.approx(7, abs=0.5)
