// How one rank of the copy-engine all-gather reaches its peers when the group spans processes
// of one host (docs/design.md, "Copy engine across processes"). A peer's per-call destination
// (its gathered output and band flags, both XLA's buffers) travels as the owner's addresses in
// the group's exchange, now a shared-memory segment (ag_exchange.h); this rank writes through
// its mapping of the owner's XLA allocation (xla_pool_ipc.h: with JAX's preallocated pool one
// mapping covers every call), so an address is the owner's minus its allocation's base plus
// this rank's mapping of it. The owner's "call started" events are a fixed ring created
// cudaEventInterprocess; each peer opens the ring once from its IPC handles and waits on the
// slot of the call's epoch. Peers in this process keep their own addresses and events.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "comm/ag_exchange.h"
#include "comm/comm_registry.h"
#include "comm/copy_engine_output_pools.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"

namespace fo_jax {

struct AgPeers {
  bool other_process[kMaxCopyEngineRanks] = {};  // rank q lives in another process
  PeerPools pools;                                // every rank's XLA allocation, mapped here
  // Each peer in another process's ring of "call started" events, opened in this process.
  cudaEvent_t events[kMaxCopyEngineRanks][kAgRing] = {};
};

// Collective (every rank of the group, in the same call): which ranks live in another process
// than this one (by process id), into other_process; *any when at least one does. A rank on
// another host is an error (CUDA IPC maps memory only within one host).
Status AllGatherProcessLayout(CommState& state, bool other_process[kMaxCopyEngineRanks],
                              bool* any);

// Collective, on the group's first all-gather when it spans processes: maps every peer's XLA
// allocation (MapPeerPools, from this call's gathered output), opens the group's exchange in
// shared memory (rank 0 creates it and names it to the others) and each peer's ring of events
// from their IPC handles (own_events: this rank's ring, created cudaEventInterprocess). Every
// rank's outcome goes through a last all-gather, so the group connects or fails together (none
// enqueues work that waits for another); the segment's name is removed from /dev/shm either way.
Status ConnectAllGatherPeers(CommState& state, const void* gathered, uint64_t gathered_bytes,
                             const cudaEvent_t own_events[kAgRing],
                             const bool other_process[kMaxCopyEngineRanks],
                             std::unique_ptr<AgExchange>* exchange, AgPeers* peers);

// Rank q's [addr, addr + bytes) (the owner's addresses) in this process's mapping of its XLA
// allocation; nullptr where the range leaves the allocation (peer_pools.h).
inline void* PeerAddressHere(const AgPeers& peers, int q, uint64_t addr, uint64_t bytes) {
  return reinterpret_cast<void*>(PeerAddressHere(peers.pools, q, addr, bytes));
}

// Whether this rank's [ptr, ptr + bytes) lies in its own allocation that the peers mapped.
inline bool InOwnPool(const AgPeers& peers, const void* ptr, uint64_t bytes) {
  return InOwnPool(peers.pools, reinterpret_cast<uint64_t>(ptr), bytes);
}

}  // namespace fo_jax
