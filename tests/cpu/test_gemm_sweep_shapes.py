"""benchmarks/bench_gemm_sweep.py's shape selection: --min-m and --max-m keep the shapes of the
sweep (or of --shapes, --quick) whose M lies in range, in order, and refuse an empty range."""

import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_gemm_sweep  # noqa: E402


def _args(**kw):
    base = dict(shapes=None, quick=False, min_m=0, max_m=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_whole_sweep_by_default():
    assert bench_gemm_sweep.chosen_shapes(_args()) == bench_gemm_sweep.sweep_shapes()


def test_the_m_range_splits_the_sweep_in_two_halves_of_33():
    small = bench_gemm_sweep.chosen_shapes(_args(max_m=2048))
    large = bench_gemm_sweep.chosen_shapes(_args(min_m=4096))
    assert len(small) == len(large) == 33
    assert [s for s in bench_gemm_sweep.sweep_shapes() if s[0] < 4096] == small
    assert {s[0] for s in large} == {4096, 8192, 16384, 32768}


def test_the_range_applies_to_named_shapes_too():
    got = bench_gemm_sweep.chosen_shapes(_args(shapes=["512x1024x2048", "8192x1024x2048"],
                                               min_m=1024))
    assert [s[:3] for s in got] == [(8192, 1024, 2048)]


def test_an_empty_range_is_refused():
    with pytest.raises(SystemExit, match="no shape with 65536 <= M"):
        bench_gemm_sweep.chosen_shapes(_args(min_m=65536))
