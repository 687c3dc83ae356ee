"""The communicator's GEMM group counters across calls, without a GPU (csrc/comm/group_counters.h):
the values a reduce-scatter's waits expect, call after call, against counts computed here from
the configuration's tiles. The counters are zeroed by a communicator's first call and by the
call after one that did not end well; between calls that succeed each word only grows, and a
call waits for its group's tile count past what the earlier calls left (modulo 2^32)."""

import math

import pytest

import fo_jax

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="CUDA module not built here (no nvcc at install time)")

CONFIG = "pp_128x192x64_c2"
ROWS, N, K = 4096, 8192, 2048
EIGHT = [0, 4, 8, 12, 16, 20, 24, 28, 32]  # the overlap's 8 groups of 4 tile-rows
TWO = [0, 8, 32]                           # another call's table: fewer, unequal groups


def _mod():
    return fo_jax._cuda.module()


def _counts(group_begin, batch=1, n=N):
    config = next(c for c in _mod().gemm_configs() if c["name"] == CONFIG)
    tiles_n = math.ceil(n / config["tile_n"])
    return [batch * (b - a) * tiles_n for a, b in zip(group_begin, group_begin[1:])]


def _waits(calls, batch=1, start_total=-1):
    return _mod().group_counter_waits(CONFIG, ROWS * batch, N, K, batch, calls, start_total)


def test_first_call_zeroes_and_waits_for_its_counts():
    [(zero, expected)] = _waits([(EIGHT, True)])
    assert zero
    assert expected == _counts(EIGHT) == [4 * 43] * 8


def test_calls_that_succeed_count_on_without_zeroing():
    calls = [(EIGHT, True), (EIGHT, True), (TWO, True), (EIGHT, True)]
    got = _waits(calls)
    assert [zero for zero, _ in got] == [True, False, False, False]
    total = [0] * 8
    for (group_begin, _), (_, expected) in zip(calls, got):
        counts = _counts(group_begin)
        assert expected == [total[g] + c for g, c in enumerate(counts)]
        for g, c in enumerate(counts):
            total[g] += c
    # Groups a call does not have keep their totals for the next call that has them.
    assert got[3][1][2:] == [2 * 172 + 172] * 6


def test_call_after_one_that_did_not_end_well_zeroes_again():
    got = _waits([(EIGHT, True), (EIGHT, False), (TWO, True), (EIGHT, True)])
    assert [zero for zero, _ in got] == [True, False, True, False]
    assert got[1][1] == [2 * 172] * 8      # the failed call waited past the first one's counts
    assert got[2][1] == _counts(TWO)       # ... and the next starts from zero
    assert got[3][1] == [c + 172 for c in _counts(TWO)] + [172] * 6


def test_batched_table_counts_every_band():
    # The NCCL transport's reduce-scatter: `batch` = P bands, each group spans all of them.
    got = _waits([(EIGHT, True), (EIGHT, True)], batch=4)
    assert got[0][1] == _counts(EIGHT, batch=4)
    assert got[1][1] == [2 * c for c in _counts(EIGHT, batch=4)]


def test_waits_wrap_modulo_two_to_the_32():
    start = 2**32 - 100
    [(zero, expected), (_, after)] = _waits([(EIGHT, True), (EIGHT, True)], start_total=start)
    assert not zero
    assert expected == [(start + 172) % 2**32] * 8 == [72] * 8
    assert after == [244] * 8


def test_bad_tables_raise():
    with pytest.raises(ValueError, match="group_counter_waits"):
        _waits([([0, 40], True)])  # past the 32 tile-rows
    with pytest.raises(ValueError, match="group_counter_waits"):
        _waits([([0], True)])
