// Shared by the developer probes of dev/probes (not part of the library): the CUDA error check
// that ends a tool, the sleep kernel ahead of an event-timed launch, the event timing itself and
// its median, and the random 16-bit fill every tool uses for its operands.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

// Times one launch between two events on `s`: `launch()` enqueues it and returns whether it ran.
// Milliseconds, or -1 if it did not run.
template <class Launch>
float EventTimedMs(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, Launch&& launch) {
  CK(cudaEventRecord(e0, s));
  if (!launch()) return -1.f;
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms;
}

// The median of a tool's timings (of an even count, the upper middle one).
inline float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
