// One-GPU verification of the copy-engine all-gather's data path, for tests: one GPU plays the
// receiving rank of a group of `ranks`, the other ranks' rows sitting in this GPU's memory. The
// receiver's part of a call runs as the transport runs it (the flags zeroed, the own rows and
// their flags, "call started", the consumer GEMM with the plan's band order, OverlapGemmArgs),
// and the senders' bands arrive through the transport's own push (EnqueueBandPushes: copy-graph
// launches, each followed by its flag) on a copy stream, in the transport's arrival order, each
// sender after a host delay so that the GEMM really waits. The gathered rows and the product are
// compared bit for bit with the senders' rows and the plain GEMM of the same configuration.
//
// With a released sender, that sender's bands do not come: the copy stream releases them as the
// transport's copy thread does for a peer that never reached the call (EnqueueBandRelease), over
// gathered rows holding finite stale values. Its gathered rows and the product's rows from them
// must then be all NaN, every other row as without a release.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct AllGatherCheckOptions {
  GemmDtype dtype = GemmDtype::kBF16;
  int ranks = 4, rank = 1;
  int rows = 0, n = 0, k = 0;  // x [rows, k] per rank, w [k, n]
  int bands_per_rank = 1;
  int config = -1;  // -1: SelectConsumerGemmConfig
  // A same-GPU copy may run as a kernel: the GEMM must leave it SMs (sm_budget < SMs; 0: all
  // SMs but 16).
  int sm_budget = 0;
  int calls = 3;       // back-to-back calls on the same buffers (the flags zeroed by each)
  int delay_us = 200;  // host delay before each sender's bands
  uint64_t seed = 0;
  double timeout_s = 60;  // then every flag is released and timed_out set
  int released_sender = -1;  // a rank other than `rank` whose bands are released; -1: none
};

struct AllGatherCheckResult {
  // Rows other than the released sender's (all rows without one):
  bool gathered_equal = false;  // the gathered rows are the ranks' rows, every call
  bool product_equal = false;   // the consumer's product is the plain GEMM's, bit for bit
  int64_t mismatches = 0;       // differing product elements of the last call
  // The released sender's rows, every call (false without one):
  bool released_gathered_nan = false;  // every gathered element is a NaN
  bool released_product_nan = false;   // every product element is a NaN
  bool timed_out = false;
  int config = -1;  // the configuration that ran
  std::string error;  // "" when the check ran (it may still have found mismatches)
};

AllGatherCheckResult RunAllGatherCheck(const AllGatherCheckOptions& options);

}  // namespace fo_jax
