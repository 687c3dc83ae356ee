// Every rank's XLA allocation as one rank reaches it across processes (MapPeerPools,
// copy_engine_output_pools.h), and the address arithmetic on it. Host-only and CUDA-free, so
// tests/cpu/peer_pools_check.cc builds it with the system compiler.
#pragma once

#include <cstdint>

namespace fo_jax {

inline constexpr int kPeerPoolRanks = 16;  // kMaxCopyEngineRanks (overlap_plan.h)

// Peers in this process (and this rank) use their own addresses: `here` and `at_peer` are 0
// for them.
struct PeerPools {
  uint64_t own_base = 0, own_size = 0;     // this rank's allocation, at its own addresses
  uint64_t base[kPeerPoolRanks] = {};      // each rank's allocation, at its owner's addresses
  uint64_t size[kPeerPoolRanks] = {};
  uint64_t here[kPeerPoolRanks] = {};      // this process's mapping of it
  uint64_t at_peer[kPeerPoolRanks] = {};   // each peer's mapping of this rank's allocation
};

// Whether [addr, addr + bytes) lies in [base, base + size), without overflow.
inline bool RangeInside(uint64_t addr, uint64_t bytes, uint64_t base, uint64_t size) {
  return addr >= base && bytes <= size && addr - base <= size - bytes;
}

// Rank q's [addr, addr + bytes) (the owner's addresses) in this process's mapping of its
// allocation, or 0 where the range leaves the allocation.
inline uint64_t PeerAddressHere(const PeerPools& p, int q, uint64_t addr, uint64_t bytes) {
  return RangeInside(addr, bytes, p.base[q], p.size[q]) ? p.here[q] + (addr - p.base[q]) : 0;
}

// Whether this rank's [addr, addr + bytes) lies in its own allocation that the peers mapped.
inline bool InOwnPool(const PeerPools& p, uint64_t addr, uint64_t bytes) {
  return RangeInside(addr, bytes, p.own_base, p.own_size);
}

}  // namespace fo_jax
