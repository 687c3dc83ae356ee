// See nan_fill.h.
#include "comm/nan_fill.h"

#include <cstring>
#include <mutex>

namespace fo_jax {
namespace {

std::mutex& NanFillMu() {
  static auto* mu = new std::mutex();
  return *mu;
}

void* nan_bytes = nullptr;  // kNanFillChunkBytes of 0xFF, pinned; never freed (queued copies)

}  // namespace

Status PrepareNanFill() {
  std::lock_guard<std::mutex> lock(NanFillMu());
  if (nan_bytes != nullptr) return Status::Ok();
  void* p = nullptr;
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&p, kNanFillChunkBytes, cudaHostAllocPortable),
                                    "allocating the pinned NaN buffer"));
  std::memset(p, 0xFF, kNanFillChunkBytes);
  nan_bytes = p;
  return Status::Ok();
}

Status EnqueueNanFill(cudaStream_t stream, void* dst, size_t bytes) {
  const void* src = nullptr;
  {
    std::lock_guard<std::mutex> lock(NanFillMu());
    src = nan_bytes;
  }
  if (src == nullptr) return Status::Internal("EnqueueNanFill before PrepareNanFill");
  char* out = static_cast<char*>(dst);
  for (size_t done = 0; done < bytes; done += kNanFillChunkBytes) {
    const size_t n = bytes - done < kNanFillChunkBytes ? bytes - done : kNanFillChunkBytes;
    FO_JAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(out + done, src, n, cudaMemcpyHostToDevice, stream), "a NaN fill"));
  }
  return Status::Ok();
}

}  // namespace fo_jax
