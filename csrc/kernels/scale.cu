// y = alpha * x, one element per thread in a grid-stride loop. See scale.h.
#include "kernels/scale.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fo_jax {
namespace {

template <typename T>
__device__ float ToFloat(T v) { return static_cast<float>(v); }
template <typename T>
__device__ T FromFloat(float v) { return static_cast<T>(v); }
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __half FromFloat<__half>(float v) { return __float2half(v); }

template <typename T>
__global__ void ScaleKernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, float alpha) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = FromFloat<T>(alpha * ToFloat(x[i]));
  }
}

template <typename T>
cudaError_t Launch(cudaStream_t stream, const void* x, void* y, int64_t n, float alpha) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 4096 ? blocks : 4096);
  ScaleKernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n,
                                                alpha);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchScale(cudaStream_t stream, ScaleDtype dtype, const void* x, void* y, int64_t n,
                        float alpha) {
  switch (dtype) {
    case ScaleDtype::kF32: return Launch<float>(stream, x, y, n, alpha);
    case ScaleDtype::kBF16: return Launch<__nv_bfloat16>(stream, x, y, n, alpha);
    case ScaleDtype::kF16: return Launch<__half>(stream, x, y, n, alpha);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fo_jax
