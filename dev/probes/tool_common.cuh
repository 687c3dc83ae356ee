// Shared by the developer probes of dev/probes (not part of the library): the CUDA error check
// that ends a tool, the sleep kernel ahead of an event-timed launch, and the random 16-bit fill
// every tool uses for its operands.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                    \
                   cudaGetErrorString(e_));                                            \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return uint32_t(x);
}

// Keeps the GPU busy for about `ns` nanoseconds while the host prepares the next launch, so that
// an event pair recorded after it times the launched kernel alone.
__global__ void SleepNs(unsigned ns) {
  for (unsigned t = 0; t < ns; t += 1000) __nanosleep(1000);
}

// Uniform in [-1, -1/8] U [1/8, 1] (never zero), rounded to bf16 (bf16 != 0) or fp16.
__global__ void FillRandom(uint16_t* p, size_t count, uint64_t seed, int bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = Hash(seed * 0x9E3779B97F4A7C15ULL + i);
    float v = 0.125f + 0.875f * float(h >> 8) / float(1u << 24);
    if (h & 1) v = -v;
    if (bf16) { __nv_bfloat16 b = __float2bfloat16(v); p[i] = *reinterpret_cast<uint16_t*>(&b); }
    else { __half b = __float2half(v); p[i] = *reinterpret_cast<uint16_t*>(&b); }
  }
}
