// One-GPU verification of the NCCL transport's failed call (failed_nccl_call.h), for tests: a
// one-rank communicator of its own (a fresh unique id, so that no call shares its group, which
// the check fails) on the current GPU, and a reduce-scatter or all-reduce of 512 x 256 whose GEMM
// "failed to launch" (no GEMM runs). ReleaseFailedNcclCall must fill the GEMM's output with NaNs
// within its bounds, set the counters and run the collectives, so that the call's output (the
// one-rank sum of this rank's NaNs) is all NaN where it held finite stale values, and the bytes
// right after the GEMM's output keep theirs.
#pragma once

#include <string>

#include "comm/overlap_plan.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct FailedNcclCallCheckResult {
  bool out_all_nan = false;    // every element of the call's output is a NaN
  bool guard_intact = false;   // the bytes after the GEMM's output were not written
  bool counters_set = false;   // every group's counter reached its expected count
  std::string message;         // the call's error (what its rank raises)
  std::string error;           // "" when the check ran
};

// `collective`: kReduceScatter or kAllReduce; `dtype`: the output's, kBF16 or kF16.
FailedNcclCallCheckResult RunFailedNcclCallCheck(Collective collective, GemmDtype dtype);

}  // namespace fo_jax
