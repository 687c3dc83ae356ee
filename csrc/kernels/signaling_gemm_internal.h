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

using RunGemmFn = cudaError_t (*)(const GemmRun& run, cudaStream_t stream, std::string* error);
using LoadGemmFn = cudaError_t (*)(int device, std::string* error);

}  // namespace fo_jax::detail
