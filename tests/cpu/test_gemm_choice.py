"""CPU tests of the GEMM choice (fo_jax/_gemm_choice.py) and of its fit (dev/fit_gemm_table.py):
wave counting, the SM budget, the model's argmin and its ties, the XLA predicate, the fallback
to the kernel library's rule without a table, a fit of a synthetic sweep end to end, and what the
committed table decides (the design shapes, small M, the copy-engine ring's configuration)."""

import functools
import importlib.util
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from conftest import dev_script, gemm_config_table, use_gemm_table
from fo_jax import _gemm_choice, _gemm_tables, _plan
from fo_jax.config import OverlapConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BF16 = jnp.dtype(jnp.bfloat16)
F16 = jnp.dtype(jnp.float16)


def cfg(name, tm, tn, cm, addends=False, tk=64):
    return dict(name=name, tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=cm, cluster_n=1,
                pingpong=True, takes_addends=addends)


BIG = cfg("pp_128x192x64_c2", 128, 192, 2, addends=True)
MID = cfg("pp_128x128x64_c1", 128, 128, 1)
SMALL = cfg("pp_64x128x64_c2", 64, 128, 2)
CONFIGS = [MID, BIG, SMALL]
TWO = [MID, SMALL]
# Per-wave cost only, proportional to the tile's area: every configuration equally fast per
# flop, so the choice is decided by wave quantization alone.
AREA = {c["name"]: (0.0, c["tile_m"] * c["tile_n"] / 1e4, 0.0, 0.0) for c in CONFIGS}


@pytest.fixture
def table(monkeypatch):
    """Installs a choice table (MODEL, XLA_POINTS, threshold) for the test."""
    def install(model=None, points=None, threshold=0.98):
        use_gemm_table(monkeypatch, model, points, threshold)
    return install


def test_waves_count_cluster_tiles_per_co_resident_cluster():
    # 1024 rows: 8 tile-rows of 128 -> 4 pairs; 8192 / 192 -> 43 column tiles: 172 units over
    # 66 cluster slots -> 3 waves, the last partial.
    assert _gemm_choice.waves(BIG, 1024, 8192, 1, 132) == (172, 66, 3)
    assert _gemm_choice.waves(MID, 1024, 8192, 1, 132) == (512, 132, 4)
    # An odd tile-row count rounds up to whole clusters; batches multiply the units.
    assert _gemm_choice.waves(SMALL, 576, 1024, 1, 132) == (5 * 8, 66, 1)
    assert _gemm_choice.waves(MID, 512, 1024, 4, 132) == (4 * 4 * 8, 132, 1)
    f = _gemm_choice.features(MID, 1024, 8192, 2048, 1, 132)
    assert f == (4.0, 4.0 * 32, 512 / 132 * 32, 1.0)


def test_sm_budget_follows_gemmplan_convention():
    assert _gemm_choice.resolve_sms(0, 132) == 132
    assert _gemm_choice.resolve_sms(100, 132) == 100
    assert _gemm_choice.resolve_sms(500, 132) == 132
    assert _gemm_choice.resolve_sms(-32, 132) == 100  # all but 32 (the NCCL path)
    assert _gemm_choice.resolve_sms(-500, 132) == 1


def test_choice_minimizes_predicted_time_including_the_last_wave():
    # 2048 x 1024: MID 16 x 8 = 128 tiles (one wave on 132 SMs), BIG 8 pairs x 6 = 48 units
    # (one wave of 128x192 tiles: 1.5x MID's tile), SMALL 16 pairs x 8 = 128 units over 66
    # slots (2 waves of half tiles: MID's time, a tie that the earlier row wins).
    assert _gemm_choice.choose(CONFIGS, AREA, 2048, 1024, 4096, 1, 132) == 0
    # 2048 x 1536: MID 192 tiles, 2 waves; SMALL 192 units, 3 waves of half tiles (1.5).
    assert _gemm_choice.choose(TWO, AREA, 2048, 1536, 4096, 1, 132) == 1
    # 512 x 1024: MID 32 tiles (one wave, 128x128), SMALL 4 pairs x 8 = 32 units (one wave of
    # 64x128 tiles, half the time).
    assert _gemm_choice.choose(CONFIGS, AREA, 512, 1024, 4096, 1, 132) == 2
    # Configurations without coefficients are skipped; none at all gives None.
    assert _gemm_choice.choose(CONFIGS, {"pp_128x192x64_c2": (0, 1, 0, 0)}, 512, 1024, 64, 1,
                               132) == 1
    assert _gemm_choice.choose(CONFIGS, {}, 512, 1024, 64, 1, 132) is None
    assert _gemm_choice.choose(CONFIGS, AREA, 512, 1024, 4096, 1, 132,
                               require_addends=True) == 1


def test_sm_budget_changes_the_wave_count_and_the_choice():
    # 2048 x 1024 on all 132 SMs: MID's 128 tiles fit one wave (see above). With 100 SMs
    # (32 left to NCCL) MID needs 2 waves; SMALL's 128 units over 50 slots need 3 waves of half
    # tiles (1.5 MID tiles): SMALL wins.
    assert _gemm_choice.choose(TWO, AREA, 2048, 1024, 4096, 1, 132) == 0
    assert _gemm_choice.choose(TWO, AREA, 2048, 1024, 4096, 1, 100) == 1


def test_ties_keep_the_ring_capable_config_then_the_table_order():
    same = {c["name"]: (0.0, 0.0, 0.0, 10.0) for c in CONFIGS}  # every prediction 10 us
    assert _gemm_choice.choose(CONFIGS, same, 4096, 8192, 2048, 1, 132) == 1  # BIG: addends
    no_ring = [MID, SMALL]
    assert _gemm_choice.choose(no_ring, same, 4096, 8192, 2048, 1, 132) == 0
    # Within TIE (1%) a tie; beyond it the faster one wins.
    close = dict(same, pp_128x128x64_c1=(0.0, 0.0, 0.0, 9.95))
    assert _gemm_choice.choose(CONFIGS, close, 4096, 8192, 2048, 1, 132) == 1
    far = dict(same, pp_128x128x64_c1=(0.0, 0.0, 0.0, 9.0))
    assert _gemm_choice.choose(CONFIGS, far, 4096, 8192, 2048, 1, 132) == 0


def test_select_uses_the_dtype_table_and_float16_borrows_bfloat16(table):
    table()
    assert _gemm_choice.select_gemm_config(BF16, 512, 1024, 4096, 1, 0, CONFIGS, 132) is None
    table(model={"bfloat16": AREA})
    assert _gemm_choice.select_gemm_config(BF16, 512, 1024, 4096, 1, 0, CONFIGS, 132) == 2
    assert _gemm_choice.select_gemm_config(F16, 512, 1024, 4096, 1, 0, CONFIGS, 132) == 2
    only_mid = {"pp_128x128x64_c1": (0.0, 1.0, 0.0, 0.0)}
    table(model={"bfloat16": AREA, "float16": only_mid})
    assert _gemm_choice.select_gemm_config(F16, 512, 1024, 4096, 1, 0, CONFIGS, 132) == 0
    # A negative budget is all SMs but that many (see the budget test).
    assert _gemm_choice.select_gemm_config(BF16, 2048, 1024, 4096, 1, 0, TWO, 132) == 0
    assert _gemm_choice.select_gemm_config(BF16, 2048, 1024, 4096, 1, -32, TWO, 132) == 1


def test_prefer_xla_dot_from_measured_neighbours(table):
    table()
    assert not _gemm_choice.prefer_xla_dot(1024, 1280, 8192, BF16)  # nothing measured
    pts = {"bfloat16": ((1024, 1280, 8192, 0.96), (2048, 1280, 8192, 0.90),
                        (8192, 8192, 2048, 1.05))}
    table(points=pts)
    assert _gemm_choice.prefer_xla_dot(1024, 1280, 8192, BF16)
    est = _gemm_choice.xla_dot_estimate(1024, 1280, 8192, BF16)
    assert 0.90 < est < 0.96  # the exact point weighs most
    reason = _gemm_choice.xla_dot_reason(1024, 1280, 8192, BF16)
    assert "XLA's dot measured faster" in reason and "test GPU" in reason
    assert not _gemm_choice.prefer_xla_dot(8192, 8192, 2048, BF16)  # fo_jax faster there
    assert not _gemm_choice.prefer_xla_dot(1024, 8192, 8192, BF16)  # no neighbour in reach
    assert not _gemm_choice.prefer_xla_dot(1024, 1280, 8192, F16)  # no float16 points
    table(points=pts, threshold=0.5)
    assert not _gemm_choice.prefer_xla_dot(1024, 1280, 8192, BF16)


def test_a_clear_reading_decides_its_own_shape(table):
    # fo_jax measured 1.10x of XLA at 1024x1280x8192 among slower neighbours: beyond the runs'
    # noise (CLEAR), so that shape keeps fo_jax's GEMM; the shapes around it still average.
    slow = 0.85
    table(points={"bfloat16": ((1024, 1280, 8192, 1.10), (512, 1280, 8192, slow),
                               (2048, 1280, 8192, slow), (1024, 1280, 4096, slow))})
    assert _gemm_choice.xla_dot_estimate(1024, 1280, 8192, BF16) == 1.10
    assert not _gemm_choice.prefer_xla_dot(1024, 1280, 8192, BF16)
    assert _gemm_choice.prefer_xla_dot(1024, 1280, 16384, BF16)  # not measured: neighbours
    # Inside the band the neighbours outvote it (a reading of 1.04 may be noise).
    table(points={"bfloat16": ((1024, 1280, 8192, 1.04), (512, 1280, 8192, slow),
                               (2048, 1280, 8192, slow), (1024, 1280, 4096, slow))})
    assert _gemm_choice.prefer_xla_dot(1024, 1280, 8192, BF16)


class FakeModule:
    GemmDtype = {"bfloat16": 0, "float16": 1}  # the module's enum, looked up by member name

    def __init__(self, configs):
        self.configs = configs
        self.rule_calls = []

    def gemm_configs(self):
        return [dict(c, index=i) for i, c in enumerate(self.configs)]

    def select_gemm_config(self, dtype, m, n, k, batch, sm_budget):
        self.rule_calls.append((dtype, m, n, k, batch, sm_budget))
        return 0

    def max_gemm_groups(self):
        return 64


def test_plan_takes_the_fitted_choice_else_the_kernel_rule(table, monkeypatch):
    from fo_jax import _cuda

    module = FakeModule(CONFIGS)
    monkeypatch.setattr(_cuda, "module", lambda: module)
    monkeypatch.setattr(_gemm_choice, "device_sms", lambda: 132)
    _plan.gemm_configs.cache_clear()
    try:
        table()
        plan = _plan.plan_gemm("f", BF16, 512, 1024, 4096, 1, None, 1, -32)
        assert plan.config_name == "pp_128x128x64_c1"
        assert module.rule_calls == [(0, 512, 1024, 4096, 1, 0)]
        table(model={"bfloat16": AREA})
        plan = _plan.plan_gemm("f", BF16, 512, 1024, 4096, 1, None, 1, 0)
        assert plan.config_name == "pp_64x128x64_c2" and plan.group_begin == (0, 8)
        assert len(module.rule_calls) == 1
    finally:
        _plan.gemm_configs.cache_clear()


def test_compiled_table_has_the_small_m_configs():
    rows = {c.name: c for c in gemm_config_table().CONFIGS}
    for name in ("pp_64x128x64_c2", "pp_64x192x64_c2", "pp_64x256x64_c2", "coop_128x128x64_c2"):
        c = rows[name]
        assert f"{c.tile_m}x{c.tile_n}x{c.tile_k}_c{c.cluster_m}" in name
        assert c.cluster_n == 1  # the group scheduler clusters along M only
        assert c.pingpong == name.startswith("pp_")


# ------------------------------------------------------------------------------------------
# dev/fit_gemm_table.py on a synthetic sweep
# ------------------------------------------------------------------------------------------
TRUE = {  # coefficients (us) the synthetic sweep is drawn from
    "pp_128x192x64_c2": (4.0, 0.50, 0.05, 6.0),
    "pp_128x128x64_c1": (3.0, 0.36, 0.04, 5.0),
    "pp_64x128x64_c2": (2.5, 0.20, 0.03, 5.0),
    "coop_256x128x64_c1": (6.0, 0.62, 0.06, 6.0),
}


DRIFTED = (16384, 16384, 6656)


def _synthetic_sweep(path, configs):
    rng = np.random.default_rng(0)
    rows = []
    base = dict(suite="gemm_sweep", device="Test GPU", date="2026-11-25", commit="abc", sms=132)
    for m in (512, 1024, 2048, 4096, 8192, 16384):
        for n, k in ((4096, 512), (1536, 4096), (5120, 1728), (1280, 8192), (8192, 7168),
                     (16384, 6656)):
            times = {}
            for c in configs:
                if c["name"] in TRUE:
                    t = _gemm_choice.predicted_us(c, TRUE[c["name"]], m, n, k, 1, 132)
                    times[c["name"]] = t * (1 + 0.005 * rng.standard_normal()) / 1e3
            # XLA: as fast as the best configuration, except at small M where it is 20% faster.
            best = min(times.values())
            xla = best * (0.8 if m <= 1024 and n * k <= 1536 * 4096 else 1.02)
            # One shape read 10% faster as fo_jax.matmul than as the same kernel's
            # fo_jax.gemm row (a clock drift within the trace): the fit must leave it out.
            early = 0.9 if (m, n, k) == DRIFTED else 1.0
            for dtype, scale in (("bfloat16", 1.0), ("float16", 1.01)):
                rows.append(dict(base, dtype=dtype, M=m, N=n, K=k, method="xla.dot",
                                 ms=xla * scale, config=None))
                rows.append(dict(base, dtype=dtype, M=m, N=n, K=k, method="fo_jax.matmul",
                                 ms=times["pp_128x128x64_c1"] * scale * early,
                                 config="pp_128x128x64_c1"))
            for name, t in times.items():
                rows.append(dict(base, dtype="bfloat16", M=m, N=n, K=k, method="fo_jax.gemm",
                                 ms=t, config=name))
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def _load_table(path):
    spec = importlib.util.spec_from_file_location("fitted_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fit_script():
    return dev_script("fit_gemm_table")


def test_fit_recovers_the_choice_of_a_synthetic_sweep(tmp_path, monkeypatch):
    fit_gemm_table = _fit_script()
    configs = fit_gemm_table.compiled_configs()
    sweep, out, report = tmp_path / "sweep.jsonl", tmp_path / "table.py", tmp_path / "r.md"
    _synthetic_sweep(sweep, configs)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "fit_gemm_table.py"),
                           str(sweep), "--out", str(out), "--report", str(report)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    fitted = _load_table(out)
    assert fitted.DEVICE == "Test GPU"
    assert set(fitted.MODEL) == {"bfloat16"} and set(fitted.MODEL["bfloat16"]) == set(TRUE)
    assert set(fitted.XLA_POINTS) == {"bfloat16", "float16"}
    # The fitted model picks what the true one picks on shapes it was not fitted on (within
    # the noise: allow one near-tie), including under an SM budget.
    agree = total = 0
    for m in (768, 1536, 3072, 6144, 12288):
        for n, k in ((2048, 2048), (3584, 8192), (6144, 4096)):
            for sms in (132, 100):
                got = _gemm_choice.choose(configs, fitted.MODEL["bfloat16"], m, n, k, 1, sms)
                want = _gemm_choice.choose(configs, TRUE, m, n, k, 1, sms)
                agree += got == want
                total += 1
    assert agree >= total - 1, (agree, total)
    # XLA points: the measured ratio of the chosen configuration; 0.8 at small M and N * K.
    pts = {p[:3]: p[3] for p in fitted.XLA_POINTS["bfloat16"]}
    assert math.isclose(pts[(512, 1536, 4096)], 0.8, rel_tol=0.03)
    assert math.isclose(pts[(8192, 8192, 7168)], 1.02, rel_tol=0.03)
    monkeypatch.setattr(_gemm_choice, "table", lambda: fitted)
    assert _gemm_choice.prefer_xla_dot(512, 1536, 4096, BF16)
    assert not _gemm_choice.prefer_xla_dot(8192, 8192, 7168, BF16)
    # The drifted shape is reported, and kept out of the fit's points in both dtypes.
    assert DRIFTED not in pts and DRIFTED not in {p[:3] for p in fitted.XLA_POINTS["float16"]}
    assert len(pts) == 35
    text = report.read_text()
    assert "Timing drift: at 1 shape the" in text and "16384x16384x6656 (drift)" in text
    for what in ("fitted choice", "Never chosen on these shapes", "geomean",
                 "### Cross-validation", "shape: one shape", "layer: the 5-6 shapes"):
        assert what in text, what


def test_recheck_takes_the_readings_of_the_gemm_matmul_runs(monkeypatch):
    """--recheck: a plain sweep's fo_jax.own row (NAME/kS when split) and fo_jax.matmul row
    count where they ran this fit's choice; a shape's point is their geometric mean over the
    files; a reading of another GEMM (another table's choice) is ignored."""
    fit_gemm_table = _fit_script()
    configs = fit_gemm_table.compiled_configs()
    params = dict(TRUE)
    split_shape = next(s for s in ((m, n, k) for m in (512, 1024, 2048) for n in (1280, 2304)
                                   for k in (8192, 16384))
                       if _gemm_choice.choose_split(configs, params, *s, 132)[1] > 1)
    plain_shape = (8192, 8192, 7168)
    names = {s: fit_gemm_table.own_choice(configs, params, s, 132)
             for s in (split_shape, plain_shape)}
    assert "/k" in names[split_shape] and "/k" not in names[plain_shape]
    rows = []
    for commit, xla_ms in (("a", 1.0), ("b", 1.2)):
        for s, own_ms, matmul in ((split_shape, 0.8, None), (plain_shape, 1.25, "xla.dot")):
            base = dict(dtype="bfloat16", M=s[0], N=s[1], K=s[2], commit=commit, date="d")
            rows.append(dict(base, method="xla.dot", config=None, ms=xla_ms))
            rows.append(dict(base, method="fo_jax.own", config=names[s], ms=own_ms))
            rows.append(dict(base, method="fo_jax.matmul", config=matmul or names[s],
                             ms=xla_ms if matmul else own_ms))
        # Another table's choice at a third shape: not a reading of this fit's GEMM.
        base = dict(dtype="bfloat16", M=4096, N=1536, K=4096, commit=commit, date="d")
        rows += [dict(base, method="xla.dot", config=None, ms=1.0),
                 dict(base, method="fo_jax.own", config="not_this_fit", ms=2.0)]
    old = [(*split_shape, 0.5), (*plain_shape, 1.1), (4096, 1536, 4096, 0.9)]
    new, text = fit_gemm_table.recheck_points(old, rows, "bfloat16", configs, params, 132, 0.98)
    got = {p[:3]: p[3] for p in new}
    # split: own and matmul in both files, 1.0/0.8 and 1.2/0.8 twice each
    assert math.isclose(got[split_shape], round(math.sqrt(1.25 * 1.5), 4))
    assert math.isclose(got[plain_shape], round(math.sqrt(0.8 * 0.96), 4))  # own rows only
    assert got[(4096, 1536, 4096)] == 0.9
    m, n, k = split_shape
    assert f"{m}x{n}x{k} | {names[split_shape]} | 4 |" in text


# ------------------------------------------------------------------------------------------
# The committed tables (fo_jax/_gemm_tables/, one per GPU model, fitted on the sweeps in
# benchmarks/results/): what their fits' reports say they do, on every model. A table fitted on
# a new sweep must keep these or the report must say why not.
# ------------------------------------------------------------------------------------------
DESIGN_SHAPES = ((4096, 8192, 2048), (8192, 8192, 2048), (8192, 8192, 7168),
                 (16384, 8192, 7168), (16384, 8192, 2048))


def _compiled():
    return _fit_script().compiled_configs()


def _name(configs, dtype, shape, batch=1, sm_budget=0, **kw):
    index = _gemm_choice.select_gemm_config(dtype, *shape, batch, sm_budget, configs, 132, **kw)
    return configs[index]["name"]


@pytest.fixture(params=sorted(_gemm_tables.tables()))
def committed(request, monkeypatch):
    """One committed table, installed as the GPU's (each test runs once per GPU model)."""
    found = _gemm_tables.tables()[request.param]
    monkeypatch.setattr(_gemm_choice, "table", lambda: found)
    return found


def test_fp8_points_per_accumulation_with_the_shape_held_out(tmp_path):
    """--fp8: a shape's point per accumulation is ms(XLA's fp8 dot of that accumulation) /
    ms(fo_jax's kernel of it), its fo_jax.own row (else fo_jax.matmul's where that was not the
    handover), geometric mean over the files; the report's "held out" column decides each shape
    from its neighbours alone, as for a shape never measured."""
    fit_gemm_table = _fit_script()

    def rows(shape, own, own_fast, xla_hi, xla, matmul_config):
        m, n, k = shape
        base = dict(suite="gemm_sweep", device="NVIDIA H200", dtype="float8_e4m3fn", M=m, N=n,
                    K=k)
        return [dict(base, method="fo_jax.own", config="fp8_coop_128x192x128_c2", ms=own),
                dict(base, method="fo_jax.own_fast", config="fp8fast_pp_128x192x128_c2",
                     ms=own_fast),
                dict(base, method="xla.dot_fp32acc", config=None, ms=xla_hi),
                dict(base, method="xla.dot", config=None, ms=xla),
                # the handover: never a reading of fo_jax's kernel
                dict(base, method="fo_jax.matmul", config=matmul_config, ms=xla_hi)]

    a, b, c = (4096, 8192, 2048), (8192, 8192, 2048), (65536, 256, 64)  # c: no neighbour
    files = []
    for i, (a_own, c_hi) in enumerate(((1.0, 1.3), (1.21, 1.3))):
        path = tmp_path / f"fp8_{i}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in
                                rows(a, a_own, 0.5, 1.0, 0.5, "xla.dot")
                                + rows(b, 1.0, 1.0, 0.9, 0.99, "xla.dot")
                                + rows(c, 1.0, 1.0, c_hi, 1.0, "fp8_coop_128x192x128_c2")))
        files.append(str(path))
    points, text = fit_gemm_table.fp8_points(files, threshold=0.98)
    hi = {p[:3]: p[3] for p in points["float8_e4m3fn"]}
    fast = {p[:3]: p[3] for p in points["float8_e4m3fn_fast"]}
    assert hi == {a: pytest.approx(1 / 1.1, abs=1e-4), b: 0.9, c: 1.3}
    assert fast == {a: 1.0, b: 0.99, c: 1.0}
    lines = {ln.split(" | ")[0].strip("| "): ln for ln in text.splitlines() if ln.startswith("| ")}
    cells = lambda s: [x.strip() for x in lines["x".join(map(str, s))].strip("|").split("|")]  # noqa: E731
    # columns: shape, config, promotion, runs, held out, fast config, fast, runs, held out
    assert cells(a)[3:5] == ["XLA", "XLA"]  # its own point and b's (0.9) both say XLA
    assert cells(c)[3:5] == ["fo_jax", "fo_jax"]  # 1.3 measured; held out: nothing in reach
    assert cells(b)[7:9] == ["fo_jax", "fo_jax"]  # fast: 0.99 and a's 1.0 are above 0.98
    assert "each shape's own point held out" in text


def test_a_stale_row_comes_from_the_newest_sweep_of_its_current_form(tmp_path):
    """--fp8-fresh-stale ROW@COMMIT: the row is stale in the fresh sweeps of that commit only; there
    its time is the newest other trace's that timed it in the form built (a later fresh sweep
    before an older --fp8 one), scaled by the two traces' times of XLA at HIGHEST. Plain ROW is
    stale in every fresh sweep, which then reads it from the --fp8 sweeps."""
    fit_gemm_table = _fit_script()
    shape, c1, c2 = (4096, 5504, 4096), "fp8_coop_128x128x128_c1", "fp8_coop_128x160x128_c2"

    def sweep(name, commit, xla_hi, configs):
        base = dict(suite="gemm_sweep", device="NVIDIA H200", dtype="float8_e4m3fn",
                    commit=commit, M=shape[0], N=shape[1], K=shape[2])
        rows = [dict(base, method="xla.dot_fp32acc", config=None, ms=xla_hi)]
        rows += [dict(base, method="fo_jax.gemm", config=c, ms=ms) for c, ms in configs.items()]
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    paths = [sweep("old.jsonl", "aaa", 1.0, {c1: 1.10, c2: 1.20}),
             sweep("fresh1.jsonl", "bbb", 2.0, {c1: 9.99, c2: 2.30}),  # c1 in a form since undone
             sweep("fresh2.jsonl", "ccc", 0.5, {c1: 0.52})]
    names = {c["name"] for c in fit_gemm_table.compiled_configs(fp8=True)}
    traces = fit_gemm_table.fp8_traces(paths)
    at = lambda merged, i: merged[(*shape, i)]["configs"]  # noqa: E731

    stale = fit_gemm_table.stale_rows([f"{c1}@bbb"], paths, {1, 2}, names)
    assert stale == {1: {c1}}
    merged = fit_gemm_table.fresh_promotion(traces, {1, 2}, stale)
    assert (*shape, 0) not in merged  # the shape's fresh sweeps alone
    assert at(merged, 1) == {c1: pytest.approx(0.52 * 2.0 / 0.5), c2: 2.30}
    assert at(merged, 2) == {c1: 0.52}

    stale = fit_gemm_table.stale_rows([c1], paths, {1, 2}, names)
    assert stale == {1: {c1}, 2: {c1}}
    merged = fit_gemm_table.fresh_promotion(traces, {1, 2}, stale)
    assert at(merged, 1) == {c1: pytest.approx(1.10 * 2.0), c2: 2.30}
    assert at(merged, 2) == {c1: pytest.approx(1.10 * 0.5)}

    for bad, says in ((["fp8_no_such_row"], "names no fp8 row"), ([f"{c1}@zzz"], "of commit zzz")):
        with pytest.raises(SystemExit, match=says):
            fit_gemm_table.stale_rows(bad, paths, {1, 2}, names)


def _fp8_row(name, tm, tn, cm, fast, pingpong=False):
    return dict(name=name, tile_m=tm, tile_n=tn, tile_k=128, cluster_m=cm, cluster_n=1,
                pingpong=pingpong, takes_addends=False, fast_accum=fast)


FP8_BIG = _fp8_row("fp8_coop_128x192x128_c2", 128, 192, 2, False)
FP8_MID = _fp8_row("fp8_coop_128x128x128_c1", 128, 128, 1, False)
FP8_FAST = _fp8_row("fp8fast_pp_128x128x128_c1", 128, 128, 1, True, pingpong=True)


def test_fp8_model_picks_among_its_accumulation_rows_from_its_floor_up(monkeypatch):
    """select_fp8_config: the table's fp8 model of the call's accumulation picks among its own
    rows (never a 16-bit row or the other accumulation's), from MODEL_MIN_M rows (m * batch)
    up; below it, and without a model (every table but the H200's, a machine without a GPU),
    None: the kernel library's rules pick."""
    configs = [MID, FP8_BIG, FP8_MID, FP8_FAST]
    per_wave = lambda c: (0.0, c["tile_m"] * c["tile_n"] / 1e4, 0.0, 0.0)  # noqa: E731
    fake = use_gemm_table(monkeypatch, model={
        "bfloat16": {MID["name"]: per_wave(MID)},
        "float8_e4m3fn": {c["name"]: per_wave(c) for c in (FP8_BIG, FP8_MID)},
        "float8_e4m3fn_fast": {FP8_FAST["name"]: per_wave(FP8_FAST)}})
    fake.MODEL_MIN_M = {"float8_e4m3fn": 4096, "float8_e4m3fn_fast": 4096}

    def pick(m, n, fast, batch=1):
        i = _gemm_choice.select_fp8_config(m, n, 2048, batch, 0, configs, fast, 132)
        return None if i is None else configs[i]["name"]

    # 4096 x 4224: 128x128 tiles fill 8 waves of 132 (8 x 1.64), 128x192 pairs 6 of 66 (6 x 2.46).
    assert pick(4096, 4224, False) == FP8_MID["name"]
    # 4096 x 6336: 128x192 pairs fill 8 waves exactly (8 x 2.46), 128x128 tiles 13 (13 x 1.64).
    assert pick(4096, 6336, False) == FP8_BIG["name"]
    assert pick(4096, 6336, True) == FP8_FAST["name"]
    assert pick(2048, 6336, False) is None and pick(2048, 6336, True) is None
    assert pick(2048, 6336, False, batch=2) == FP8_BIG["name"]
    del fake.MODEL_MIN_M  # a table without floors: the model serves every M
    assert pick(2048, 6336, False) == FP8_BIG["name"]
    use_gemm_table(monkeypatch, model={"bfloat16": {MID["name"]: per_wave(MID)}})
    assert pick(4096, 6336, False) is None and pick(4096, 6336, True) is None


@pytest.mark.skipif(not fo_jax.cuda_module_available(),
                    reason="the compiled CUDA module is not built here")
def test_fp8_plans_take_the_fp8_model_and_keep_the_rules_below_its_floor(monkeypatch):
    """The planner (every fp8 GEMM: fo_jax.matmul and the overlaps' producers) asks the fp8
    model first and keeps the kernel library's rules where it answers None."""
    e4m3 = jnp.dtype(jnp.float8_e4m3fn)
    fast = OverlapConfig(fp8_fast_accumulation=True)
    use_gemm_table(monkeypatch)  # no model: the rules' picks, whatever GPU runs the test
    below = {(fast_, m): _plan.gemm_config_index("t", e4m3, m, 8448, 2048, 1, cfg_, 0)
             for fast_, cfg_ in ((False, None), (True, fast)) for m in (2048, 4096)}
    names = [c["name"] for c in _plan.gemm_configs()]
    # A model that always picks the 128x128 rows (the rules pick 128x192 at 4096 x 8448).
    fake = use_gemm_table(monkeypatch, model={
        "float8_e4m3fn": {"fp8_coop_128x128x128_c1": (0.0, 0.0, 0.0, 1.0),
                          "fp8_coop_128x192x128_c2": (0.0, 0.0, 0.0, 2.0)},
        "float8_e4m3fn_fast": {"fp8fast_pp_128x128x128_c1": (0.0, 0.0, 0.0, 1.0),
                               "fp8fast_pp_128x192x128_c2": (0.0, 0.0, 0.0, 2.0)}})
    fake.MODEL_MIN_M = {"float8_e4m3fn": 4096, "float8_e4m3fn_fast": 4096}
    got = {(fast_, m): _plan.gemm_config_index("t", e4m3, m, 8448, 2048, 1, cfg_, 0)
           for fast_, cfg_ in ((False, None), (True, fast)) for m in (2048, 4096)}
    assert names[got[False, 4096]] == "fp8_coop_128x128x128_c1"
    assert names[got[True, 4096]] == "fp8fast_pp_128x128x128_c1"
    assert got[False, 2048] == below[False, 2048] and got[True, 2048] == below[True, 2048]
    assert names[below[False, 4096]] == "fp8_coop_128x192x128_c2"
    assert names[below[True, 4096]] == "fp8fast_pp_128x192x128_c2"


# The fp8 sweeps that timed every row at every sweep shape (--configs all).
FP8_CONFIG_SWEEPS = ("gemm_sweep_h200_2026-11-30_ef26a1f_fp8_configs.jsonl",
                     "gemm_sweep_h200_2026-11-30_87b462c_fp8_configs.jsonl",
                     "gemm_sweep_h200_2026-11-30_87c1abf_fp8_configs_small.jsonl")


@functools.cache
def _readme_fit_args() -> tuple:
    """dev/README.md's refit command ("Refitting a GEMM table"), the H200 table's source, as
    arguments of dev/fit_gemm_table.py (${R} expanded; paths relative to the repository)."""
    with open(os.path.join(ROOT, "dev", "README.md")) as fh:
        text = fh.read()
    prefix = re.search(r"`R=([^`]+)`", text[text.index("## Refitting a GEMM table"):]).group(1)
    command = re.search(r"\npython3 dev/fit_gemm_table\.py (.*?)\n```", text, re.S).group(1)
    return tuple(shlex.split(command.replace("\\\n", " ").replace("${R}", prefix)))


def _readme_option(name: str) -> list:
    """The values of one option of dev/README.md's refit command."""
    args = _readme_fit_args()
    values = args[args.index(name) + 1:]
    return list(itertools.takewhile(lambda a: not a.startswith("--"), values))


def _fp8_traces_of(fit_gemm_table) -> tuple:
    """(the fp8 sweeps of the H200 table's fit, {the promotion's key: its traces with the fresh
    sweeps}), read as the fit reads them (dev/README.md's command)."""
    paths, _, traces_of = fit_gemm_table.fp8_fresh_traces(
        [os.path.join(ROOT, f) for f in _readme_option("--fp8")],
        [os.path.join(ROOT, f) for f in _readme_option("--fp8-fresh")],
        _readme_option("--fp8-fresh-stale"), fit_gemm_table.compiled_configs(fp8=True))
    return paths, traces_of


def test_committed_h200_fp8_models_pick_the_measured_best_rows(monkeypatch):
    """The H200 table's fp8 models (fitted on the three fp8 configuration sweeps, every sweep
    shape, M from 512; the promoting rows on their re-measure): each holds exactly the rows
    fo_jax may pick for its accumulation; on the sweeps' 66 shapes its pick runs within 1% of the
    best measured row in geomean and 2% at worst (the models 0.960x / 0.971x of XLA, the best rows
    0.961x / 0.971x, gemm_fit_h200_2026-12-02.md; the worst, 1.1%, at 1024x1536x4096 with fp32
    promotion: ping-pong 64x192 picked, cooperative 128x128 faster); the five
    design shapes keep the rows their signaling cost was measured on. Below the smallest M fitted
    the rules pick. The H100 table has no fp8 model (its rules are unchanged)."""
    fit_gemm_table = _fit_script()
    rows = fit_gemm_table.compiled_configs(fp8=True)
    h200 = _gemm_tables.tables()["NVIDIA H200"]
    assert "float8_e4m3fn" not in _gemm_tables.tables()["NVIDIA H100 80GB HBM3"].MODEL
    monkeypatch.setattr(_gemm_choice, "table", lambda: h200)
    _, traces_of = _fp8_traces_of(fit_gemm_table)
    all_traces = fit_gemm_table.fp8_traces(
        [os.path.join(ROOT, "benchmarks", "results", f) for f in FP8_CONFIG_SWEEPS])
    assert len(all_traces) == 66
    for key, fast, design in (("float8_e4m3fn", False, "fp8_coop_128x192x128_c2"),
                              ("float8_e4m3fn_fast", True, "fp8fast_pp_128x192x128_c2")):
        traces = traces_of.get(key, all_traces)
        assert len({t[:3] for t in traces}) == 66
        mine = fit_gemm_table.fp8_candidates(rows, fast)
        assert set(h200.MODEL[key]) == {c["name"] for c in mine}
        assert h200.MODEL_MIN_M[key] == 512
        slower, timed = [], set()
        for t, d in traces.items():
            if any(c["name"] not in d["configs"] for c in mine):
                continue  # a re-measure of some rows only
            timed.add(t[:3])
            pick = mine[_gemm_choice.select_fp8_config(*t[:3], 1, 0, mine, fast, 132)]["name"]
            slower.append(d["configs"][pick] / min(d["configs"][c["name"]] for c in mine))
        assert len(timed) == 66
        assert math.exp(np.mean(np.log(slower))) <= 1.01 and max(slower) <= 1.02, (key, slower)
        for shape in DESIGN_SHAPES:
            assert mine[_gemm_choice.select_fp8_config(*shape, 1, 0, mine, fast, 132)][
                "name"] == design, (key, shape)
        assert _gemm_choice.select_fp8_config(256, 8192, 2048, 1, 0, mine, fast, 132) is None
        assert _gemm_choice.select_fp8_config(256, 8192, 2048, 2, 0, mine, fast, 132) is not None


def test_fp8_models_fit_reproduces_the_committed_h200_models():
    """dev/fit_gemm_table.py's fp8_models on the fp8 sweeps of the H200 table's fit (dev/README.md's
    command) with the fresh re-measures of the promoting rows: the committed coefficients and
    floors, and a report with the rules', the models' and the held-out summaries."""
    fit_gemm_table = _fit_script()
    h200 = _gemm_tables.tables()["NVIDIA H200"]
    files, traces_of = _fp8_traces_of(fit_gemm_table)
    models, floors, text = fit_gemm_table.fp8_models(
        files, fit_gemm_table.compiled_configs(fp8=True), 132, traces_of)
    assert models == {key: h200.MODEL[key] for key in ("float8_e4m3fn", "float8_e4m3fn_fast")}
    assert floors == h200.MODEL_MIN_M
    for key in models:
        assert f"{key}, the shapes whose rule pick is known: the library's rule" in text
        assert f"{key}: the fitted model, one shape held out" in text


def test_each_gpu_model_gets_its_own_table(monkeypatch):
    tables = _gemm_tables.tables()
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(tables)
    for device, mod in tables.items():
        assert mod.__name__.rsplit(".", 1)[1] == _gemm_tables.module_name(device)
    monkeypatch.setattr(_gemm_choice, "device_kind", lambda: "NVIDIA H200")
    assert _gemm_choice.table() is tables["NVIDIA H200"]
    # A model without a table, and a machine without a GPU (lowering only), get the default's.
    default = tables[_gemm_tables.DEFAULT_DEVICE]
    for device in ("NVIDIA H100 PCIe", None):
        monkeypatch.setattr(_gemm_choice, "device_kind", lambda device=device: device)
        assert _gemm_choice.table() is default
    assert _gemm_tables.module_name("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"


def test_the_choice_follows_the_gpu_model(monkeypatch):
    # 1024x1536x4096 (24 x 8 tiles of 128x192): on H200 the 64-row ping-pong tile measured
    # 1.10x of XLA's dot where the H100 fit's pick, cooperative 128x128, ran 0.96x.
    configs = _compiled()
    got = {}
    for device in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        monkeypatch.setattr(_gemm_choice, "device_kind", lambda device=device: device)
        got[device] = _name(configs, BF16, (1024, 1536, 4096))
    assert got == {"NVIDIA H100 80GB HBM3": "coop_128x128x64_c1", "NVIDIA H200": "pp_64x192x64_c2"}


def test_committed_table_keeps_the_design_shapes_on_pingpong_128x192(committed):
    configs = _compiled()
    assert "bfloat16" in committed.MODEL and set(committed.MODEL) <= {
        "bfloat16", "float16", "float8_e4m3fn", "float8_e4m3fn_fast"}
    for dtype in (BF16, F16):  # float16: its own coefficients, or bfloat16's where it has none
        for shape in DESIGN_SHAPES:
            assert _name(configs, dtype, shape) == "pp_128x192x64_c2", shape


def test_committed_table_gives_small_m_the_small_tiles(committed):
    # The sweep's worst shapes under the kernel library's rule (pp_128x128x64_c1 at 0.57-0.70x
    # of XLA's dot): a 64-row tile fills the SMs (0.96-1.05x).
    configs = _compiled()
    assert _name(configs, BF16, (512, 1280, 8192)) == "pp_64x128x64_c2"
    assert _name(configs, BF16, (512, 1536, 4096)) == "pp_64x128x64_c2"
    assert _name(configs, BF16, (512, 2304, 16384)) == "pp_64x192x64_c2"


def test_committed_table_ring_choice_and_compiled_subset(committed):
    configs = _compiled()
    # Only pp_128x192x64_c2 has an addend kernel: the copy-engine reduce-scatter's choice.
    for shape in (*DESIGN_SHAPES, (16384, 4096, 7168), (512, 1280, 8192)):
        assert _name(configs, BF16, shape, require_addends=True) == "pp_128x192x64_c2"
    assert _name(configs, BF16, (16384, 4096, 7168)) == "coop_128x256x64_c1"
    # A build without the small-M configurations chooses among those it has.
    older = [c for c in configs if not c["name"].startswith("pp_64x")]
    assert _name(older, BF16, (512, 1536, 4096)) not in ("pp_64x128x64_c2", "pp_64x192x64_c2")


def test_committed_predicate_agrees_with_clear_measurements(committed):
    # Where the sweep measured fo_jax's chosen configuration clearly slower than XLA's dot
    # (below 0.90x) fo_jax.matmul hands the shape to XLA; where clearly faster it keeps its own
    # GEMM. "Clearly" is beyond the readings' noise: one kernel's ratio moves by up to 5% from
    # run to run (docs/gemm_performance.md, "The choice"), and the predicate weighs a shape's
    # neighbours too, so a point of 1.02 among slower neighbours may go either way.
    for name, dtype in (("bfloat16", BF16), ("float16", F16)):
        points = committed.XLA_POINTS[name]
        slow = [p for p in points if p[3] < 0.90]
        fast = [p for p in points if p[3] > 1.05]
        assert slow and all(_gemm_choice.prefer_xla_dot(*p[:3], dtype) for p in slow)
        assert all(not _gemm_choice.prefer_xla_dot(*p[:3], dtype) for p in fast)
    # The fastest bf16 point keeps fo_jax's GEMM (H100: 16384x16384x6656; H200: 1024x1536x4096).
    best = max(committed.XLA_POINTS["bfloat16"], key=lambda p: p[3])
    assert best[3] > 1.02 and not _gemm_choice.prefer_xla_dot(*best[:3], BF16)
    # The same of fp8 points, per accumulation, where a table has them (the H200's).
    e4m3 = jnp.dtype(jnp.float8_e4m3fn)
    for fast in (False, True):
        points = committed.XLA_POINTS.get(_gemm_choice.points_key(e4m3, fast), ())
        assert all(_gemm_choice.prefer_xla_dot(*p[:3], e4m3, fast) for p in points if p[3] < 0.90)
        assert all(not _gemm_choice.prefer_xla_dot(*p[:3], e4m3, fast)
                   for p in points if p[3] > 1.05)


def test_copy_engine_reduce_scatter_keeps_the_addend_config(monkeypatch):
    from fo_jax import _cuda, _transport

    configs = _compiled()
    module = FakeModule(configs)
    monkeypatch.setattr(_cuda, "module", lambda: module)
    monkeypatch.setattr(_gemm_choice, "device_sms", lambda: 132)
    _plan.gemm_configs.cache_clear()
    try:
        names = [c["name"] for c in configs]
        shape = (16384, 4096, 7168)  # where the table ranks coop_128x256x64_c1 first
        rs = _transport._config_index("reduce_scatter", BF16, *shape, None)
        ar = _transport._config_index("all_reduce", BF16, *shape, None)
        assert names[rs] == "pp_128x192x64_c2" and names[ar] == "coop_128x256x64_c1"
        # A named configuration wins over both.
        named = _transport._config_index("reduce_scatter", BF16, *shape,
                                         OverlapConfig(gemm_config="pp_128x128x64_c1"))
        assert names[named] == "pp_128x128x64_c1"
        assert module.rule_calls == []
    finally:
        _plan.gemm_configs.cache_clear()


def test_dev_readme_refits_the_committed_h200_table(tmp_path):
    """dev/README.md's command ("Refitting a GEMM table") writes the committed H200 table byte for
    byte, and its report but for the line naming where the table went."""
    args = list(_readme_fit_args())
    report = args[args.index("--report") + 1]
    args[args.index("--report") + 1] = str(tmp_path / "report.md")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "fit_gemm_table.py"), *args,
                          "--out", str(tmp_path / "table.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    with open(os.path.join(ROOT, "fo_jax", "_gemm_tables", "nvidia_h200.py")) as fh:
        assert (tmp_path / "table.py").read_text() == fh.read()
    with open(os.path.join(ROOT, report)) as fh:
        committed = fh.read().splitlines()
    written = (tmp_path / "report.md").read_text().splitlines()
    differ = [i for i, (a, b) in enumerate(zip(committed, written)) if a != b]
    assert len(committed) == len(written) and len(differ) == 1, differ
    assert "the table it wrote: fo_jax/_gemm_tables/nvidia_h200.py" in committed[differ[0]]
