// One-GPU verification of the releases of a stuck copy-engine call, for tests: a rank's flags in
// this GPU's memory, and on a stream the waits of an all-reduce call whose peer never comes (a
// stream wait for a peer's output address, the band sum with its in-kernel arrival wait and its
// stores into a peer, whose out-table entry is a stale address: a canary buffer; stream waits
// for `stored` and the acknowledgement). The call must be stuck; then, on a stream of its own:
//  * kWatchdog: EnqueueStuckRankRelease (copy_engine_watchdog.h) on the rank's own flags;
//  * kFailedPeer: what the peer (rank 1 of 2, its own flags a second buffer) writes when its
//    call fails before anything was enqueued (failed_call.h: EnqueueFailedCallWrites of
//    FailedCallReleases, kWholeCall), its output address the canary;
//  * kHealthyPeer, the control: the awaited words as a healthy peer writes them, without
//    `abandoned`.
// A release must end the call with the output all NaN, the canary untouched (the band sum saw
// `abandoned`) and exactly its words at the released epoch; the control's band sum stores into
// the canary, which shows that the check can see the difference.
#pragma once

#include <cstdint>
#include <string>

namespace fo_jax {

enum class ReleaseBy { kWatchdog, kFailedPeer, kHealthyPeer };

// What every release check reports (this one, stuck_ring_release_check.h).
struct StuckCheckOutcome {
  bool stuck_before = false;    // the call had not completed before the release
  bool released = false;        // it completed after the release (within the timeout)
  double release_ms = 0;        // from enqueueing the release to the call's completion
  bool words_released = false;  // exactly the release's words read the epoch
  std::string error;            // "" when the check ran
};

struct StuckReleaseCheckResult : StuckCheckOutcome {
  bool sum_equal = false;       // the local output is the sum of the parts, bit for bit
  bool out_poisoned = false;    // every element of the local output is a NaN
  bool canary_untouched = false;  // nothing was stored through the stale address
};

// `epoch_start`: the flags' "no call yet" (e.g. 2^32 - 1, so that the call's epoch wraps to 0).
StuckReleaseCheckResult RunStuckReleaseCheck(uint32_t epoch_start, ReleaseBy release,
                                             int elements, double timeout_s);

}  // namespace fo_jax
