// One-GPU verification that a released ring call's sums read as failed, for tests. The ring
// reduce-scatter (copy_engine.h) sums in its GEMM's epilogue: each tile-row of steps 1 .. P - 1
// adds the partial sum that the next rank sent into a receive slot, once that group's
// ring_arrived flag has reached the call's epoch, and the last step (the own band) goes into
// the call's output. This check runs that GEMM as rank 0 of 3 with its partners absent: the
// flags in this GPU's memory never set, so the GEMM is stuck in its epilogues. Then, on a stream
// of its own:
//  * kWatchdog: EnqueueStuckRankRelease (copy_engine_watchdog.h) on the rank's own flags;
//  * kFailedPeer: what its sender (rank 1) writes when its call fails before anything was
//    enqueued (failed_call.h: EnqueueFailedCallWrites of FailedCallReleases, kWholeCall);
//  * kHealthyPeer, the control: the partial sums' flags as a healthy sender writes them after
//    its copies, without `abandoned`.
// The GEMM marks a released call's tiles with the transport's NaN tile (a buffer of its own here).
// A release must end the GEMM with every tile that adds a slot (step 1's partial sum, sent on to
// the next rank, and the output) all NaN, step 0's partial sum exact (it adds nothing) and the
// release's ring flags and `abandoned` at the call's epoch; the control must end it with every
// sum exact. Inputs are small integers, so every sum is exact in bf16 and fp16 and compared bit
// for bit.
#pragma once

#include <cstdint>
#include <string>

#include "comm/stuck_release_check.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// The outcome's "call" is the GEMM; its words are the slots' ring flags and `abandoned`.
struct StuckRingReleaseCheckResult : StuckCheckOutcome {
  bool first_step_exact = false;  // step 0's partial sum (no slot added) is the product
  bool sums_exact = false;      // step 1's partial sum and the output: product + slot, exactly
  bool sums_poisoned = false;   // ... every element of both a NaN
};

// `epoch_start`: the flags' "no call yet" (e.g. 2^32 - 1, so that the call's epoch wraps to 0);
// `dtype`: kBF16 or kF16 (the ring's two dtypes).
StuckRingReleaseCheckResult RunStuckRingReleaseCheck(uint32_t epoch_start, ReleaseBy release,
                                                     GemmDtype dtype, double timeout_s);

}  // namespace fo_jax
