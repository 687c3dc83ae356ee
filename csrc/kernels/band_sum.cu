// See band_sum.h.
#include "kernels/band_sum.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/epoch_compare.h"

namespace fo_jax {
namespace {

struct Parts {
  const void* p[kMaxBandSumParts];
};

__device__ __forceinline__ float2 ToFloat2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 ToFloat2(__half2 v) { return __half22float2(v); }
template <class T2>
__device__ __forceinline__ T2 FromFloat2(float2 v);
template <>
__device__ __forceinline__ __nv_bfloat162 FromFloat2(float2 v) { return __float22bfloat162_rn(v); }
template <>
__device__ __forceinline__ __half2 FromFloat2(float2 v) { return __float22half2_rn(v); }

template <class T2>
__device__ __forceinline__ void Accumulate(float2 (&acc)[4], const uint4& v) {
  const T2* h = reinterpret_cast<const T2*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = ToFloat2(h[j]);
    acc[j].x += f.x;
    acc[j].y += f.y;
  }
}

// Eight NaNs of T2's type in 16 bytes: what an abandoned call's sum writes.
template <class T2>
__device__ __forceinline__ uint4 NaNVector();
template <>
__device__ __forceinline__ uint4 NaNVector<__nv_bfloat162>() {
  return make_uint4(0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u);
}
template <>
__device__ __forceinline__ uint4 NaNVector<__half2>() {
  return make_uint4(0x7E007E00u, 0x7E007E00u, 0x7E007E00u, 0x7E007E00u);
}

// Grid-stride over 16-byte vectors (8 values); every part is read once, out and each remote
// output written once. All of a vector's part loads are issued before the first add (kParts
// > 0: exactly that many parts; 0: any number, four loads at a time): one load in flight per
// thread left the sum latency-bound at ~2.6 TB/s (the copy-engine transport's ~100 us after the
// GEMM at 8192x8192x2048; raw log in git history:
// benchmarks/results/overlap_profile_tp4_2026-11-21_b86e63a.log). Parts are added in order, so
// the result does not depend on kParts.
template <class T2, int kParts>
__global__ void BandSumKernel(Parts parts, int nparts, void* out, RemoteOutputs remote,
                              ArrivalWait wait, size_t vectors, bool from_end) {
  __shared__ uint4* remote_out[kMaxBandSumParts];
  __shared__ int remote_count;
  __shared__ bool poison;
  if (threadIdx.x == 0) {
    // One thread per block polls; the barrier below orders the block's part loads after it.
    for (int f = 0; f <= wait.count; ++f) {
      const uint32_t* flag = f < wait.count ? wait.flags + f : wait.also;
      if (flag == nullptr) break;
      uint32_t seen;
      while (true) {
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
        if (EpochReached(seen, wait.value)) break;  // wrap-safe: epoch_compare.h
        __nanosleep(100);
      }
    }
    remote_count = remote.count;
    poison = false;
    if (remote.abandoned != nullptr) {
      uint32_t abandoned;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];"
                   : "=r"(abandoned) : "l"(remote.abandoned) : "memory");
      if (EpochReached(abandoned, remote.epoch)) {
        remote_count = 0;
        poison = true;
      }
    }
  }
  if (static_cast<int>(threadIdx.x) < remote.count) {
    // L2, not L1: the other GPUs wrote the table with stream memory operations.
    remote_out[threadIdx.x] = reinterpret_cast<uint4*>(
        __ldcg(reinterpret_cast<const unsigned long long*>(remote.table) + threadIdx.x) +
        remote.offset_bytes);
  }
  __syncthreads();
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < vectors;
       k += size_t(gridDim.x) * blockDim.x) {
    const size_t i = from_end ? vectors - 1 - k : k;
    if (poison) {  // an abandoned call: its parts are undefined, its output says so
      reinterpret_cast<uint4*>(out)[i] = NaNVector<T2>();
      continue;
    }
    float2 acc[4] = {};
    if constexpr (kParts > 0) {
      uint4 v[kParts];
#pragma unroll
      for (int p = 0; p < kParts; ++p) v[p] = reinterpret_cast<const uint4*>(parts.p[p])[i];
#pragma unroll
      for (int p = 0; p < kParts; ++p) Accumulate<T2>(acc, v[p]);
    } else {
      for (int p0 = 0; p0 < nparts; p0 += 4) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (p0 + u < nparts) v[u] = reinterpret_cast<const uint4*>(parts.p[p0 + u])[i];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (p0 + u < nparts) Accumulate<T2>(acc, v[u]);
        }
      }
    }
    uint4 o;
    T2* oh = reinterpret_cast<T2*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) oh[j] = FromFloat2<T2>(acc[j]);
    reinterpret_cast<uint4*>(out)[i] = o;
    for (int r = 0; r < remote_count; ++r) remote_out[r][i] = o;
  }
}

// The instantiation for nparts parts: fixed part counts for the common ones (TP 4: 2, 3, 4).
template <class T2>
auto SelectKernel(int nparts) {
  switch (nparts) {
    case 2: return BandSumKernel<T2, 2>;
    case 3: return BandSumKernel<T2, 3>;
    case 4: return BandSumKernel<T2, 4>;
    default: return BandSumKernel<T2, 0>;
  }
}

// Every instantiation SelectKernel can return (the fixed ones and the generic one).
template <class T2>
cudaError_t LoadAll() {
  cudaFuncAttributes attr;
  cudaError_t e = cudaSuccess;
  for (auto kernel : {BandSumKernel<T2, 2>, BandSumKernel<T2, 3>, BandSumKernel<T2, 4>,
                      BandSumKernel<T2, 0>}) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, kernel);
  }
  return e;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

cudaError_t LaunchBandSum(cudaStream_t stream, GemmDtype dtype, const void* const* parts,
                          int nparts, void* out, size_t count, std::string* error,
                          int max_blocks, RemoteOutputs remote, ArrivalWait wait,
                          bool from_end) {
  if (nparts < 1 || nparts > kMaxBandSumParts || count % 8 != 0 || !Aligned16(out) ||
      remote.count < 0 || remote.count >= kMaxBandSumParts ||
      (remote.count > 0 && (remote.table == nullptr || remote.offset_bytes % 16 != 0)) ||
      wait.count < 0 || (wait.count > 0 && wait.flags == nullptr)) {
    if (error) *error = "band sum: bad part count, size or alignment";
    return cudaErrorInvalidValue;
  }
  Parts in{};
  for (int p = 0; p < nparts; ++p) {
    if (!Aligned16(parts[p])) {
      if (error) *error = "band sum: part not 16-byte aligned";
      return cudaErrorInvalidValue;
    }
    in.p[p] = parts[p];
  }
  const size_t vectors = count / 8;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) {
    if (error) *error = "band sum: device query";
    return e;
  }
  // Memory-bound: two 512-thread blocks per SM saturate HBM; fewer blocks for small bands.
  const size_t cap = max_blocks > 0 ? size_t(max_blocks) : size_t(2 * sms);
  const size_t want = (vectors + 511) / 512;
  const int blocks = static_cast<int>(want < cap ? (want > 0 ? want : 1) : cap);
  if (dtype == GemmDtype::kBF16) {
    SelectKernel<__nv_bfloat162>(nparts)<<<blocks, 512, 0, stream>>>(in, nparts, out, remote,
                                                                     wait, vectors, from_end);
  } else {
    SelectKernel<__half2>(nparts)<<<blocks, 512, 0, stream>>>(in, nparts, out, remote, wait,
                                                              vectors, from_end);
  }
  e = cudaGetLastError();
  if (e != cudaSuccess && error) *error = std::string("band sum launch: ") + cudaGetErrorString(e);
  return e;
}

cudaError_t LoadBandSumKernels(std::string* error) {
  cudaError_t e = LoadAll<__nv_bfloat162>();
  if (e == cudaSuccess) e = LoadAll<__half2>();
  if (e != cudaSuccess && error) *error = "loading the band-sum kernels failed";
  return e;
}

}  // namespace fo_jax
