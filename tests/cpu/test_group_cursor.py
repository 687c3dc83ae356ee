"""The signaling GEMM epilogue's group lookup (csrc/kernels/group_cursor.h) against a binary search:
its host build, compiled here with the system C++ compiler (the header needs no CUDA or CUTLASS)
and run over random tables and query sequences (tests/cpu/group_cursor_check.cc)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPILER = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++")
                 if c and shutil.which(c)), None)


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler on PATH (c++, g++ or clang++)")
def test_group_cursor_matches_binary_search(tmp_path):
    exe = tmp_path / "group_cursor_check"
    subprocess.run([COMPILER, "-std=c++17", "-O2", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "cpu", "group_cursor_check.cc"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok "), result.stdout
