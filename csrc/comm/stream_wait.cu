// See stream_wait.h.
#include "comm/stream_wait.h"

#include <cuda.h>  // types and enums only; the entry point comes from cudaGetDriverEntryPoint

#include <mutex>

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
    if (seen >= value) break;
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

// cudaSuccess, or cudaErrorUnknown with `what`'s CUresult in *error.
cudaError_t Status(CUresult r, const char* what, std::string* error) {
  if (r == CUDA_SUCCESS) return cudaSuccess;
  if (error) *error = std::string(what) + " failed with CUresult " + std::to_string(r);
  return cudaErrorUnknown;
}

}  // namespace

cudaError_t PrepareStreamWait(std::string* error) {
  std::call_once(g_resolve_once, ResolveEntryPoints);
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, SpinWaitGeqKernel);  // loads it on this device
  if (err != cudaSuccess && error) *error = "loading the spin-wait kernel failed";
  return err;
}

cudaError_t EnqueueWaitGeq(cudaStream_t stream, const uint32_t* counter, uint32_t value,
                           std::string* error) {
  if (g_wait_value32 != nullptr) {
    return Status(g_wait_value32(reinterpret_cast<CUstream>(stream),
                                 reinterpret_cast<CUdeviceptr>(counter), value,
                                 CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue32", error);
  }
  SpinWaitGeqKernel<<<1, 1, 0, stream>>>(counter, value);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess && error) *error = "launching the spin-wait kernel failed";
  return err;
}

cudaError_t EnqueueWriteValue(cudaStream_t stream, uint32_t* address, uint32_t value,
                              std::string* error) {
  if (g_write_value32 == nullptr) {
    if (error) *error = "the CUDA driver offers no cuStreamWriteValue32";
    return cudaErrorNotSupported;
  }
  return Status(g_write_value32(reinterpret_cast<CUstream>(stream),
                                reinterpret_cast<CUdeviceptr>(address), value,
                                CU_STREAM_WRITE_VALUE_DEFAULT),
                "cuStreamWriteValue32", error);
}

}  // namespace fo_jax
