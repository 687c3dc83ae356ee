// See status.h.
#include "comm/status.h"

namespace fo_jax {

Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Internal(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

Status LaunchStatus(cudaError_t err, const std::string& what, const std::string& message) {
  if (err == cudaSuccess) return Status::Ok();
  if (err == cudaErrorInvalidValue) return Status::InvalidArgument(what + ": " + message);
  return Status::Internal(what + ": " + message + " (" + cudaGetErrorName(err) + ")");
}

Status NcclStatus(ncclResult_t result, const std::string& what, ncclComm_t comm) {
  if (result == ncclSuccess) return Status::Ok();
  std::string message = what + " failed: " + ncclGetErrorString(result);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last) message += std::string(" (") + last + ")";
  }
  return Status::Internal(std::move(message));
}

Status RejectStreamCapture(cudaStream_t stream, const std::string& what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FO_JAX_RETURN_IF_ERROR(
      CudaStatus(cudaStreamIsCapturing(stream, &capture), "asking whether the stream captures"));
  if (capture == cudaStreamCaptureStatusNone) return Status::Ok();
  return Status::InvalidArgument(
      what + " cannot run on a stream that is being captured into a CUDA graph: each call "
      "changes host-side state that a replay would not change, so a replayed graph would hang; "
      "call it outside the captured region (the plain fo_jax.matmul may be captured)");
}

}  // namespace fo_jax
