// y = alpha * x on the GPU: the smallest real device op, used to prove the chain
// csrc -> nanobind -> jax.ffi.register_ffi_target -> jax.ffi.ffi_call on a GPU (smoke test).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fo_jax {

enum class ScaleDtype : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Enqueues y[i] = alpha * x[i] for i < n on `stream` (computed in fp32).
cudaError_t LaunchScale(cudaStream_t stream, ScaleDtype dtype, const void* x, void* y, int64_t n,
                        float alpha);

}  // namespace fo_jax
