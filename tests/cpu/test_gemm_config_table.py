"""csrc/kernels/gemm_configs.py against the kernel sources it generates (no GPU, no build): the
committed csrc/kernels/generated/ files are exactly what the table writes, so a row edited
without rerunning the generator fails here rather than at a build that compiles the old table;
and the row kept to compare the accurate fp8 MMA loops differs from its twin in that loop only;
which accurate rows keep CUTLASS's MMA loop."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATED = os.path.join(ROOT, "csrc", "kernels", "generated")


def _table():
    spec = importlib.util.spec_from_file_location(
        "gemm_configs", os.path.join(ROOT, "csrc", "kernels", "gemm_configs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_sources_are_the_tables():
    mod = _table()
    want = {}
    for cfg in mod.TABLE:
        for dtype in mod.DTYPES:
            for kind in mod._kinds(cfg, dtype):
                name = f"gemm_{mod._symbol(cfg, dtype)}{'_' + kind.lower() if kind else ''}.cu"
                want[name] = mod._kernel_file(cfg, dtype, kind)
    have = {f for f in os.listdir(GENERATED) if f.startswith("gemm_") and f.endswith(".cu")}
    assert have == set(want), (sorted(have - set(want)), sorted(set(want) - have))
    for name, text in want.items():
        with open(os.path.join(GENERATED, name)) as fh:
            assert fh.read() == text, f"{name} is stale: run python3 csrc/kernels/gemm_configs.py"
    with open(os.path.join(GENERATED, "gemm_config_table.inc")) as fh:
        assert fh.read() == mod._table_file(), "gemm_config_table.inc is stale"


def test_cutlass_mma_row_is_its_twin_but_for_the_mma_loop():
    mod = _table()
    rows = {c.name: c for c in mod.TABLE}
    twin = rows["fp8_coop_128x192x128_c2"]
    mine = rows["fp8_coop_128x192x128_c2_cutlass_mma"]
    assert mine.cutlass_mma and not twin.cutlass_mma
    assert mine._replace(name=twin.name, cutlass_mma=False) == twin
    assert mine.name in {c.name for c in mod.MEASURE_ONLY_CONFIGS}
    # That row's kernel takes CUTLASS's mma() (the last template argument); the adopted row's
    # kernel is its twin's but for that argument.
    with open(os.path.join(GENERATED, "gemm_fp8_coop_128x192x128_c2_cutlass_mma_e4m3.cu")) as fh:
        text = fh.read()
    assert "bfloat16_t, false, 2, 3, true>;" in text
    with open(os.path.join(GENERATED, "gemm_fp8_coop_128x192x128_c2_e4m3.cu")) as fh:
        assert "bfloat16_t, false, 2, 3>;" in fh.read()


def test_which_accurate_rows_run_cutlass_mma():
    # fo_jax's mma() (fp8_promoting_mainloop.cuh) everywhere but in the twin kept to compare and
    # in cooperative 128x128, whose k-tiles it made slower (the comment at its row).
    mod = _table()
    accurate = [c for c in mod.TABLE if c.name in mod.FP8_NAMES and not c.fast_accum]
    assert sorted(c.name for c in accurate if c.cutlass_mma) == [
        "fp8_coop_128x128x128_c1", "fp8_coop_128x192x128_c2_cutlass_mma"]
    for kind in ("", "_consumer"):
        with open(os.path.join(GENERATED, f"gemm_fp8_coop_128x128x128_c1_e4m3{kind}.cu")) as fh:
            assert "bfloat16_t, false, 2, 0, true>;" in fh.read()
