"""The copy-engine all-gather's exchange across processes (csrc/comm/ag_exchange.h): built here
with the system C++ compiler (the file needs no CUDA) and run as forked processes, one rank each
(tests/cpu/ag_exchange_check.cc): 200 calls in lockstep through the 8-slot ring, a peer whose
process ends (between calls, and holding the exchange's lock), a waiter killed inside its wait, a
silent peer, the ring waiting for the slowest copy thread, the take handshake (a rank that gives
up on a call after publishing it leaves the bands of a peer that took it to that peer, raced), and
the same table within one process."""

from __future__ import annotations

import sys

import pytest
from host_cxx import build_and_run, needs_compiler


@needs_compiler
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="POSIX shared memory, robust mutexes, futexes and /proc: Linux")
def test_exchange_across_processes(tmp_path):
    out = build_and_run(tmp_path, ["csrc/comm/ag_exchange.cc", "tests/cpu/ag_exchange_check.cc"],
                        timeout=300, flags=["-pthread"], libs=["-lrt"])
    assert out.startswith("ok 8 cases"), out


@needs_compiler
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="POSIX shared memory, robust mutexes, futexes and /proc: Linux")
def test_cost_probe_runs(tmp_path):
    """dev/probes_host/ag_exchange_cost.cc (the exchange's host time per call) still builds
    against the exchange and completes its calls: 4 ranks with idle threads, one short round. Its
    times are not checked here (docs/performance.md, "Processes", has the measured ones)."""
    out = build_and_run(tmp_path, ["csrc/comm/ag_exchange.cc",
                                   "dev/probes_host/ag_exchange_cost.cc"],
                        timeout=120, flags=["-pthread"], libs=["-lrt"],
                        args=["4", "200", "20", "1"])
    assert out.startswith("P=4 calls=200 idle threads=20: median "), out
    assert "us per call (rounds: " in out, out
