"""The address arithmetic of the copy engine across processes (csrc/comm/peer_pools.h): a
peer's buffer in this process's mapping of its XLA allocation, and this rank's own buffers in
the allocation its peers mapped, at the allocation's edges and where a naive sum would overflow.
Built here with the system C++ compiler (the header needs no CUDA;
tests/cpu/peer_pools_check.cc)."""

from __future__ import annotations

from host_cxx import build_and_run, needs_compiler


@needs_compiler
def test_peer_pool_address_arithmetic(tmp_path):
    out = build_and_run(tmp_path, ["tests/cpu/peer_pools_check.cc"], timeout=60,
                        flags=["-Wall", "-Werror"])
    assert out.startswith("ok 14 checks"), out
