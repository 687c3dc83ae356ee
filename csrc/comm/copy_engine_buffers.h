// The copy-engine transport's memory (copy_engine.h): this rank's flags, NaN tile and receive
// slots, and
// the peers' addresses of theirs, learnt by an all-gather over the group's NCCL communicator.
// The memory is fo_jax's own, outside XLA's pool (device_memory.h counts it); the all-gathers go
// through the communicator's scratch (AllGatherToHost). The flags live as long as the process; a
// receive buffer lives until a larger one supersedes it (GrowCopyEngineBuffers frees it where no
// call can be using it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm_registry.h"
#include "comm/copy_engine_flags.h"
#include "comm/peer_pools.h"
#include "comm/status.h"

namespace fo_jax {

struct CopyEngineBuffers {
  CopyEngineFlags* flags = nullptr;  // this rank's, device memory (every epoch word set once)
  // kNanTileBytes of NaNs (every byte 0xFF: a NaN in bf16 and in fp16), never written again:
  // what the ring GEMM's tiles add instead of a released call's slots
  // (SignalingGemmArgs::addend_nan).
  void* nan_tile = nullptr;
  void* recv = nullptr;              // receive slots: rounds * (P - 1) chunks
  size_t recv_bytes = 0;
  void* peer_recv[kMaxCopyEngineRanks] = {};
  CopyEngineFlags* peer_flags[kMaxCopyEngineRanks] = {};
  // Whether peer q is in another process, so that peer_recv[q] and peer_flags[q] are this
  // process's CUDA IPC mappings of its memory (peer_memory_ipc.h), closed by this process.
  bool peer_ipc[kMaxCopyEngineRanks] = {};
  // The all-reduce with peers in other processes (copy_engine_output_pools.h): this rank's XLA
  // allocation that those peers have mapped, and each one's address of it (0 for peers in this
  // process, which use this rank's own addresses).
  bool out_pools_mapped = false;
  PeerPools out_pools;
  // The epoch of "no call yet": every flag starts at it and the state's epoch counts on from it
  // (0; SetTestEpochStartForTests moves it near the 32-bit wrap).
  uint32_t epoch_start = 0;
};

// The NaN tile's size: a tile of up to 256 x 256 two-byte elements (every GEMM config's).
inline constexpr size_t kNanTileBytes = 256 * 256 * 2;

// Allocates the flags (every epoch word set to the epoch start) and the NaN tile, both set in
// `state`'s comm stream order.
Status CreateCopyEngineBuffers(CommState& state, CopyEngineBuffers& buffers);

// Before a call's GEMM: on first use, and when a larger call arrives, allocates a receive buffer
// of `recv_bytes` at least (doubling) and exchanges addresses with the other ranks over the
// communicator: collective, blocks until every rank arrives (all ranks make the same calls in
// the same order, so they grow their buffers in the same calls). A rank whose allocation fails
// still takes part in the exchange and reports it there, so every rank of the group fails the
// same call (none enqueues work that waits for it) and keeps its previous buffer. The buffer a
// larger one supersedes is freed once the exchange has shown every rank past all its earlier
// calls' enqueueing (see the definition). Peers in this process are reached by their addresses;
// peers in other processes of this host by mapping the CUDA IPC handles that travel in the
// exchange (peer_memory_ipc.h): the flags once, each receive buffer generation once, a
// superseded mapping closed where its owner frees the buffer. Every rank's outcome of those
// checks and mappings goes through a second all-gather, so a rank on another host, a GPU
// without peer access or a failed mapping fails the call on every rank.
Status GrowCopyEngineBuffers(CommState& state, CopyEngineBuffers& buffers, size_t recv_bytes);

// This call's output `out` as each peer q addresses it, into at[q]: its own address for a peer in
// this process, its place in the peer's mapping of this rank's XLA allocation for a peer in
// another process (once MapOutputPools has run; meaningless for an output outside it, which
// OutputInPeersMapping refuses).
void OutputAddressesForPeers(const CopyEngineBuffers& buffers, int nranks, const void* out,
                             uint64_t* at);

// Test hook (FO_JAX_TEST_EPOCH_START, fo_jax/_env.py): the epoch start of every copy-engine
// state created from now on, e.g. 2^32 - 8 so that a few calls cross the 32-bit wrap.
void SetTestEpochStartForTests(uint32_t start);

// Test hook (FO_JAX_TEST_FAIL=alloc:<rank>, fo_jax/_env.py): the receive-buffer allocation of
// that rank fails as if the GPU were out of memory (-1: none).
void SetFailReceiveAllocForTests(int rank);

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
