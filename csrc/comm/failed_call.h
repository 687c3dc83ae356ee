// What a copy-engine call (copy_engine.h) that fails on this rank after the address exchange
// still owes its peers, and the enqueueing of it (docs/design.md, "Failure handling"). Once every
// rank of the group is past the exchange of a call, each peer's GPU work of that call waits for
// words that this rank writes into the peer's CopyEngineFlags (its arrival flags, an
// all-reduce's output address and `stored`) and the peer's next call for this rank's
// acknowledgement. A rank that fails to enqueue its part (a copy graph that cannot be built, the
// GEMM launch, the copy worker's hand-off) writes those words anyway, so nobody waits for it; the
// call's output is undefined on every rank and the group is failed (comm_registry.h), so every
// later call raises.
//
// The invariant: a failed call of epoch e writes exactly the words that the normal path would
// have written for epoch e in the peers' flags (FailedCallReleases lists them), each with the
// value e, with the same stream memory operations, ordered after every earlier write of the
// same word by this rank (the copy worker's streams for its words, XLA's for `stored`). So a
// word never goes back (the previous call's write of e - 1 lands first), a
// peer's wait for epoch e or earlier is satisfied exactly as by a healthy call, and no wait of a
// later epoch is satisfied early. An all-reduce's output address is this call's own output, and
// the call's XLA stream then waits until every peer has stored into it (its `stored` word), as a
// healthy call does: a peer never stores into memory this call no longer owns.
//
// Before those words, the release writes e into the `abandoned` word of every peer it releases
// (and, on the copy worker, its own): a band sum reads that word after its waits, so a sum
// whose waits the release ended writes NaNs instead of a sum of undefined parts and stores
// nothing into the peers (band_sum.h); the ring's GEMM reads it after each slot group's flag,
// and its tiles that add that slot store NaNs (SignalingGemmArgs::addend_abandoned), which the
// ring carries on to the next ranks' sums. So a failed call's reduce-scatter (every form) and
// all-reduce outputs read as failed on every rank in the same call, also where the failure is
// the copy worker's, which the failing rank only reports at its next call (one exception, never
// a wrong value: on the ring, the copy worker's failure leaves the failing rank's own band NaN or
// its right sum, since none of that band's partial sums pass through this rank's sends and its
// GEMM does not wait for this rank's copy worker). The all-gather, its
// own transport, fills the rows that do not come with NaNs instead (all_gather_copy_engine.h,
// EnqueueBandRelease). The band that a rank whose band sums failed to launch (kXlaStream) owed
// its all-reduce peers is missing from their outputs, whose own sums may have passed their waits
// before its mark lands: within one process that failure is the handler's, one JAX call, which
// then fails as a whole (nobody reads those bands); across processes each peer's call, which
// succeeds, fills its whole output with NaNs once its waits for `stored` are over if its
// `abandoned` has the call's epoch by then (abandoned_poison.h): the release writes the mark
// before `stored`. A peer's `abandoned` is otherwise written only by its own
// progress watchdog, seconds later; the group is failed from the first failure on, so no later
// call enqueues work that a lower mark could leave unmarked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "comm/comm_registry.h"
#include "comm/copy_engine_args.h"
#include "comm/copy_engine_flags.h"
#include "comm/copy_engine_worker.h"
#include "comm/status.h"

namespace fo_jax {

// Which part of a call was not enqueued.
enum class FailedPart {
  kWholeCall,   // nothing (before the hand-off to the copy worker: copy graphs, GEMM launch)
  kCopyStream,  // the copy worker's part: copies, arrival flags, output address, acknowledgements
  kXlaStream,   // XLA's stream after the hand-off: the band sums, with an all-reduce's stores
};

// The CopyEngineFlags fields a rank writes in its peers' flags.
enum class FlagWord { kOutReady, kArrived, kLastPieces, kRingArrived, kStored, kRecvAcked };

// One word of peer `peer`'s flags: field `word`, element `index`.
struct FlagRelease {
  int peer = -1;
  FlagWord word = FlagWord::kArrived;
  int index = 0;
};

// The words rank `me` of `P` writes in its peers' flags for one call with arguments `a`, in the
// order they are written: the output address flag (all-reduce) first, then the arrival flags
// (per step; the ring: per group; the last step's pieces when its sums go by rows), then
// `stored` (all-reduce), then the acknowledgements. `part` keeps those of that part (kWholeCall:
// all). Pure: the module exposes it for the tests (failed_call_releases).
std::vector<FlagRelease> FailedCallReleases(const CopyEngineArgs& a, int P, int me,
                                            FailedPart part);

// The device address of release r's word in `flags` (peer r.peer's flags).
uint32_t* FlagWordAddress(CopyEngineFlags* flags, const FlagRelease& r);

// Enqueues on `stream` the write of each release with the value `epoch`; kOutReady writes the
// call's output address as that peer addresses it, out_at_peer[peer] (OutputAddressesForPeers;
// unused where nothing is kOutReady), into the peer's out table first (as the healthy path does). If `before_acks` is
// set, the stream waits for it before the first acknowledgement (the receive slots are read
// then). Every release is attempted; returns the first failure.
Status EnqueueReleases(cudaStream_t stream, CopyEngineFlags* const* peer_flags, int P, int me,
                       const std::vector<FlagRelease>& releases, uint32_t epoch,
                       const uint64_t* out_at_peer, cudaEvent_t before_acks = nullptr);

// Enqueues on `stream` the write of `epoch` into `abandoned` of own_flags (if set) and of every
// peer that `releases` names, once each.
Status EnqueueMarkAbandoned(cudaStream_t stream, CopyEngineFlags* const* peer_flags,
                            CopyEngineFlags* own_flags, const std::vector<FlagRelease>& releases,
                            uint32_t epoch);

// The writes of a failed call on one stream, in this order: the `abandoned` marks (own_flags'
// if set, and the released peers'), the releases other than the acknowledgements, own_flags'
// own-copies flag if set (its own last band sum waits for it), then the acknowledgements (after
// before_acks if set). Every write is attempted; returns the first failure.
Status EnqueueFailedCallWrites(cudaStream_t stream, CopyEngineFlags* const* peer_flags,
                               CopyEngineFlags* own_flags, int P, int me,
                               const std::vector<FlagRelease>& releases, uint32_t epoch,
                               const uint64_t* out_at_peer, cudaEvent_t before_acks = nullptr);

// On the copy worker, in its job order: EnqueueFailedCallWrites of the words of `part`
// (kWholeCall or kCopyStream) of call job.epoch, on the copy stream after everything the worker
// enqueued for earlier calls (the copy stream's and, through an event, the flag stream's writes)
// and after job.inputs_ready (recorded on XLA's stream at this call, after its earlier calls'
// writes there, and from which on this call's output may be written); the acknowledgements
// after job.sums_ended if set (the band sums have read the receive slots). Errors are ignored:
// nothing better can be done.
void ReleaseOnCopyStream(CommState& state, const CopyJob& job, FailedPart part);

// On XLA's thread, under state.mu, for a call that prepared (PrepareCopyEngineCall: the
// exchange is done) but failed at `part`, and fails the group with `cause`; returns the call's
// error. kWholeCall (nothing handed over): takes the call's epoch (so that the next call stays
// in step with the peers), records its inputs_ready event on `xla_stream` and hands the copy
// worker a job that writes the whole call's words (ReleaseOnCopyStream: the copy worker's
// streams may still hold earlier calls' writes of the same words, which must land first).
// kXlaStream (handed over): marks the peers abandoned and writes `stored` on `xla_stream`, where
// the earlier calls wrote it.
// For an all-reduce, `xla_stream` then waits for the peers' stores into `a.out`.
Status ReleaseFailedCopyEngineCall(CommState& state, cudaStream_t xla_stream,
                                   const CopyEngineArgs& a, FailedPart part, const Status& cause);

}  // namespace fo_jax
