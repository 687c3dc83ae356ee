"""Host-only C++ checks: headers and sources that need no CUDA, built with the system C++
compiler and run (tests/cpu/*_check.cc)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILER = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++")
                 if c and shutil.which(c)), None)
needs_compiler = pytest.mark.skipif(COMPILER is None,
                                    reason="no C++ compiler on PATH (c++, g++ or clang++)")


def build_and_run(tmp_path, sources: Sequence[str], timeout: float,
                  flags: Sequence[str] = (), libs: Sequence[str] = (),
                  args: Sequence[str] = ()) -> str:
    """Compiles `sources` (paths under the repository) with csrc/ on the include path, runs the
    program (with `args`) and returns its stdout; a failed build or a non-zero exit fails the
    test."""
    exe = tmp_path / os.path.splitext(os.path.basename(sources[-1]))[0]
    build = subprocess.run(
        [COMPILER, "-std=c++17", "-O2", *flags, "-I", os.path.join(ROOT, "csrc"),
         *(os.path.join(ROOT, s) for s in sources), "-o", str(exe), *libs],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    result = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
