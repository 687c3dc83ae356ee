// The all-gather half of the copy-engine all-reduce done by the SMs (they are idle once the GEMM
// and the band sum are done): each block reads one peer GPU's summed band over NVLink (peer
// pointers, loads) and writes it into the same rows of this GPU's output.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace fo_jax {

constexpr int kMaxGatherBands = 15;

// Enqueues dst[p] <- src[p] (bytes each) for p < nbands on `stream`. Every pointer 16-byte
// aligned and bytes % 16 == 0 (checked); 1 <= nbands <= kMaxGatherBands.
cudaError_t LaunchBandGather(cudaStream_t stream, const void* const* src, void* const* dst,
                             int nbands, size_t bytes, std::string* error);

// Loads the kernel into the current device's context (lazy loading: DESIGN.md). Idempotent.
cudaError_t LoadBandGatherKernel(std::string* error);

}  // namespace fo_jax
