// Per-device state for overlapped collectives: a dedicated NCCL communicator per tensor-parallel
// group (never one that XLA's own collectives use), a high-priority comm stream and two events.
// Created on first use for a (device, unique id, options) key and kept for the process lifetime;
// thread-safe, since XLA drives each local device from its own host thread.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

namespace fo_jax {

struct CommOptions {
  int max_ctas = 0;  // NCCL CTAs per collective at most (0: NCCL's default)
  int min_ctas = 0;  // at least (0: NCCL's default)
  // CTAs per thread-block cluster of NCCL's kernels. NCCL's sm90 default (4) needs 4 free SMs of
  // one GPC at once, which a running persistent GEMM may not leave; 1 lets NCCL use any free SM.
  // A precaution: at TP=2 on H200 it changed overlapped times by under 2% (benchmarks/NOTES.md).
  int cga_cluster_size = 1;
};

struct PeerState;  // comm/peer_transport.h

struct CommState {
  int device = -1;
  int nranks = 0;
  int rank = -1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;       // comm stream, highest priority
  cudaEvent_t inputs_ready = nullptr;  // recorded on XLA's stream, waited on by the comm stream
  cudaEvent_t comm_done = nullptr;     // recorded on the comm stream, waited on by XLA's stream
  std::shared_ptr<PeerState> peer;     // copy-engine transport, created on its first use
};

// Returns the state for this key, creating it (blocking until every rank of the group joined)
// on first use. The calling thread's current device must be `device`. On failure returns nullptr
// and sets *error; the failure is remembered, later calls return it again without hanging.
CommState* GetOrCreateCommState(int device, const ncclUniqueId& id, int nranks, int rank,
                                const CommOptions& options, std::string* error);

// ncclCommGetAsyncError as a message ("" when fine). Checked at the start of every call, before
// anything is enqueued, so the error reaches Python as the call's exception.
std::string CommAsyncError(const CommState& state);

// Fault injection for the tests: while `code` (an ncclResult_t) is not ncclSuccess, every
// communicator's CommAsyncError reports it as an asynchronous NCCL error, as if NCCL had
// (NCCL's own detection cannot be provoked on one healthy machine). 0 turns it off.
void InjectAsyncErrorForTests(int code);

}  // namespace fo_jax
