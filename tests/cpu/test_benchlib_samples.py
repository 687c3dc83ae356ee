"""benchmarks/benchlib.py: per-round kernel-time samples and the paired overhead of one method
over another (no GPU: the profiler's kernel events are replaced by hand-made ones)."""

import contextlib
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import benchlib  # noqa: E402


def test_paired_overhead_pairs_rounds_not_medians():
    # The clock drifts down over the run: each round's pair shares it, the medians would not.
    base = [1.00, 1.10, 1.20, 1.30, 1.40]
    signal = [1.02, 1.122, 1.224, 1.326, 1.428]  # +2% in every round
    med, low, high = benchlib.paired_overhead(signal, base)
    assert med == pytest.approx(0.02) and low == pytest.approx(0.02)
    assert high == pytest.approx(0.02)
    med, low, high = benchlib.paired_overhead([1.01, 1.03, 1.00], [1.0, 1.0, 1.0])
    assert (med, low, high) == pytest.approx((0.01, 0.0, 0.03))


@pytest.mark.parametrize("samples,baseline", [([1.0], [1.0, 1.0]), ([], [])])
def test_paired_overhead_needs_one_sample_per_round(samples, baseline):
    with pytest.raises(ValueError, match="paired_overhead"):
        benchlib.paired_overhead(samples, baseline)


def test_median_is_the_helpers_median():
    assert benchlib.median([3.0, 1.0, 2.0]) == 2.0
    assert benchlib.median([4.0, 1.0, 3.0, 2.0]) == 3.0  # the upper middle, as before


def test_kernel_ms_samples_one_sample_per_round_and_method(monkeypatch):
    order = []
    per_call_ns = {"a": 2_000_000, "b": 3_000_000}  # 2 ms and 3 ms of kernels per call
    current = {}

    def fake_fn(name):
        def f():
            current["name"] = name
            return 0
        return f

    def fake_events(_tdir):
        name = current["name"]
        order.append(name)
        # two kernels per call, `calls` calls in the trace
        return {0: [("k", 0, per_call_ns[name] // 2)] * (2 * 4)}

    monkeypatch.setattr(benchlib, "kernel_events", fake_events)
    monkeypatch.setattr(benchlib.jax.profiler, "trace", lambda _d: contextlib.nullcontext())
    got = benchlib.kernel_ms_samples({"a": fake_fn("a"), "b": fake_fn("b")}, calls=4, rounds=3)
    assert got == {"a": [2.0, 2.0, 2.0], "b": [3.0, 3.0, 3.0]}
    assert len(order) == 6 and order[:2] != order[2:4]  # rotated: the rounds alternate
    assert benchlib.kernel_ms_interleaved(
        {"a": fake_fn("a"), "b": fake_fn("b")}, calls=4, rounds=3) == {"a": 2.0, "b": 3.0}


def test_gpu_ms_samples_kernels_alone_leave_out_the_memsets(monkeypatch):
    # Per call: a memset of 1 us, then a kernel of 100 us starting 2 us later.
    calls = 4
    events = []
    for c in range(calls):
        t = c * 200_000
        events.append(("Memset (Device)", t, t + 1_000))
        events.append(("void cutlass::device_kernel<...>", t + 3_000, t + 103_000))
    monkeypatch.setattr(benchlib, "kernel_events", lambda _tdir: {0: events})
    monkeypatch.setattr(benchlib.jax.profiler, "trace", lambda _d: contextlib.nullcontext())
    kernel, span, alone = benchlib.gpu_ms_samples({"a": lambda: 0}, calls=calls, rounds=2)
    assert kernel["a"] == pytest.approx([0.101, 0.101])
    assert alone["a"] == pytest.approx([0.100, 0.100])
    assert span["a"] == pytest.approx([(3 * 200_000 + 103_000) / 1e6 / calls] * 2)
    assert benchlib.is_memset("MemsetD32Async") and not benchlib.is_memset("fo_jax::BandSum")


def test_kernel_ms_samples_refuses_a_trace_without_gpu_kernels(monkeypatch):
    monkeypatch.setattr(benchlib, "kernel_events", lambda _tdir: {})
    monkeypatch.setattr(benchlib.jax.profiler, "trace", lambda _d: contextlib.nullcontext())
    with pytest.raises(RuntimeError, match="no GPU kernel"):
        benchlib.kernel_ms_samples({"a": lambda: 0}, calls=1, rounds=1)


def test_wall_ms_samples_one_sample_per_round_and_method(monkeypatch):
    order = []
    per_call = {"a": (0.5, 2.0), "b": (0.6, 3.0)}  # (host ms, wall ms) per call

    def fake_dispatch(f, *args, calls):
        assert calls == 16 and args == (7,)
        order.append(f.__name__)
        return per_call[f.__name__]

    def a(x):
        return x

    def b(x):
        return x

    monkeypatch.setattr(benchlib, "dispatch_and_wall_ms", fake_dispatch)
    wall, host = benchlib.wall_ms_samples({"a": a, "b": b}, 7, calls=16, rounds=3)
    assert wall == {"a": [2.0, 2.0, 2.0], "b": [3.0, 3.0, 3.0]}
    assert host == {"a": [0.5, 0.5, 0.5], "b": [0.6, 0.6, 0.6]}
    assert len(order) == 6 and order[:2] != order[2:4]  # rotated: the rounds alternate
