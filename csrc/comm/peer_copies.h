// The copy stream's part of a copy-engine call (peer_transport.h): the copies into the peers'
// receive slots, their arrival flags and the acknowledgements, enqueued by the copy thread (or
// inline on XLA's thread), and the graphs those copies are launches of. Internal to the
// transport; the flag layout is PeerSyncRegion's.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/comm_registry.h"
#include "comm/peer_transport.h"

namespace fo_jax {

inline std::string CudaMessage(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

inline uint32_t* Region(uint32_t* sync, PeerSyncRegion r) { return sync + r * kMaxPeerRanks; }

// The out table (all-reduce): slot j holds the 64-bit output address of rank (this + 1 + j) % P.
inline uint64_t* OutTable(uint32_t* sync) {
  return reinterpret_cast<uint64_t*>(Region(sync, kOutTable));
}

// Receive slot of round h, step j (j = P - 1 would be the own chunk, which is not sent).
inline int Slot(int P, int h, int j) { return h * (P - 1) + j; }

// Byte offset of chunk (round h, owner b) in the GEMM output (the workspace; the output itself
// for an all-reduce).
inline size_t ChunkOffset(int P, int h, int b, size_t chunk_bytes) {
  return size_t(h * P + b) * chunk_bytes;
}

// Group g's place among the groups (pieces) of that chunk, or -1 if it is not one of them:
// SumSplit::kByRows flags each piece on landing (Region kLastPieces + piece).
inline int LastChunkPiece(const PeerCollectiveArgs& a, int P, int g) {
  const int first = a.chunk_first_group[LastSentChunk(P, a.rounds)];
  const int end = a.chunk_first_group[LastSentChunk(P, a.rounds) + 1];
  return g >= first && g < end ? g - first : -1;
}

// Enqueues *Region(peer q's sync, region)[me] = e for every peer q (after the stream's earlier
// work: stream_wait.h).
cudaError_t TellPeers(uint32_t* const* peer_sync, cudaStream_t stream, PeerSyncRegion region,
                      int P, int me, uint32_t e, std::string* error);

// The copy stream's part of one call, as the handler hands it over (by value: the copy thread
// may enqueue it after the handler returned, and after a later call grew the receive buffers).
struct CopyJob {
  PeerCollectiveArgs a;
  uint32_t epoch = 0;
  int row = -1;  // timeline row of the call (-1: not recorded)
  cudaEvent_t inputs_ready = nullptr, sums_ended = nullptr;  // ring slots of the call
  void* peer_recv[kMaxPeerRanks] = {};
  uint32_t* peer_sync[kMaxPeerRanks] = {};
};

// A call's copy job without its epoch, timeline row and events: its arguments and the peers'
// addresses as they are now.
inline CopyJob CopyJobFor(const PeerState& p, const PeerCollectiveArgs& a) {
  CopyJob job;
  job.a = a;
  std::copy(p.peer_recv, p.peer_recv + kMaxPeerRanks, job.peer_recv);
  std::copy(p.peer_sync, p.peer_sync + kMaxPeerRanks, job.peer_sync);
  return job;
}

// On XLA's thread, before the call's copies are enqueued (by the copy thread or inline): builds
// the graph of every slot that one of the call's copies prefers and that has none yet, so that
// the copy thread never builds one (building may wait for this GPU to drain, and XLA's stream
// may be waiting for the copy thread's copies: NOTES §19).
cudaError_t EnsureCopyGraphs(CommState& s, const CopyJob& job, std::string* error);

// On the copy stream: after XLA's inputs are ready, each step's copies once their receiver has
// finished the previous call, each copy as soon as its group is done, then the step's arrival
// flag; at the end, flags this rank's own copies done (the call's last band sum waits for that:
// the copies read XLA's workspace).
cudaError_t EnqueueCopies(CommState& s, const CopyJob& job, std::string* error);

// On the copy stream, once XLA's stream has read the receive slots (the call's last band sum):
// acknowledge to every sender that they are free again.
cudaError_t EnqueueAcks(CommState& s, const CopyJob& job, std::string* error);

// The copy thread's job for one call: EnqueueCopies, then (once the handler has recorded the
// call's sums_ended) EnqueueAcks; after a failure, notes it (PeerCopyFailure) and releases the
// flags the call's partners and its own band sum wait for.
void RunCopyJob(CommState& s, const CopyJob& job);

}  // namespace fo_jax
