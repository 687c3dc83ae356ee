// One status type for everything beneath the FFI handlers: CUDA, NCCL and kernel-launcher
// failures and invalid plans become a Status with a readable message (NCCL's own, from
// ncclGetLastError, kept). ffi/ffi_status.h maps it to ffi::Error, once; nothing here throws.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <utility>

namespace fo_jax {

class Status {
 public:
  enum class Code { kOk = 0, kInvalidArgument, kInternal };

  Status() = default;  // ok
  static Status Ok() { return Status(); }
  // A plan or operand the call cannot take (the caller's mistake).
  static Status InvalidArgument(std::string message) {
    return Status(Code::kInvalidArgument, std::move(message));
  }
  // A CUDA, NCCL or library failure, or a failed group (the machine's state).
  static Status Internal(std::string message) {
    return Status(Code::kInternal, std::move(message));
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // The same status with "context: " before its message (an ok status stays ok).
  Status Within(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// cudaSuccess: ok. Otherwise Internal("what: <error name>: <description>").
Status CudaStatus(cudaError_t err, const std::string& what);

// A launcher that returns a CUDA error and fills a message (the kernels' convention): ok on
// cudaSuccess; cudaErrorInvalidValue (bad arguments) is InvalidArgument("what: message"), any
// other error Internal("what: message (<error name>)").
Status LaunchStatus(cudaError_t err, const std::string& what, const std::string& message);

// ncclSuccess: ok. Otherwise Internal("what failed: <NCCL's error string> (<the
// communicator's last error>)"); comm may be null.
Status NcclStatus(ncclResult_t result, const std::string& what, ncclComm_t comm);

// Ok unless `stream` is being captured into a CUDA graph; then InvalidArgument saying that `what`
// (a function's name) cannot run inside a capture, why, and what to do.
Status RejectStreamCapture(cudaStream_t stream, const std::string& what);

}  // namespace fo_jax

// Returns the Status of `expr` from the enclosing function unless it is ok.
#define FO_JAX_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::fo_jax::Status fo_jax_status_ = (expr);     \
    if (!fo_jax_status_.ok()) return fo_jax_status_; \
  } while (0)
