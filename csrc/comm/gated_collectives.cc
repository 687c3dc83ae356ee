// See gated_collectives.h.
#include "comm/gated_collectives.h"

#include <string>

#include "comm/gemm_plan.h"
#include "comm/stream_wait.h"

namespace fo_jax {

std::vector<GroupSpan> CollectiveSpans(const SignalingGemmArgs& args, Collective kind,
                                       const uint32_t* counter_base) {
  std::vector<GroupSpan> spans(args.num_groups);
  const int64_t n = args.n;
  for (int g = 0; g < args.num_groups; ++g) {
    const int64_t r0 = GroupRow(args, g), r1 = GroupRow(args, g + 1);
    GroupSpan& s = spans[g];
    // Unsigned: the sum wraps modulo 2^32 as the counters do (the waits compare cyclically).
    s.expected = static_cast<uint32_t>(ExpectedGroupCount(args, g)) +
                 (counter_base != nullptr ? counter_base[g] : 0u);
    s.recv_offset = static_cast<size_t>(r0 * n);
    s.count = static_cast<size_t>((r1 - r0) * n);
    // Reduce-scatter: group g is rows [batch*r0, batch*r1) of the workspace (batch == nranks).
    s.send_offset = kind == Collective::kReduceScatter ? static_cast<size_t>(args.batch * r0 * n)
                                                       : s.recv_offset;
  }
  return spans;
}

Status EnqueueGatedCollectives(CommState& state, cudaStream_t xla_stream, Collective kind,
                               ncclDataType_t dtype, const void* send, void* recv,
                               size_t elem_bytes, const uint32_t* counters,
                               const std::vector<GroupSpan>& groups) {
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(state.stream, state.inputs_ready, 0),
                                    "comm stream waiting for XLA's inputs"));
  const char* send_bytes = static_cast<const char*>(send);
  char* recv_bytes = static_cast<char*>(recv);
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupSpan& span = groups[g];
    FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(state.stream, counters + g, span.expected));
    if (span.count == 0) continue;
    ncclResult_t r;
    if (kind == Collective::kReduceScatter) {
      r = ncclReduceScatter(send_bytes + span.send_offset * elem_bytes,
                            recv_bytes + span.recv_offset * elem_bytes, span.count, dtype, ncclSum,
                            state.comm, state.stream);
    } else {
      void* band = recv_bytes + span.recv_offset * elem_bytes;
      r = ncclAllReduce(band, band, span.count, dtype, ncclSum, state.comm, state.stream);
    }
    FO_JAX_RETURN_IF_ERROR(
        NcclStatus(r, "NCCL collective of group " + std::to_string(g), state.comm));
  }
  cudaError_t err = cudaEventRecord(state.comm_done, state.stream);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(xla_stream, state.comm_done, 0);
  return CudaStatus(err, "joining the comm stream into XLA's stream");
}

Status EnqueueNcclTransport(CommState& state, cudaStream_t xla_stream, Collective kind,
                            const SignalingGemmArgs& gemm, GemmDtype out_dtype, void* out,
                            const uint32_t* counter_base) {
  const ncclDataType_t dtype = out_dtype == GemmDtype::kBF16 ? ncclBfloat16 : ncclFloat16;
  FO_JAX_RETURN_IF_ERROR(EnqueueGatedCollectives(state, xla_stream, kind, dtype, gemm.d, out, 2,
                                                 gemm.counters,
                                                 CollectiveSpans(gemm, kind, counter_base)));
  return NoteCallEnd(state, xla_stream, /*copy_engine=*/false);
}

}  // namespace fo_jax
