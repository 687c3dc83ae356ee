// See gated_collectives.h.
#include "comm/gated_collectives.h"

#include "comm/stream_wait.h"

namespace fo_jax {

cudaError_t EnqueueGatedCollectives(CommState& state, cudaStream_t xla_stream, Collective kind,
                                    ncclDataType_t dtype, const void* send, void* recv,
                                    size_t elem_bytes, const uint32_t* counters,
                                    const std::vector<GroupSpan>& groups, bool spin_wait,
                                    std::string* error) {
  cudaError_t err = cudaStreamWaitEvent(state.stream, state.inputs_ready, 0);
  if (err != cudaSuccess) {
    *error = "comm stream waiting for XLA's inputs";
    return err;
  }
  const char* send_bytes = static_cast<const char*>(send);
  char* recv_bytes = static_cast<char*>(recv);
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupSpan& span = groups[g];
    err = EnqueueWaitGeq(state.stream, counters + g, span.expected, spin_wait, error);
    if (err != cudaSuccess) return err;
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
    if (r != ncclSuccess) {
      *error = std::string("NCCL collective of group ") + std::to_string(g) + " failed: " +
               ncclGetErrorString(r);
      const char* last = ncclGetLastError(state.comm);
      if (last != nullptr && *last) *error += std::string(" (") + last + ")";
      return cudaErrorUnknown;
    }
  }
  err = cudaEventRecord(state.comm_done, state.stream);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(xla_stream, state.comm_done, 0);
  if (err != cudaSuccess) *error = "joining the comm stream into XLA's stream";
  return err;
}

}  // namespace fo_jax
