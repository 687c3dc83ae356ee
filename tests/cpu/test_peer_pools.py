"""The address arithmetic of the copy engine across processes (csrc/comm/peer_pools.h): a
peer's buffer in this process's mapping of its XLA allocation, and this rank's own buffers in
the allocation its peers mapped, at the allocation's edges and where a naive sum would overflow.
Built here with the system C++ compiler (the header needs no CUDA; tests/cpu/peer_pools_check.cc)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPILER = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++")
                 if c and shutil.which(c)), None)


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler on PATH (c++, g++ or clang++)")
def test_peer_pool_address_arithmetic(tmp_path):
    exe = tmp_path / "peer_pools_check"
    build = subprocess.run(
        [COMPILER, "-std=c++17", "-O2", "-Wall", "-Werror", "-I", os.path.join(ROOT, "csrc"),
         os.path.join(ROOT, "tests", "cpu", "peer_pools_check.cc"), "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok 14 checks"), result.stdout
