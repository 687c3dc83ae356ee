// One-GPU verification of the progress watchdog's release (copy_engine_watchdog.h), for tests: a
// rank's flags in this GPU's memory, and on a stream the waits of an all-reduce call whose peers
// never come (a stream wait for a peer's output address, the band sum with its in-kernel
// arrival wait and its stores into a peer, whose out-table entry is a stale address: a canary
// buffer; stream waits for `stored` and the acknowledgement). The call must be stuck; then
// EnqueueStuckRankRelease on a stream of its own must end it, with the output all NaN and the
// canary untouched (the band sum saw `abandoned`) and every owed word at the released epoch. The
// control (`mark_abandoned` false) writes the same awaited words without `abandoned`, as healthy
// peers would: the band sum then stores into the canary, which shows that the check can see
// the difference.
#pragma once

#include <cstdint>
#include <string>

namespace fo_jax {

struct StuckReleaseCheckResult {
  bool stuck_before = false;    // the call had not completed before the release
  bool released = false;        // it completed after the release (within the timeout)
  double release_ms = 0;        // from enqueueing the release to the call's completion
  bool sum_equal = false;       // the local output is the sum of the parts, bit for bit
  bool out_poisoned = false;    // every element of the local output is a NaN
  bool canary_untouched = false;  // nothing was stored through the stale address
  bool words_released = false;  // every owed word reads the epoch (release only)
  std::string error;            // "" when the check ran
};

// `epoch_start`: the flags' "no call yet" (e.g. 2^32 - 1, so that the call's epoch wraps to 0).
StuckReleaseCheckResult RunStuckReleaseCheck(uint32_t epoch_start, bool mark_abandoned,
                                             int elements, double timeout_s);

}  // namespace fo_jax
