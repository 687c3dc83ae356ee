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

}  // namespace fo_jax
