"""The copy-engine all-gather's exchange across processes (csrc/comm/ag_exchange.h): built here
with the system C++ compiler (the file needs no CUDA) and run as forked processes, one rank each
(tests/cpu/ag_exchange_check.cc): 200 calls in lockstep through the 8-slot ring, a peer whose
process ends (between calls, and holding the exchange's lock), a waiter killed inside its wait, a
silent peer, the ring waiting for the slowest copy thread, and the same table within one
process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPILER = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++")
                 if c and shutil.which(c)), None)


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler on PATH (c++, g++ or clang++)")
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="POSIX shared memory, robust mutexes and /proc: Linux")
def test_exchange_across_processes(tmp_path):
    exe = tmp_path / "ag_exchange_check"
    build = subprocess.run(
        [COMPILER, "-std=c++17", "-O2", "-pthread", "-I", os.path.join(ROOT, "csrc"),
         os.path.join(ROOT, "csrc", "comm", "ag_exchange.cc"),
         os.path.join(ROOT, "tests", "cpu", "ag_exchange_check.cc"), "-o", str(exe), "-lrt"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok 7 cases"), result.stdout
