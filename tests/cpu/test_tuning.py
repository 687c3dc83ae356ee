"""CPU tests of fo_jax.tuning (pipeline model, cache, the search on a simulated GPU) and of the
tune CLI without GPUs (the bench CLI: tests/cpu/test_tools.py).

The model cases are computed by hand in the comments.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import fo_jax
from fo_jax import _plan
from fo_jax.tuning import cache
from fo_jax.tuning.model import (Candidate, CommCurve, GemmTiming, group_work, pick_curve,
                                 pipeline_seconds, predict_seconds)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The subprocesses import the fo_jax this process imported (a source tree or an install).
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))
BF16 = jnp.bfloat16


def curve(seconds_per_1e5_bytes: float, latency: float = 0.0) -> CommCurve:
    return CommCurve(latency, 1e5 / seconds_per_1e5_bytes)


# --- pipeline model --------------------------------------------------------------------------

def test_one_group_runs_gemm_then_collective():
    # 100 tiles on 50 SMs: 2 waves of 100 us -> ready at 200 us = GEMM end; start 205 us
    # (latency 5 us); comm = 10 us + 1e5 B / 1e9 B/s = 110 us -> 315 us.
    t = pipeline_seconds([100], [1e5], 50, 1e-4, CommCurve(1e-5, 1e9), latency_s=5e-6)
    assert t == pytest.approx(315e-6)


def test_gemm_bound_hides_all_but_the_last_collective():
    # 4 groups of one wave (100 us) each; comm 10 us each, finished before the next group is
    # ready. Last group ready at 400 us, +5 us latency, +10 us comm -> 415 us.
    t = pipeline_seconds([50] * 4, [1e5] * 4, 50, 1e-4, curve(1e-5), latency_s=5e-6)
    assert t == pytest.approx(415e-6)


def test_comm_bound_chains_the_collectives():
    # GEMM ends at 40 us; each comm takes 100 us. g0 ready 10 us, starts 15 us, ends 115 us;
    # each next one starts 5 us after the previous ends: 15 + 4 * 100 + 3 * 5 = 430 us.
    t = pipeline_seconds([50] * 4, [1e5] * 4, 50, 1e-5, curve(1e-4), latency_s=5e-6)
    assert t == pytest.approx(430e-6)


def test_partial_waves_and_contention_with_the_gemm():
    # 2 groups of 50 tiles on 50 SMs, 100 us waves: GEMM ends at 200 us. While the GEMM runs the
    # collective takes 200 us (busy), after it 100 us (idle); no latency.
    # g0 starts 100 us, half done at 200 us, rest at the idle rate: ends 250 us.
    # g1 ready 200 us, starts 250 us (after g0), idle: ends 350 us.
    t = pipeline_seconds([50, 50], [1e5, 1e5], 50, 1e-4, curve(2e-4), curve(1e-4), 0.0)
    assert t == pytest.approx(350e-6)
    # A group of 30 tiles on 50 SMs is ready after 1 wave, the second (60 tiles) after 2.
    t = pipeline_seconds([30, 30], [1e5, 1e5], 50, 1e-4, curve(1e-5), latency_s=0.0)
    assert t == pytest.approx(210e-6)


def test_group_work_clips_the_last_tile_row():
    # 4 tile-rows of 128 over m = 500 rows, 2 tile-columns, batch 2 (reduce_scatter), bf16.
    tiles, nbytes = group_work((0, 2, 4), 128, 2, 500, 256, 2, 2)
    assert tiles == (8, 8)
    assert nbytes == (2 * 256 * 256 * 2, 2 * (500 - 256) * 256 * 2)


def test_predict_uses_the_curve_of_the_ctas_nccl_can_get():
    curves = {16: curve(2e-4), 32: curve(1e-4)}
    assert pick_curve(curves, 24) is curves[16] and pick_curve(curves, 8) is curves[16]
    gemm = GemmTiming(gemm_sms=116, wave_s=1e-5, tile_m=128, tile_n=256)
    m, n = 4096, 8192
    cand = Candidate(num_groups=4, sms_for_nccl=16, nccl_max_ctas=32)
    tiles, nbytes = group_work(_plan.uniform_groups(32, 4), 128, 32, m, n, 1, 2)
    want = pipeline_seconds(tiles, nbytes, 116, 1e-5, curves[16], curves[32], 5e-6)
    assert predict_seconds(cand, gemm, curves, m, n, 1) == pytest.approx(want)


def test_comm_curve_fit_recovers_latency_and_bandwidth():
    pts = [(b, 12e-6 + b / 300e9) for b in (16e6, 64e6, 256e6)]
    c = CommCurve.fit(pts)
    assert c.latency_s == pytest.approx(12e-6, rel=1e-6)
    assert c.bandwidth == pytest.approx(300e9, rel=1e-6)
    with pytest.raises(ValueError):
        CommCurve.fit([(1e6, 2e-3), (2e6, 1e-3)])


def test_gap_and_factor_fit_recovers_a_synthetic_truth():
    from fo_jax.tuning.model import fit_gap_and_factor

    curves = {32: CommCurve(15e-6, 330e9)}
    gemm = GemmTiming(gemm_sms=100, wave_s=30e-6, tile_m=128, tile_n=256)
    groups = (4, 2, 8)

    def predict(i, gap, f):
        return predict_seconds(Candidate(groups[i], 32, 32), gemm, curves, 1536, 8192, 4,
                               latency_s=gap, busy_factor=f)

    measured = [predict(i, 12e-6, 1.7) for i in range(3)]
    gap, f = fit_gap_and_factor(measured, predict)
    assert gap == pytest.approx(12e-6, rel=0.15) and f == pytest.approx(1.7, rel=0.1)


def test_pick_top_keeps_pairs_diverse():
    from fo_jax.tuning.search import pick_top

    ranked = [(t, Candidate(g, 32, 32)) for t, g in ((1.0, 4), (1.1, 6), (1.2, 8))]
    ranked += [(1.3, Candidate(4, 16, 32)), (1.4, Candidate(2, 32, 32))]
    assert pick_top(ranked, 3) == [Candidate(4, 32, 32), Candidate(6, 32, 32),
                                   Candidate(4, 16, 32)]


# --- cache -----------------------------------------------------------------------------------

@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cache, "nccl_version", lambda: "22803")
    return tmp_path / "fo_jax" / "tuning.json"


ENTRY = {"num_groups": 4, "sms_for_nccl": 32, "nccl_max_ctas": 16, "measured_ms": 0.6}


def _store(m=8192, n=8192, k=2048, collective="reduce_scatter", tp=4, nccl="22803"):
    key = cache.entry_key("NVIDIA H200", nccl, collective, m, n, k, BF16, tp)
    return cache.update("entries", key, ENTRY)


def test_cache_path_follows_xdg(tmp_cache, monkeypatch):
    assert cache.cache_path() == str(tmp_cache)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_path() == os.path.join(os.path.expanduser("~"), ".cache", "fo_jax",
                                              "tuning.json")


def test_keys_separate_every_field():
    keys = {cache.entry_key(*a) for a in [
        ("NVIDIA H200", "22803", "reduce_scatter", 8192, 8192, 2048, BF16, 4),
        ("NVIDIA H100", "22803", "reduce_scatter", 8192, 8192, 2048, BF16, 4),
        ("NVIDIA H200", "22703", "reduce_scatter", 8192, 8192, 2048, BF16, 4),
        ("NVIDIA H200", "22803", "all_reduce", 8192, 8192, 2048, BF16, 4),
        ("NVIDIA H200", "22803", "reduce_scatter", 4096, 8192, 2048, BF16, 4),
        ("NVIDIA H200", "22803", "reduce_scatter", 8192, 8192, 2048, jnp.float16, 4),
        ("NVIDIA H200", "22803", "reduce_scatter", 8192, 8192, 2048, BF16, 2)]}
    assert len(keys) == 7
    assert cache.entry_key("d", "1", "all_reduce", 1, 2, 3, "bfloat16", 2) == \
        cache.entry_key("d", "1", "all_reduce", 1, 2, 3, BF16, 2)


def test_write_then_lookup(tmp_cache):
    assert cache.lookup("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, BF16, 4) is None
    path = _store()
    assert path == str(tmp_cache) and tmp_cache.exists()
    got = cache.lookup("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, BF16, 4)
    assert got == {"num_groups": 4, "sms_for_nccl": 32, "nccl_max_ctas": 16}
    for miss in [("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, BF16, 2),
                 ("NVIDIA H200", "all_reduce", 8192, 8192, 2048, BF16, 4),
                 ("NVIDIA H100", "reduce_scatter", 8192, 8192, 2048, BF16, 4),
                 ("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, jnp.float16, 4)]:
        assert cache.lookup(*miss) is None
    _store(nccl="22703")  # another NCCL version: a separate entry, the first one unchanged
    assert len(json.loads(tmp_cache.read_text())["entries"]) == 2
    assert [p for p in os.listdir(tmp_cache.parent) if p.endswith(".json")] == ["tuning.json"]


def test_corrupt_or_foreign_file_reads_as_empty_and_is_replaced(tmp_cache):
    tmp_cache.parent.mkdir(parents=True)
    for junk in ("{not json", json.dumps({"version": 99, "entries": {}, "comm": {}}), "[1, 2]"):
        tmp_cache.write_text(junk)
        assert cache.load() == {"version": cache.VERSION, "entries": {}, "comm": {}}
        assert cache.lookup("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, BF16, 4) is None
    _store()
    data = json.loads(tmp_cache.read_text())
    assert data["version"] == cache.VERSION and len(data["entries"]) == 1
    got = cache.lookup("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, BF16, 4)
    assert got["num_groups"] == 4


def test_bad_entry_falls_back(tmp_cache):
    key = cache.entry_key("NVIDIA H200", "22803", "all_reduce", 64, 64, 64, BF16, 2)
    cache.update("entries", key, {"num_groups": 0, "sms_for_nccl": 16, "nccl_max_ctas": 16})
    assert cache.lookup("NVIDIA H200", "all_reduce", 64, 64, 64, BF16, 2) is None
    cache.update("entries", key, {"num_groups": "x"})
    assert cache.lookup("NVIDIA H200", "all_reduce", 64, 64, 64, BF16, 2) is None


def test_overlap_defaults_tries_the_cache_first(tmp_cache, monkeypatch):
    heuristic = _plan.heuristic_defaults("reduce_scatter", 8192, 8192, 2048)
    assert _plan.overlap_defaults("reduce_scatter", 8192, 8192, 2048) == heuristic
    _store()

    # The machine's own devices are replaced by fakes: the test means the same on CPU-only and
    # GPU machines (a real H200 would find the entry just stored).
    class FakeCpu:
        platform, device_kind = "cpu", "cpu"

    class FakeGpu:
        platform, device_kind = "gpu", "NVIDIA H200"

    # On CPU devices the cache is not consulted (it holds GPU choices).
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [FakeCpu()])
    assert _plan.overlap_defaults("reduce_scatter", 8192, 8192, 2048, BF16, 4) == heuristic
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [FakeGpu()])
    got = _plan.overlap_defaults("reduce_scatter", 8192, 8192, 2048, BF16, 4)
    assert got == {"num_groups": 4, "sms_for_nccl": 32, "nccl_max_ctas": 16}
    assert _plan.overlap_defaults("reduce_scatter", 8192, 8192, 2048, BF16, 8) == heuristic


def test_nccl_version_never_raises():
    assert isinstance(cache.nccl_version(), str)


# --- the tune CLI without GPUs ----------------------------------------------------------------

def _env(tmp_path) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH")) if p)
    env["XLA_FLAGS"] = ""
    return env


@pytest.mark.parametrize("module", ["fo_jax.tune", "fo_jax.tuning"])
def test_tune_without_gpus_exits_with_a_clear_message(tmp_path, module):
    p = subprocess.run([sys.executable, "-m", module, "--shapes", "256x256x256"],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "no GPUs" in p.stderr and "need 2 or more" in p.stderr, p.stderr


# --- the search on a simulated GPU -----------------------------------------------------------

def test_search_on_a_simulated_gpu(tmp_cache, monkeypatch):
    """calibrate + tune_shape with measurements replaced by a synthetic machine whose truth is
    the model with known curves and slowdowns: the fitted factors and the choice must match."""
    import types

    from fo_jax.bench import core as bench_core
    from fo_jax.tuning import measure, search

    true_curves = {8: CommCurve(25e-6, 180e9), 16: CommCurve(20e-6, 250e9),
                   32: CommCurve(15e-6, 330e9)}
    true_factor = {8: 6.0, 16: 4.0, 24: 2.5, 32: 1.2}  # by SMs left to NCCL
    wave = 27.5e-6

    def gemm_timing(dev, collective, m, n, k, tp, dtype, gemm_sms):
        batch = tp if collective == "reduce_scatter" else 1
        tiles = batch * -(-(m // batch) // 128) * -(-n // 256)
        w = wave * k / 2048
        return GemmTiming(gemm_sms, w, 128, 256, w * -(-tiles // gemm_sms), "cfg")

    def truth_ms(mesh, collective, operands, groups, gemm_sms, ctas, **_):
        m, n, k = operands
        tp = mesh.shape["tp"]
        batch = tp if collective == "reduce_scatter" else 1
        s = 132 - gemm_sms
        gemm = gemm_timing(None, collective, m, n, k, tp, None, gemm_sms)
        cand = Candidate(groups, s, ctas)
        return 1e3 * predict_seconds(cand, gemm, true_curves, m // batch, n, batch,
                                     busy_factor=true_factor.get(s, 1.0))

    def comm_points(mesh, collective, ctas, total_sms, dtype, memo):
        return [(b, true_curves[ctas].seconds(b) + 5e-6) for b in (16e6, 64e6, 256e6)]

    monkeypatch.setattr(search._cuda, "module", lambda: types.SimpleNamespace(
        max_gemm_groups=lambda: 16))
    monkeypatch.setattr(measure, "gemm_timing", gemm_timing)
    monkeypatch.setattr(measure, "overlapped_ms", truth_ms)
    monkeypatch.setattr(measure, "comm_points", comm_points)
    monkeypatch.setattr(bench_core, "random_operands", lambda mesh, m, n, k, dtype, seed=0:
                        (m, n, k))
    monkeypatch.setattr(bench_core, "build", lambda *a, **k: None)
    monkeypatch.setattr(bench_core, "time_ms", lambda f, *a, **k: 1.0)
    dev = types.SimpleNamespace(device_kind="NVIDIA H200")
    mesh = types.SimpleNamespace(shape={"tp": 4}, devices=types.SimpleNamespace(flat=[dev]))
    progress = search.Progress(100)
    curves, factors, gap = search.calibrate(mesh, "reduce_scatter", 132, BF16, progress)
    assert 1e-6 <= gap <= 20e-6, gap  # the truth is 5 us (absorbs the curves' extra 5 us)
    assert set(curves) == set(measure.NCCL_CTAS)
    # The fitted slowdowns (which also absorb the curves' extra 5 us) keep the truth's order.
    for c in measure.NCCL_CTAS:
        assert (factors[(8, c)] > factors[(16, c)] > factors[(24, c)] > factors[(32, c)] > 1.0), \
            factors
    entry = search.tune_shape(mesh, "reduce_scatter", 8192, 8192, 2048, BF16, curves, factors,
                              gap, 132, 3, progress)
    ok = [r for r in entry["candidates"] if r["measured_ms"] is not None]
    assert len(ok) >= 3 and entry["measured_ms"] == min(r["measured_ms"] for r in ok)
    assert entry["median_abs_error"] < 0.10
    assert cache.lookup("NVIDIA H200", "reduce_scatter", 8192, 8192, 2048, BF16, 4) == {
        k: entry[k] for k in ("num_groups", "sms_for_nccl", "nccl_max_ctas")}
    # A second calibration reads the cache: no measurement at all.
    monkeypatch.setattr(measure, "overlapped_ms", None)
    monkeypatch.setattr(measure, "comm_points", None)
    assert search.calibrate(mesh, "reduce_scatter", 132, BF16, progress) == (curves, factors,
                                                                             gap)
