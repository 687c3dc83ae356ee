// The copy worker of the copy-engine transport (copy_engine.h): the copy stream's part of a call
// (the copies into the peers' receive slots, their arrival flags, the acknowledgements) and the
// host thread that enqueues it, so that XLA's thread leaves the handler sooner (about half its
// host time). XLA's stream then holds work (the last band sum) that waits for work this thread
// enqueues later, so the thread makes only calls that never wait for the GPU to drain (graph
// launches and updates, stream memory operations, events); the graphs are built by XLA's thread
// before it hands the call over (copy_engine_graphs.h).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "comm/comm_registry.h"
#include "comm/copy_engine_args.h"
#include "comm/copy_engine_buffers.h"
#include "comm/copy_engine_flags.h"
#include "comm/host_worker.h"
#include "comm/status.h"

namespace fo_jax {

struct CopyWorker {
  cudaStream_t copy_stream = nullptr;  // highest priority
  // The arrival flags of every step but the last are written here, each after flag_event
  // (recorded on the copy stream after the copies it covers), so that the copy stream goes
  // straight on to its next copy (its step boundary took ~14 us against ~6 between copies of one
  // step with the flags inline). One event serves every flag: a stream wait follows the record
  // it was enqueued after, whatever is recorded later.
  cudaStream_t flag_stream = nullptr;
  cudaEvent_t flag_event = nullptr;
  // XLA's stream never waits on the copy stream's events (the thread records them later); the
  // last band sum waits for the own_copies flag instead. Events that XLA's stream records for the
  // copy stream are a ring per call (slot epoch % kCallEvents): a slot is re-recorded only once
  // the thread has enqueued the waits on it of the call kCallEvents earlier (NextInputsEvent
  // waits for that).
  static constexpr int kCallEvents = 8;
  cudaEvent_t inputs_ready[kCallEvents] = {};  // XLA stream: counters zeroed, inputs ready
  cudaEvent_t sums_ended[kCallEvents] = {};    // XLA stream: receive slots read (acks follow)
  std::unique_ptr<HostWorker> thread;
  std::mutex failure_mu;
  std::string failure;  // the thread's first failure ("" while none; failure_mu)
};

// The copy stream's part of one call, as the call hands it over (by value: the thread may
// enqueue it after the handler returned, and after a later call grew the receive buffers).
struct CopyJob {
  CopyEngineArgs a;
  uint32_t epoch = 0;
  int row = -1;  // timeline row of the call (-1: not recorded)
  cudaEvent_t inputs_ready = nullptr, sums_ended = nullptr;  // ring slots of the call
  void* peer_recv[kMaxCopyEngineRanks] = {};
  CopyEngineFlags* peer_flags[kMaxCopyEngineRanks] = {};
  // An all-reduce's output as each peer addresses it (OutputAddressesForPeers).
  uint64_t out_at_peer[kMaxCopyEngineRanks] = {};
};

// A call's copy job without its epoch, timeline row and events: its arguments and the peers'
// addresses as they are now.
CopyJob CopyJobFor(const CopyEngineBuffers& buffers, const CopyEngineArgs& args);

// Enqueues field(peer q's flags)[me] = e for every peer q (after the stream's earlier work:
// stream_wait.h).
Status TellPeers(CopyEngineFlags* const* peer_flags, cudaStream_t stream, RankFlags field, int P,
                 int me, uint32_t e);

// On XLA's thread, before the call's copies are handed over: builds the graph of every slot
// that one of the call's copies prefers and that has none yet, so that the thread never builds
// one (building may wait for this GPU to drain, and XLA's stream may be waiting for the
// thread's copies).
Status EnsureCopyGraphs(CommState& state, const CopyJob& job);

// The thread's job for one call: on the copy stream, after XLA's inputs are ready, each step's
// copies (the direct form: once every receiver has finished the previous call; the ring: once
// its one receiver has), each copy as soon as its group is done, then the step's arrival flag;
// at the end, this rank's own copies flagged done (the call's last band sum waits for that: the
// copies read XLA's workspace). Then, once the call has recorded its sums_ended, the
// acknowledgements. After a failure, notes it (CopyWorkerFailure) and releases the flags the
// call's partners and its own band sum wait for.
void RunCopyJob(CommState& state, const CopyJob& job);

}  // namespace fo_jax
