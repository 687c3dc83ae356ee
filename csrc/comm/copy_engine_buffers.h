// The copy-engine transport's memory (copy_engine.h): this rank's flags and receive slots, and
// the peers' addresses of theirs, learnt by an all-gather over the group's NCCL communicator.
// Every buffer lives as long as the process: freeing one would synchronize the device while
// other work may be in flight.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/comm_registry.h"
#include "comm/copy_engine_flags.h"
#include "comm/status.h"

namespace fo_jax {

struct CopyEngineBuffers {
  CopyEngineFlags* flags = nullptr;  // this rank's, device memory (zeroed once)
  void* recv = nullptr;              // receive slots: rounds * (P - 1) chunks
  size_t recv_bytes = 0;
  void* exchange = nullptr;  // device scratch of the address all-gather
  void* peer_recv[kMaxCopyEngineRanks] = {};
  CopyEngineFlags* peer_flags[kMaxCopyEngineRanks] = {};
};

// Allocates the flags (zeroed in `state`'s comm stream order) and the exchange scratch.
Status CreateCopyEngineBuffers(CommState& state, CopyEngineBuffers& buffers);

// Before a call's GEMM: on first use, and when a larger call arrives, allocates a receive buffer
// of `recv_bytes` at least (doubling; the old one is kept) and exchanges addresses with the
// other ranks over the communicator: collective, blocks until every rank arrives (all ranks make
// the same calls in the same order, so they grow their buffers in the same calls). Checks that
// every rank is in this process and that this GPU reaches every peer's memory.
Status GrowCopyEngineBuffers(CommState& state, CopyEngineBuffers& buffers, size_t recv_bytes);

// "" when every ordered pair of these local device ordinals has peer access, else why not.
std::string PeerAccessProblem(const std::vector<int>& ordinals);

// Receive slot of round h, step j (j = P - 1 would be the own chunk, which is not sent).
inline int Slot(int P, int h, int j) { return h * (P - 1) + j; }

// Byte offset of chunk (round h, owner b) in the GEMM output (the workspace; the output itself
// for an all-reduce).
inline size_t ChunkOffset(int P, int h, int b, size_t chunk_bytes) {
  return size_t(h * P + b) * chunk_bytes;
}

}  // namespace fo_jax
