// See stream_wait.h.
#include "comm/stream_wait.h"

#include <cuda.h>  // types and enums only; the entry point comes from cudaGetDriverEntryPoint

#include <mutex>
#include <string>

#include "kernels/epoch_compare.h"

namespace fo_jax {
namespace {

// cuStreamWaitValue32 and cuStreamWriteValue32 share this signature.
using StreamValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// One thread polls the counter with acquire loads. The volatile-free acquire load keeps the
// compiler from hoisting it; the acquire orders this stream's later work after the producer's
// release (the consumer kernels are launched after this kernel ends, so stream order suffices).
__global__ void SpinWaitGeqKernel(const uint32_t* counter, uint32_t value) {
  uint32_t seen;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (EpochReached(seen, value)) break;  // as CU_STREAM_WAIT_VALUE_GEQ: epoch_compare.h
    __nanosleep(200);
  } while (true);
}

StreamValue32Fn g_wait_value32 = nullptr;   // none: the spin kernel takes over
StreamValue32Fn g_write_value32 = nullptr;  // none: EnqueueWriteValue reports it
std::once_flag g_resolve_once;

StreamValue32Fn DriverEntryPoint(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) ==
          cudaSuccess &&
      status == cudaDriverEntryPointSuccess) {
    return reinterpret_cast<StreamValue32Fn>(fn);
  }
  (void)cudaGetLastError();  // leave no sticky error behind
  return nullptr;
}

void ResolveEntryPoints() {
  g_wait_value32 = DriverEntryPoint("cuStreamWaitValue32");
  g_write_value32 = DriverEntryPoint("cuStreamWriteValue32");
}

Status DriverStatus(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(what) + " failed with CUresult " + std::to_string(r));
}

}  // namespace

Status PrepareStreamWait() {
  std::call_once(g_resolve_once, ResolveEntryPoints);
  cudaFuncAttributes attr;
  // Loads it on this device.
  return CudaStatus(cudaFuncGetAttributes(&attr, SpinWaitGeqKernel),
                    "loading the spin-wait kernel");
}

Status EnqueueWaitGeq(cudaStream_t stream, const uint32_t* counter, uint32_t value) {
  if (g_wait_value32 != nullptr) {
    return DriverStatus(g_wait_value32(reinterpret_cast<CUstream>(stream),
                                       reinterpret_cast<CUdeviceptr>(counter), value,
                                       CU_STREAM_WAIT_VALUE_GEQ),
                        "cuStreamWaitValue32");
  }
  SpinWaitGeqKernel<<<1, 1, 0, stream>>>(counter, value);
  return CudaStatus(cudaGetLastError(), "launching the spin-wait kernel");
}

Status EnqueueWriteValue(cudaStream_t stream, uint32_t* address, uint32_t value) {
  if (g_write_value32 == nullptr) {
    return Status::Internal("the CUDA driver offers no cuStreamWriteValue32");
  }
  return DriverStatus(g_write_value32(reinterpret_cast<CUstream>(stream),
                                      reinterpret_cast<CUdeviceptr>(address), value,
                                      CU_STREAM_WRITE_VALUE_DEFAULT),
                      "cuStreamWriteValue32");
}

}  // namespace fo_jax
