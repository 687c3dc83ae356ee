// Internal types shared by the dispatcher (signaling_gemm.cu) and the generated kernel files:
// kept free of CUTLASS so the dispatcher compiles fast.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "signaling_gemm.h"

namespace fo_jax::detail {

// What the dispatcher hands one config's launcher (arguments already validated).
struct GemmRun {
  SignalingGemmArgs args;
  int device = 0;
  int device_sms = 0;
  // Rows between A's batches (0: args.m): a launch that computes only some rows of every batch
  // (LaunchSignalingGemm's split of a batched launch) keeps the caller's batch stride.
  int a_batch_rows = 0;
};

// SignalingGemmArgs::zero_counters_on_launch: zeroes the group counters on the stream and
// records after_zero_event after it (the launcher, before the kernel; a launch split in two,
// once before both).
inline cudaError_t ZeroGemmCounters(const SignalingGemmArgs& a, cudaStream_t stream,
                                    std::string* error) {
  if (!a.zero_counters_on_launch || a.counters == nullptr) return cudaSuccess;
  cudaError_t e = cudaMemsetAsync(a.counters, 0, size_t(a.num_groups) * sizeof(uint32_t), stream);
  if (e == cudaSuccess && a.after_zero_event != nullptr) {
    e = cudaEventRecord(a.after_zero_event, stream);
  }
  if (e != cudaSuccess && error) {
    *error = std::string("zeroing the counters: ") + cudaGetErrorString(e);
  }
  return e;
}

using RunGemmFn = cudaError_t (*)(const GemmRun& run, cudaStream_t stream, std::string* error);
using LoadGemmFn = cudaError_t (*)(int device, std::string* error);

}  // namespace fo_jax::detail
