"""benchmarks/trace_timing.py: the call-interleaved schedule of a trace, the attribution of
kernels to methods by module tag and host windows, and what the timer reports per method (no
GPU: events are built by hand)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import trace_timing  # noqa: E402


@pytest.mark.parametrize("methods,calls", [(1, 8), (2, 8), (3, 3), (16, 8)])
def test_schedule_spreads_every_method_over_the_trace(methods, calls):
    order = list(range(methods))
    seq = trace_timing.schedule(order, calls)
    assert len(seq) == methods * calls
    for c in range(calls):  # each pass calls every method once
        assert sorted(seq[c * methods:(c + 1) * methods]) == order
    for k in order:
        places = [i for i, key in enumerate(seq) if key == k]
        # one call per pass, so a method's calls span the trace from its first to its last pass
        assert places[0] < methods and places[-1] >= (calls - 1) * methods
        if calls % 2 == 0 and methods > 1:
            # forward and backward passes in pairs: the mean place within a pass is the middle
            mean = sum(i % methods for i in places) / calls
            assert mean == (methods - 1) / 2, (k, mean)


def test_attribute_by_tag_then_by_any_window_of_the_method():
    # Two methods, two calls each, interleaved: a tagged kernel and an untagged memset per call.
    windows = {0: [(0, 10), (40, 50)], 1: [(20, 30), (60, 70)]}
    events = [(1, 5, "gemm", 0), (6, 7, "Memset", None),
              (21, 25, "xla", 1), (26, 27, "Memset", None),
              (41, 45, "gemm", 0), (46, 47, "Memset", None),
              (61, 65, "xla", 1), (66, 68, "Memset", None)]
    spans = trace_timing.attribute(events, windows, [0, 1])
    assert spans == {0: [(4, "gemm"), (1, "Memset"), (4, "gemm"), (1, "Memset")],
                     1: [(4, "xla"), (1, "Memset"), (4, "xla"), (2, "Memset")]}


def test_attribute_without_windows_follows_the_last_tag():
    events = [(1, 5, "gemm", 0), (6, 7, "Memset", None), (21, 25, "xla", 1)]
    spans = trace_timing.attribute(events, {}, [0, 1])
    assert spans == {0: [(4, "gemm"), (1, "Memset")], 1: [(4, "xla")]}


def test_attribute_distrusts_windows_that_contradict_the_tags():
    # The host clock places method 1's kernel in method 0's window: windows are dropped, tags rule.
    events = [(1, 5, "gemm", 0), (6, 9, "xla", 1)]
    spans = trace_timing.attribute(events, {0: [(0, 10)], 1: [(20, 30)]}, [0, 1])
    assert spans == {0: [(4, "gemm")], 1: [(3, "xla")]}


def test_timer_reports_the_median_the_main_kernel_and_its_share(monkeypatch):
    """Per method: the median over rounds of its kernels' time per call, the kernel that took
    most of it over all rounds, and that kernel's share (an XLA GEMM followed by an elementwise
    fusion it did not fold reads about one half)."""
    timer = trace_timing.TraceTimer(rounds=3, calls=2)
    spans = iter([
        {0: [(4000, "gemm"), (4000, "gemm"), (4400, "convert")], 1: [(2000, "fo")]},
        {0: [(4200, "gemm"), (4200, "gemm"), (4000, "convert")], 1: [(2200, "fo")]},
        {0: [(4100, "gemm"), (4100, "gemm"), (4300, "convert")], 1: [(2100, "fo")]},
    ])
    monkeypatch.setattr(timer, "_round", lambda fns, order: next(spans))
    got = timer({0: None, 1: None})
    assert got[0].kernel == "gemm" and got[1] == (0.00105, "fo", 1.0)
    assert got[0].ms == (8000 + 4400) / 1e6 / 2  # the median round's total per call
    assert abs(got[0].share - 24600 / (24600 + 12700)) < 1e-12
