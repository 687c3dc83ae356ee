// See abandoned_poison.h.
#include "comm/abandoned_poison.h"

#include "kernels/epoch_compare.h"

namespace fo_jax {
namespace {

__global__ void PoisonIfAbandonedKernel(const uint32_t* abandoned, uint32_t epoch, uint4* out,
                                        size_t vectors) {
  __shared__ bool poison;
  if (threadIdx.x == 0) {
    uint32_t seen;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(abandoned) : "memory");
    poison = EpochReached(seen, epoch);
  }
  __syncthreads();
  if (!poison) return;
  const uint4 nan = make_uint4(~0u, ~0u, ~0u, ~0u);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = nan;
  }
}

}  // namespace

Status LoadPoisonIfAbandoned() {
  cudaFuncAttributes attr;
  return CudaStatus(cudaFuncGetAttributes(&attr, PoisonIfAbandonedKernel),
                    "loading the all-reduce's abandoned-call check");
}

Status EnqueuePoisonIfAbandoned(cudaStream_t stream, const uint32_t* abandoned, uint32_t epoch,
                                void* out, size_t bytes) {
  // A few blocks: in the healthy case each only reads one word; a poisoned output is rare.
  PoisonIfAbandonedKernel<<<32, 256, 0, stream>>>(abandoned, epoch, static_cast<uint4*>(out),
                                                  bytes / 16);
  return CudaStatus(cudaGetLastError(), "launching the all-reduce's abandoned-call check");
}

}  // namespace fo_jax
