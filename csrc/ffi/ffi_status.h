// One way for handlers to turn CUDA/NCCL/library failures into ffi::Error: handlers never throw
// and never abort; XLA raises the message as a Python exception.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "xla/ffi/api/ffi.h"

namespace fo_jax {

inline xla::ffi::Error CudaError(cudaError_t err, const char* what) {
  return xla::ffi::Error::Internal(std::string("fo_jax: ") + what + ": " +
                                   cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace fo_jax

// Return an ffi::Error from the enclosing handler if a CUDA call failed.
#define FO_JAX_RETURN_IF_CUDA_ERROR(expr)                              \
  do {                                                                 \
    cudaError_t fo_jax_err_ = (expr);                                  \
    if (fo_jax_err_ != cudaSuccess) return ::fo_jax::CudaError(fo_jax_err_, #expr); \
  } while (0)
