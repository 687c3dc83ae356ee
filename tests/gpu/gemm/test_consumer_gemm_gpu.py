"""The consumer ("all-gather") GEMM on one GPU: A's bands arrive while it runs (a copy on another
stream per band, after a delay, then the band's flag by a stream memory operation), and D must
equal the plain GEMM on the complete A bit for bit, whatever the arrival order. The flags start
at an earlier call's value (also across the 2^32 wrap), so a wait that passed early would read the
NaN-poisoned rows. bf16, fp16 and fp8 (e4m3 operands, bf16 D: the all-gather's fp8 consumer
configs). The hook is the CUDA module's consumer_gemm_check (csrc/comm/consumer_gemm_check.h); no
JAX computation runs."""

import pytest

from conftest import gpu_devices_or_skip

pytestmark = pytest.mark.gpu

# Per-GPU M (the gathered rows) x N x K of the design, as 4 bands of M / 4 rows.
DESIGN_SHAPES = [
    (4096, 8192, 2048),
    (8192, 8192, 2048),
    (8192, 8192, 7168),
    (16384, 8192, 7168),
    (16384, 8192, 2048),
]
ORDERS = ["forward", "reversed", "random"]
DTYPES = ["bfloat16", "float16", "float8_e4m3fn"]
DELAY_US = 200  # before each band's copy: the kernel reaches most bands before they land


def _check(**kwargs) -> dict:
    gpu_devices_or_skip(1)
    from fo_jax import _cuda

    if not _cuda.module_available():
        pytest.skip(f"the CUDA module is not available: {_cuda.unavailable_reason()}")
    return _cuda.module().consumer_gemm_check(**kwargs)


def _assert_exact(r: dict, kwargs: dict) -> None:
    """D of the run with waits is the reference bit for bit, the counters are complete and the
    GEMM ran until after the last band landed (each band's copy follows a delay of its own, so
    the last lands no sooner than bands * delay_us after the copies may start: a GEMM that did
    not wait would end before)."""
    case = (f"{kwargs} on config {r['config']}, visit order {r['visit_order']}, "
            f"arrival order {r['arrival_order']}")
    assert not r["timed_out"], (
        f"{case}: the consumer GEMM did not end within the timeout; every flag was then set "
        "(it waited for a flag that was never written, or for a wrong band)")
    assert r["reference_nonfinite"] == 0, f"{case}: the plain GEMM's reference has NaN/inf"
    m_local = kwargs["m_local"]
    bad_bands = {b: n for b, n in enumerate(r["band_mismatches"]) if n}
    assert r["mismatches"] == 0, (
        f"{case}: {r['mismatches']} elements of D differ from the plain GEMM; per band of "
        f"{m_local} rows (band: elements): {bad_bands}; first bad row {r['first_bad_row']} "
        f"(band {r['first_bad_row'] // m_local}); max |diff| {r['max_abs_diff']} (inf: a NaN, "
        "i.e. a tile read its band before it landed, or was never written)")
    assert r["counter_problem"] == "", f"{case}: signaling counters wrong: {r['counter_problem']}"
    min_us = kwargs.get("bands", 4) * kwargs.get("delay_us", 0)
    assert r["wait_run_us"] >= min_us - 10, (
        f"{case}: the GEMM took {r['wait_run_us']:.1f} us, less than the bands' delays "
        f"({min_us} us); it ended {r['end_after_last_flag_us']:.1f} us after the last flag was "
        "written: it cannot have waited for every band")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", DESIGN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_design_shapes_bit_identical(shape, order, dtype):
    m, n, k = shape
    kwargs = dict(m_local=m // 4, n=n, k=k, bands=4, dtype=dtype, order=order,
                  delay_us=DELAY_US, seed=m + n + k)
    _assert_exact(_check(**kwargs), kwargs)


# Odd shapes: bands that are a multiple of tile_m * cluster_m but not of 256 (128x128 tiles) or
# 512 (128x192 tiles with 2x1 clusters), partial column tiles, P = 1, 2, 3, 8, several groups
# per band, the own band not first in memory, tiny K and N.
ODD_CASES = [
    dict(m_local=384, n=264, k=520, bands=4, config="pp_128x128x64_c1"),
    dict(m_local=768, n=272, k=1032, bands=4, config="pp_128x192x64_c2"),
    dict(m_local=640, n=1000, k=776, bands=3, rank=1),
    dict(m_local=256, n=8192, k=2048, bands=8, rank=5, groups_per_band=2),
    dict(m_local=1024, n=4104, k=2048, bands=2, rank=1, groups_per_band=3,
         config="pp_128x192x64_c2"),
    dict(m_local=512, n=512, k=512, bands=1),
    dict(m_local=128, n=8, k=8, bands=2, config="pp_128x128x64_c1"),
]


# fp8: K a multiple of 16 (16-byte rows), the fp8 rows with a consumer kernel.
FP8_ODD_CASES = [
    dict(m_local=384, n=264, k=528, bands=4, config="fp8_coop_128x128x128_c1"),
    dict(m_local=768, n=272, k=1040, bands=3, rank=1, config="fp8_coop_128x192x128_c2"),
    dict(m_local=256, n=8192, k=2048, bands=8, rank=5, groups_per_band=2),
    dict(m_local=128, n=8, k=16, bands=2, config="fp8_coop_128x128x128_c1"),
    # The fast-accumulation rows (ping-pong: each warp group takes its own tile and waits for
    # its own band).
    dict(m_local=384, n=264, k=528, bands=4, config="fp8fast_pp_128x128x128_c1"),
    dict(m_local=768, n=272, k=1040, bands=3, rank=1, config="fp8fast_pp_128x192x128_c2"),
    dict(m_local=1024, n=4104, k=2048, bands=2, rank=1, groups_per_band=3,
         config="fp8fast_pp_128x192x128_c2"),
]


@pytest.mark.parametrize("dtype,case", [
    (d, c) for d in ("bfloat16", "float16") for c in ODD_CASES] + [
    ("float8_e4m3fn", c) for c in FP8_ODD_CASES],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
@pytest.mark.parametrize("order", ORDERS)
def test_odd_shapes_bit_identical(case, order, dtype):
    kwargs = dict(case, dtype=dtype, order=order, delay_us=DELAY_US, seed=7)
    _assert_exact(_check(**kwargs), kwargs)


# (flag_value, stale_value): the previous call's value just below, including across the 2^32
# wrap (a plain unsigned >= would pass at once on 0xFFFFFFFE >= 2) and the int32 sign change.
EPOCHS = [
    (5, 4),
    (0xFFFFFFF3, 0xFFFFFFF2),
    (2, 0xFFFFFFFE),
    (0, 0xFFFFFFFF),
    (0x80000000, 0x7FFFFFFF),
]


@pytest.mark.parametrize("flag_value,stale_value", EPOCHS, ids=lambda v: hex(v))
def test_stale_flags_do_not_pass(flag_value, stale_value):
    kwargs = dict(m_local=2048, n=8192, k=2048, bands=4, order="reversed", delay_us=500,
                  flag_value=flag_value, stale_value=stale_value, seed=3)
    _assert_exact(_check(**kwargs), kwargs)


def test_device_to_device_copies():
    """The bands copied within the GPU (a kernel: the GEMM leaves it SMs) instead of from host
    memory by the copy engine."""
    kwargs = dict(m_local=2048, n=8192, k=7168, bands=4, order="random", delay_us=DELAY_US,
                  staging="device", sm_budget=100, seed=11)
    _assert_exact(_check(**kwargs), kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(m_local=384, n=256, k=256, config="pp_128x192x64_c2"), "tile_m \\* cluster_m"),
    (dict(m_local=256, n=256, k=256, config="coop_128x256x64_c1"), "no consumer kernel"),
    (dict(m_local=256, n=256, k=256, dtype="float8_e4m3fn", config="fp8_pp_64x192x128_c2"),
     "no consumer kernel"),
    (dict(m_local=256, n=256, k=256, order="sideways"), "order must be"),
    (dict(m_local=256, n=256, k=256, staging="device"), "sm_budget"),
    (dict(m_local=256, n=256, k=256, bands=65), "bands must be"),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _check(**kwargs)
