// See signaling_gemm_internal.h, ZeroGemmCounters.
#include <cuda.h>  // types and enums only; the entry point comes from cudaGetDriverEntryPoint
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "signaling_gemm.h"
#include "signaling_gemm_internal.h"

namespace fo_jax::detail {
namespace {

using BatchMemOpFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);

BatchMemOpFn g_batch_mem_op = nullptr;  // none: the memset
std::once_flag g_resolve_once;

void Resolve() {
  // FO_JAX_COUNTERS_MEMSET=1: the memset kernel instead (docs/configuration.md: a comparison
  // of the two, nothing else).
  const char* force = std::getenv("FO_JAX_COUNTERS_MEMSET");
  if (force != nullptr && std::strcmp(force, "1") == 0) return;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", &fn, 12000, cudaEnableDefault,
                                       &status) == cudaSuccess &&
      status == cudaDriverEntryPointSuccess) {
    g_batch_mem_op = reinterpret_cast<BatchMemOpFn>(fn);
  }
  (void)cudaGetLastError();  // leave no sticky error behind
}

}  // namespace

// One batch of 32-bit stream writes of zero: the GPU's front end performs them in stream order,
// no kernel launch and no SM (a memset of a few words is a kernel of its own, about 0.8 us of GPU
// time before every signaling GEMM). No memory barrier: the zeroes publish no data; stream order
// puts them before the GEMM and before after_zero_event, which the consumer streams wait for.
cudaError_t ZeroCountersOnStream(uint32_t* counters, int count, cudaStream_t stream) {
  std::call_once(g_resolve_once, Resolve);
  if (g_batch_mem_op == nullptr || count > kMaxGemmGroups) {
    return cudaMemsetAsync(counters, 0, size_t(count) * sizeof(uint32_t), stream);
  }
  CUstreamBatchMemOpParams ops[kMaxGemmGroups];
  std::memset(ops, 0, sizeof(CUstreamBatchMemOpParams) * count);
  for (int g = 0; g < count; ++g) {
    ops[g].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[g].writeValue.address = reinterpret_cast<CUdeviceptr>(counters + g);
    ops[g].writeValue.value = 0;
    ops[g].writeValue.flags = CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
  }
  if (g_batch_mem_op(reinterpret_cast<CUstream>(stream), static_cast<unsigned>(count), ops, 0) ==
      CUDA_SUCCESS) {
    return cudaSuccess;
  }
  // A driver or stream that refuses the batch: the memset, which every stream takes.
  return cudaMemsetAsync(counters, 0, size_t(count) * sizeof(uint32_t), stream);
}

}  // namespace fo_jax::detail
