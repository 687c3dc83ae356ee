"""csrc/kernels/gemm_configs.py against the kernel sources it generates (no GPU, no build): the
committed csrc/kernels/generated/ files are exactly what the table writes, so a row edited
without rerunning the generator fails here rather than at a build that compiles the old table;
the rows kept to compare the accurate fp8 MMA loops differ from their twins in that loop only
(which mma(), and in fo_jax's the order of release and promotion); and which accurate rows run
CUTLASS's MMA loop."""

import os

from conftest import gemm_config_table as _table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATED = os.path.join(ROOT, "csrc", "kernels", "generated")


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


# GemmKernelConfig's trailing template arguments that the generator leaves out at their defaults:
# kPromotionKTiles, kEpiStagesD, kCutlassFp8Mma, kFp8LateRelease (the last two: the MMA loop's).
TRAILING_DEFAULTS = ["1", "0", "false", "false"]
N_ARGS = 15


def _template_args(name: str) -> list:
    """The GemmKernelConfig arguments of a row's plain fp8 kernel, the defaults filled in."""
    with open(os.path.join(GENERATED, f"gemm_{name}_e4m3.cu")) as fh:
        text = fh.read()
    start = text.index("GemmKernelConfig<") + len("GemmKernelConfig<")
    args = [a.strip() for a in text[start:text.index(">;", start)].split(",")]
    missing = N_ARGS - len(args)
    return args + TRAILING_DEFAULTS[len(TRAILING_DEFAULTS) - missing:] if missing else args


def test_mma_twins_differ_from_their_rows_in_the_mma_loop_only():
    mod = _table()
    rows = {c.name: c for c in mod.TABLE}
    measure_only = {c.name for c in mod.MEASURE_ONLY_CONFIGS}
    assert mod.MMA_TWINS == {"fp8_coop_128x192x128_c2_cutlass_mma": "fp8_coop_128x192x128_c2",
                             "fp8_coop_128x128x128_c1_cutlass_mma": "fp8_coop_128x128x128_c1",
                             "fp8_coop_128x192x128_c2_late_release": "fp8_coop_128x192x128_c2"}
    loop = lambda c: (c.cutlass_mma, c.late_release)  # noqa: E731
    for twin_name, name in mod.MMA_TWINS.items():
        row, twin = rows[name], rows[twin_name]
        assert twin._replace(name=name, cutlass_mma=row.cutlass_mma,
                             late_release=row.late_release) == row
        assert loop(twin) != loop(row)
        assert twin_name in measure_only and name not in measure_only
        mine, theirs = _template_args(name), _template_args(twin_name)
        assert len(mine) == len(theirs) == N_ARGS
        assert mine[:-2] == theirs[:-2], (name, mine, theirs)
        for c, args in ((row, mine), (twin, theirs)):
            assert args[-2:] == [str(flag).lower() for flag in loop(c)], (c.name, args)
    # The late release is an order of fo_jax's mma(): never with CUTLASS's.
    assert not any(c.cutlass_mma and c.late_release for c in mod.TABLE)


def test_which_accurate_rows_run_cutlass_mma_and_the_late_release():
    # fo_jax's mma() (fp8_promoting_mainloop.cuh) in every accurate row; CUTLASS's only in the
    # twins kept to compare. Cooperative 128x128 takes CUTLASS's order of release and promotion
    # (its comment), in its plain and its consumer kernel; the other rows the early release, and
    # cooperative 128x192's twin the late one.
    mod = _table()
    accurate = [c for c in mod.TABLE if c.name in mod.FP8_NAMES and not c.fast_accum]
    assert sorted(c.name for c in accurate if c.cutlass_mma) == [
        "fp8_coop_128x128x128_c1_cutlass_mma", "fp8_coop_128x192x128_c2_cutlass_mma"]
    assert [c.name for c in mod.TABLE if c.late_release] == [
        "fp8_coop_128x128x128_c1", "fp8_coop_128x192x128_c2_late_release"]
    for kind in ("", "_consumer"):
        with open(os.path.join(GENERATED, f"gemm_fp8_coop_128x128x128_c1_e4m3{kind}.cu")) as fh:
            assert "bfloat16_t, false, 2, 0, false, true>;" in fh.read()
