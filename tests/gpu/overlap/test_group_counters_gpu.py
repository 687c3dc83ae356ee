"""The communicator's GEMM group counters on one GPU (csrc/comm/group_counters_check.h): real
NCCL-transport calls on a one-rank communicator, one after another, with group tables of
different sizes and failed launches between them. After every call that succeeds, each of the
communicator's counter words equals its host total (the base of the next call's waits), even
where the words held garbage before the call that zeroed them; each call's output equals the same
GEMM without signals, bit for bit. tests/cpu/test_group_counters.py checks the same totals'
arithmetic without a GPU; the multi-GPU tests in test_overlap_gpu.py check the results of calls
whose waits cross GPUs."""

import math

import pytest

from conftest import gpu_devices_or_skip

pytestmark = pytest.mark.gpu

CONFIG = "pp_128x192x64_c2"
M, N, K = 4096, 4096, 4096
EIGHT = [0, 4, 8, 12, 16, 20, 24, 28, 32]  # 8 groups of 4 tile-rows, as the overlap plans them
TWO = [0, 8, 32]                           # another call's table: fewer, unequal groups
GARBAGE = 0xDEADBEEF
WORDS = 64                                 # kMaxGemmGroups


def _mod():
    from fo_jax import _cuda

    gpu_devices_or_skip(1)
    return _cuda.module()


def _counts(group_begin):
    config = next(c for c in _mod().gemm_configs() if c["name"] == CONFIG)
    tiles_n = math.ceil(N / config["tile_n"])
    return [(b - a) * tiles_n for a, b in zip(group_begin, group_begin[1:])]


def _check(collective, calls, start_total=-1):
    mod = _mod()
    r = mod.group_counters_check(getattr(mod.Collective, collective), CONFIG, M, N, K, calls,
                                 GARBAGE, start_total)
    assert r["error"] == "", r["error"]
    assert len(r["steps"]) == len(calls)
    return r["steps"]


def _assert_counted(step, i):
    assert step["ok"], f"call {i}: {step['message']}"
    assert step["out_equal"], f"call {i}: the output differs from the unsignalled GEMM's"
    assert step["words"] == step["totals"], (
        f"call {i}: counter words {step['words']} != the totals {step['totals']}")


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_words_equal_their_totals_call_after_call(collective):
    """The first call (few groups) zeroes every word, including the garbage past its groups;
    later calls count on from what earlier calls left, whatever their group tables."""
    calls = [(TWO, False), (EIGHT, False), (EIGHT, False), (TWO, False), (EIGHT, False)]
    steps = _check(collective, calls)
    assert [s["zeroed"] for s in steps] == [True, False, False, False, False]
    for i, step in enumerate(steps):
        _assert_counted(step, i)
    assert steps[0]["words"] == _counts(TWO) + [0] * (WORDS - 2)
    total = [0] * WORDS
    for group_begin, _ in calls:
        for g, c in enumerate(_counts(group_begin)):
            total[g] += c
    assert steps[-1]["totals"] == total


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_the_call_after_a_failed_one_zeroes_every_word(collective):
    """A call whose GEMM fails to launch leaves the next call to zero the words (the check fills
    them with garbage after the failure, as a failed group may leave them); that call has fewer
    groups than the calls after it, which count their extra groups from 0."""
    calls = [(EIGHT, False), (EIGHT, True), (TWO, False), (EIGHT, False), (EIGHT, False)]
    steps = _check(collective, calls)
    assert [s["zeroed"] for s in steps] == [True, False, True, False, False]
    assert not steps[1]["ok"] and "GEMM launch failed" in steps[1]["message"], steps[1]
    for i in (0, 2, 3, 4):
        _assert_counted(steps[i], i)
    assert steps[2]["words"] == _counts(TWO) + [0] * (WORDS - 2)
    assert steps[4]["totals"][2:8] == [2 * c for c in _counts(EIGHT)[2:]]


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_waits_compare_modulo_two_to_the_32(collective):
    """Words 100 short of 2^32 (as after many calls): the calls' waits expect values past the
    wrap and still wait for the GEMM's tiles (an output read early would hold the stale bytes)."""
    start = 2**32 - 100
    steps = _check(collective, [(EIGHT, False), (EIGHT, False)], start_total=start)
    assert [s["zeroed"] for s in steps] == [False, False]
    for i, step in enumerate(steps):
        _assert_counted(step, i)
    counts = _counts(EIGHT)
    assert steps[1]["words"][:8] == [(start + 2 * c) % 2**32 for c in counts]
    assert steps[1]["words"][8:] == [start] * (WORDS - 8)


def test_bad_options_raise():
    mod = _mod()
    with pytest.raises(ValueError, match="group_counters_check"):
        mod.group_counters_check(mod.Collective.reduce_scatter, "", M, N, K, [(EIGHT, False)])
