// See band_gather.h.
#include "kernels/band_gather.h"

#include <cstdint>

namespace fo_jax {
namespace {

struct Bands {
  const uint4* src[kMaxGatherBands];
  uint4* dst[kMaxGatherBands];
};

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread: NVLink reads are latency-bound

// blockIdx.y picks the band (every peer is read at once); blockIdx.x strides over it in steps of
// kUnroll vectors per thread.
__global__ void BandGatherKernel(Bands bands, size_t vectors) {
  const uint4* __restrict__ src = bands.src[blockIdx.y];
  uint4* __restrict__ dst = bands.dst[blockIdx.y];
  const size_t stride = size_t(gridDim.x) * kThreads * kUnroll;
  for (size_t base = blockIdx.x * size_t(kThreads) * kUnroll + threadIdx.x; base < vectors;
       base += stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + size_t(u) * kThreads;
      if (i < vectors) v[u] = __ldcg(src + i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + size_t(u) * kThreads;
      if (i < vectors) dst[i] = v[u];
    }
  }
}

}  // namespace

cudaError_t LaunchBandGather(cudaStream_t stream, const void* const* src, void* const* dst,
                             int nbands, size_t bytes, std::string* error) {
  if (nbands < 1 || nbands > kMaxGatherBands || bytes % 16 != 0) {
    if (error) *error = "band gather: bad band count or size";
    return cudaErrorInvalidValue;
  }
  Bands b{};
  for (int p = 0; p < nbands; ++p) {
    if ((reinterpret_cast<uintptr_t>(src[p]) | reinterpret_cast<uintptr_t>(dst[p])) & 15u) {
      if (error) *error = "band gather: pointer not 16-byte aligned";
      return cudaErrorInvalidValue;
    }
    b.src[p] = static_cast<const uint4*>(src[p]);
    b.dst[p] = static_cast<uint4*>(dst[p]);
  }
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) {
    if (error) *error = "band gather: device query";
    return e;
  }
  const size_t vectors = bytes / 16;
  const size_t per_block = size_t(kThreads) * kUnroll;
  const size_t want = (vectors + per_block - 1) / per_block;
  const size_t cap = size_t((2 * sms + nbands - 1) / nbands);  // ~2 blocks per SM in all
  const dim3 grid(static_cast<unsigned>(want < cap ? (want > 0 ? want : 1) : cap), nbands);
  BandGatherKernel<<<grid, kThreads, 0, stream>>>(b, vectors);
  e = cudaGetLastError();
  if (e != cudaSuccess && error) {
    *error = std::string("band gather launch: ") + cudaGetErrorString(e);
  }
  return e;
}

cudaError_t LoadBandGatherKernel(std::string* error) {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, BandGatherKernel);
  if (e != cudaSuccess && error) *error = "loading the band-gather kernel failed";
  return e;
}

}  // namespace fo_jax
