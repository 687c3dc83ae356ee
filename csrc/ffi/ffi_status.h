// The one place where fo_jax's Status (comm/status.h) becomes an ffi::Error: handlers never
// throw and never abort; XLA raises the message as a Python exception.
#pragma once

#include <string>

#include "comm/status.h"
#include "xla/ffi/api/ffi.h"

namespace fo_jax {

// `target`: the FFI target's name, which leads the message.
inline xla::ffi::Error ToFfiError(const Status& status, const char* target) {
  if (status.ok()) return xla::ffi::Error::Success();
  const std::string message = std::string(target) + ": " + status.message();
  if (status.code() == Status::Code::kInvalidArgument) {
    return xla::ffi::Error::InvalidArgument(message);
  }
  return xla::ffi::Error::Internal(message);
}

}  // namespace fo_jax
