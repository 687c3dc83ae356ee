// tests/cpu/test_peer_pools.py builds this with the system compiler: the address arithmetic of
// csrc/comm/peer_pools.h (a peer's buffer in this process's mapping of its XLA allocation, and
// this rank's own buffers in the allocation its peers mapped), at the allocation's edges and
// where a naive sum would overflow. Prints "ok <n> checks" or the first failure.
#include <cstdint>
#include <cstdio>

#include "comm/peer_pools.h"

namespace {

int checks = 0;

bool Expect(bool ok, const char* what) {
  ++checks;
  if (!ok) std::printf("FAILED: %s\n", what);
  return ok;
}

}  // namespace

int main() {
  using fo_jax::PeerPools;
  PeerPools p;
  // Rank 1's allocation: 0x7000'0000'0000 .. +1 GiB in its process, mapped here at 0x2000'0000'0000.
  p.base[1] = 0x700000000000ull;
  p.size[1] = 1ull << 30;
  p.here[1] = 0x200000000000ull;
  p.own_base = 0x500000000000ull;
  p.own_size = 1ull << 20;
  const uint64_t end = p.base[1] + p.size[1];
  bool ok = true;
  ok &= Expect(PeerAddressHere(p, 1, p.base[1], 4096) == p.here[1], "the allocation's start");
  ok &= Expect(PeerAddressHere(p, 1, p.base[1] + 12345, 100) == p.here[1] + 12345, "an offset");
  ok &= Expect(PeerAddressHere(p, 1, end - 64, 64) == p.here[1] + p.size[1] - 64,
               "a buffer that ends at the allocation's end");
  ok &= Expect(PeerAddressHere(p, 1, end - 64, 65) == 0, "one byte past the end");
  ok &= Expect(PeerAddressHere(p, 1, p.base[1] - 1, 8) == 0, "one byte before the start");
  ok &= Expect(PeerAddressHere(p, 1, end, 0) == p.here[1] + p.size[1], "empty, at the end");
  ok &= Expect(PeerAddressHere(p, 1, p.base[1], p.size[1] + 1) == 0, "larger than the allocation");
  ok &= Expect(PeerAddressHere(p, 1, UINT64_MAX - 8, 16) == 0, "a range that wraps around");
  ok &= Expect(PeerAddressHere(p, 1, p.base[1] + 8, UINT64_MAX) == 0, "a huge size");
  ok &= Expect(PeerAddressHere(p, 2, p.base[1], 8) == 0, "a rank with no allocation");
  ok &= Expect(InOwnPool(p, p.own_base, p.own_size), "the whole own allocation");
  ok &= Expect(!InOwnPool(p, p.own_base + 1, p.own_size), "one byte past the own allocation");
  ok &= Expect(!InOwnPool(p, p.own_base - 4096, 8), "before the own allocation");
  ok &= Expect(!InOwnPool(PeerPools{}, 0x1000, 8), "no own allocation exported");
  if (!ok) return 1;
  std::printf("ok %d checks\n", checks);
  return 0;
}
