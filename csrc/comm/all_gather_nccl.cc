// See all_gather_nccl.h.
#include "comm/all_gather_nccl.h"

#include <nccl.h>

#include <cstdint>
#include <string>

#include "comm/stream_wait.h"
#include "comm/test_failures.h"

namespace fo_jax {
namespace {


// The own rows into the gathered output and every flag in its state before the GEMM: the
// others' flags 0 (a flag of an earlier call must not pass: the buffer is XLA's, reused), the
// own bands' 1. All on XLA's stream, before inputs_ready: the comm stream, which writes the
// others' flags, starts only after this.
Status EnqueueOwnRows(cudaStream_t xla_stream, const AllGatherBands& bands, int rank,
                      const AllGatherBuffers& buffers) {
  const size_t band_bytes = bands.band_bytes;
  char* own = static_cast<char*>(buffers.gathered) +
              static_cast<size_t>(rank) * bands.per_rank * band_bytes;
  cudaError_t err =
      cudaMemsetAsync(buffers.flags, 0, static_cast<size_t>(bands.count) * sizeof(uint32_t),
                      xla_stream);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(own, buffers.x, bands.per_rank * band_bytes, cudaMemcpyDeviceToDevice,
                          xla_stream);
  }
  FO_JAX_RETURN_IF_ERROR(CudaStatus(err, "the own rows into the gathered output"));
  for (int c = 0; c < bands.per_rank; ++c) {
    FO_JAX_RETURN_IF_ERROR(
        EnqueueWriteValue(xla_stream, buffers.flags + rank * bands.per_rank + c, 1));
  }
  return Status::Ok();
}

// The peers' bands on the comm stream, each followed by its flag.
Status EnqueuePeerBands(CommState& state, const OverlapShape& shape, const AllGatherBands& bands,
                        ncclDataType_t dtype, const AllGatherBuffers& buffers) {
  const int P = state.nranks, rank = state.rank;
  const size_t count = static_cast<size_t>(bands.rows * shape.k);
  const size_t elem = GemmInputBytes(shape.dtype);
  const char* x = static_cast<const char*>(buffers.x);
  char* gathered = static_cast<char*>(buffers.gathered);
  for (int s = 1; s < P; ++s) {
    const int to = (rank + s) % P, from = AllGatherSource(rank, s, P);
    for (int c = 0; c < bands.per_rank; ++c) {
      const int band = from * bands.per_rank + c;
      const std::string what = "all-gather step " + std::to_string(s) + " chunk " +
                               std::to_string(c);
      FO_JAX_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), what, state.comm));
      const ncclResult_t sent =
          ncclSend(x + c * count * elem, count, dtype, to, state.comm, state.stream);
      const ncclResult_t received = ncclRecv(gathered + band * count * elem, count, dtype,
                                             from, state.comm, state.stream);
      // The group ends whatever happened inside it, so NCCL's group state stays balanced.
      const ncclResult_t ended = ncclGroupEnd();
      FO_JAX_RETURN_IF_ERROR(NcclStatus(sent, what + " (send)", state.comm));
      FO_JAX_RETURN_IF_ERROR(NcclStatus(received, what + " (receive)", state.comm));
      FO_JAX_RETURN_IF_ERROR(NcclStatus(ended, what, state.comm));
      FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(state.stream, buffers.flags + band, 1));
    }
  }
  return Status::Ok();
}

}  // namespace

Status EnqueueAllGatherNccl(CommState& state, cudaStream_t xla_stream, const OverlapPlan& plan,
                            const OverlapShape& shape, SignalingGemmArgs gemm,
                            const AllGatherBuffers& buffers) {
  const AllGatherBands bands = AllGatherBandsOf(plan, shape);
  // NCCL's kernels need SMs that the waiting GEMM does not hold, or it waits forever.
  int sms = 0;
  FO_JAX_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, state.device), "SM count"));
  if (gemm.sm_budget <= 0 || gemm.sm_budget >= sms) {
    return Status::InvalidArgument(
        "the all-gather's GEMM must leave NCCL SMs: its sm_budget resolves to " +
        std::to_string(gemm.sm_budget) + " of this GPU's " + std::to_string(sms) +
        " SMs (pass OverlapConfig.sm_budget below the SM count, or leave it unset)");
  }
  FO_JAX_RETURN_IF_ERROR(EnqueueOwnRows(xla_stream, bands, state.rank, buffers));
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(state.inputs_ready, xla_stream),
                                    "recording the all-gather's inputs_ready"));
  // The comm stream's work is enqueued before the GEMM that waits for it: if enqueueing fails
  // midway, no GEMM waits for a flag that nothing will write. NCCL's kernels never wait for the
  // GEMM, so their launch order does not matter on the GPU.
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(state.stream, state.inputs_ready, 0),
                                    "comm stream waiting for XLA's inputs"));
  // The bands are moved, never reduced: fp8 goes as bytes.
  const ncclDataType_t dtype = shape.dtype == GemmDtype::kBF16  ? ncclBfloat16
                               : shape.dtype == GemmDtype::kF16 ? ncclFloat16
                                                                : ncclUint8;
  const Status peers = EnqueuePeerBands(state, shape, bands, dtype, buffers);
  // XLA's stream waits for whatever the comm stream got (after the GEMM's launch, which would
  // otherwise wait for every band), so that XLA never reuses a buffer NCCL still writes.
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(state.comm_done, state.stream),
                                    "recording the comm stream's end"));
  if (!peers.ok()) {
    cudaStreamWaitEvent(xla_stream, state.comm_done, 0);  // the error reported is peers'
    return peers;
  }
  gemm.a = buffers.gathered;
  gemm.wait_flags = buffers.flags;
  gemm.counters = nullptr;  // nothing consumes the GEMM's output before the call ends
  std::string msg;
  const Status launched =
      TestFailureAt(FailStage::kLaunch, state.rank)
          ? Status::Internal("consumer GEMM launch failed " +
                             InjectedFailureMessage(FailStage::kLaunch))
          : LaunchStatus(LaunchSignalingGemm(xla_stream, gemm, &msg), "consumer GEMM launch",
                         msg);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(xla_stream, state.comm_done, 0),
                                    "joining the comm stream into XLA's stream"));
  if (!launched.ok()) {
    // The peers' bands were sent (nobody waits for this GEMM); every later call of the group
    // raises with it (comm_registry.h).
    FailCommGroup(state, "all-gather (NCCL transport) on rank " + std::to_string(state.rank) +
                             ": " + launched.message());
    return launched;
  }
  return NoteCallEnd(state, xla_stream, /*copy_engine=*/false);
}

}  // namespace fo_jax
