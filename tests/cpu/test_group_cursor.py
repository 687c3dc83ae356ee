"""The signaling GEMM epilogue's group lookup (csrc/kernels/group_cursor.h) against a binary search:
its host build, compiled here with the system C++ compiler (the header needs no CUDA or CUTLASS)
and run over random tables and query sequences (tests/cpu/group_cursor_check.cc)."""

from __future__ import annotations

from host_cxx import build_and_run, needs_compiler


@needs_compiler
def test_group_cursor_matches_binary_search(tmp_path):
    out = build_and_run(tmp_path, ["tests/cpu/group_cursor_check.cc"], timeout=120)
    assert out.startswith("ok "), out
