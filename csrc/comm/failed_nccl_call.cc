// See failed_nccl_call.h.
#include "comm/failed_nccl_call.h"

#include <string>
#include <vector>

#include "comm/gated_collectives.h"
#include "comm/stream_wait.h"

namespace fo_jax {

Status ReleaseFailedNcclCall(CommState& s, cudaStream_t xla_stream, Collective kind,
                             const SignalingGemmArgs& gemm, GemmDtype out_dtype, void* out,
                             const Status& cause, const uint32_t* counter_base) {
  // D, [batch * m, n] of 16-bit elements (the fp8 kernels' output is bf16 too), all 0xFF bytes: a
  // NaN in bf16 and fp16, so every sum the collectives make from it is a NaN. XLA's stream holds
  // no GEMM now (its launch failed): the memset kernel has SMs.
  const size_t d_bytes = size_t(gemm.batch) * size_t(gemm.m) * size_t(gemm.n) * 2;
  // Its failure does not stop the release: the peers wait for the collectives either way.
  const Status filled = CudaStatus(cudaMemsetAsync(gemm.d, 0xFF, d_bytes, xla_stream),
                                   "filling the failed GEMM's output with NaNs");
  Status released = Status::Ok();
  const std::vector<GroupSpan> spans = CollectiveSpans(gemm, kind, counter_base);
  for (size_t g = 0; g < spans.size() && released.ok(); ++g) {
    released = EnqueueWriteValue(xla_stream, gemm.counters + g, spans[g].expected);
  }
  // The comm stream starts after the counters (its waits then pass at once).
  if (released.ok()) {
    released = CudaStatus(cudaEventRecord(s.inputs_ready, xla_stream),
                          "recording inputs_ready after the counters");
  }
  if (released.ok()) {
    released = EnqueueNcclTransport(s, xla_stream, kind, gemm, out_dtype, out, counter_base);
  }
  const std::string what = "NCCL transport: " + cause.message() + " (rank " +
                           std::to_string(s.rank) + " of " + std::to_string(s.nranks) + ")";
  FailCommGroup(s, what);
  std::string message = what +
                        "; this call still ran its collectives, on NaNs, so that the group's other "
                        "ranks do not wait for it (every rank's output of this call holds NaNs) "
                        "and failed the group: restart the process";
  if (!filled.ok()) message += "; " + filled.message() + ": the outputs are undefined instead";
  if (!released.ok()) {
    message += "; running them also failed (" + released.message() +
               "): the other ranks may wait until the progress watchdog, if set, aborts them";
  }
  return Status::Internal(message);
}

}  // namespace fo_jax
