// One-GPU verification of the consumer GEMM (SignalingGemmArgs::wait_flags, the all-gather
// feeding the GEMM), for tests and benchmarks: no JAX, no peer, no collective. The bands of A
// arrive while the GEMM runs, as the copy-engine all-gather will deliver them: each band copied
// by the copy engine on another stream, then its flag written by a stream memory operation.
// It lives beside the stream operations it uses (comm/stream_wait.h), above the kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct ConsumerGemmCheckOptions {
  // A is [bands * m_local, k] (band q = rows [q * m_local, (q + 1) * m_local)), B is [k, n].
  int m_local = 0, n = 0, k = 0, bands = 4;
  GemmDtype dtype = GemmDtype::kBF16;
  int config = -1;  // index into the GEMM config table; -1: SelectConsumerGemmConfig
  // The own band: the kernel visits rank, rank + 1, ..., rank - 1 (band_order).
  int rank = 0;
  int groups_per_band = 1;  // groups of (as) equal (as possible) tile-rows in each band
  // Arrival order of the bands: "forward" (the visit order), "reversed" or "random" (seeded).
  std::string order = "forward";
  uint64_t seed = 0;  // operands and the random order
  int delay_us = 0;   // wait before each band's copy (a host function on the copy stream)
  // The flags hold stale_value (an earlier call's) until their band has landed; the kernel waits
  // for flag_value. E.g. flag_value 2 with stale_value 0xFFFFFFFE checks the wrap-safe compare.
  uint32_t flag_value = 1;
  uint32_t stale_value = 0;
  // Where the bands come from: "host" (pinned host memory: copy-engine copies, no SM, so the
  // GEMM may hold every SM) or "device" (a device-to-device copy on the same GPU, which runs as
  // a kernel: sm_budget must leave SMs free for it, or the waiting GEMM never sees its band).
  std::string staging = "host";
  int sm_budget = 0;  // every launch of the check; 0: all SMs
  int timing_iters = 0;  // > 0: also time the consumer with preset flags against the plain GEMM
  double timeout_s = 60;  // the run with waits longer than this: flags released, timed_out set
  int device = 0;  // CUDA ordinal; the calling thread's current device is restored after
};

struct ConsumerGemmCheckResult {
  std::string config;              // the config that ran
  std::vector<int> visit_order;    // band_order of the consumer launch
  std::vector<int> arrival_order;  // the order the copy stream delivered the bands in
  // D of the run with waits against the plain GEMM on the complete A (same config, same
  // groups): elements whose bits differ, per band of D's rows, the first such row, and the
  // largest |difference| (infinity where either is NaN: a tile read poisoned A rows or was not
  // written).
  int64_t mismatches = 0;
  std::vector<int64_t> band_mismatches;
  int64_t first_bad_row = -1;
  double max_abs_diff = 0;
  int64_t reference_nonfinite = 0;  // NaN/inf in the reference (0 with these operands)
  // The signaling epilogue in the consumer kernel: "" if every group's counter reached the
  // expected tile count after the run with waits, else which did not.
  std::string counter_problem;
  bool timed_out = false;        // the run with waits did not end in timeout_s (flags released)
  // That run: from the moment the copies may start (A poisoned) to the GEMM's end, at least
  // bands * delay_us when the GEMM waited for every band; and the GEMM's end minus the last
  // flag's write (positive: it ended after the last band landed; a few microseconds' skew
  // between the two streams' events on tiny shapes).
  double wait_run_us = 0;
  double end_after_last_flag_us = 0;
  // timing_iters > 0: median GPU time per launch (CUDA events around each launch, launches
  // interleaved), flags all preset: the consumer kernel, and the plain kernel with the same
  // groups and the same visit order (rotated). Their ratio is the cost of the flag checks.
  double plain_us = 0;
  double consumer_us = 0;
};

// Runs the check on options.device. Returns cudaSuccess, or the error with *error set
// (cudaErrorInvalidValue for bad options). A kernel that never ends past the released flags
// (a hang) is reported as an error and its buffers are left allocated.
cudaError_t RunConsumerGemmCheck(const ConsumerGemmCheckOptions& options,
                                 ConsumerGemmCheckResult* result, std::string* error);

}  // namespace fo_jax
