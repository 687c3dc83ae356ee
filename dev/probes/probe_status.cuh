// Shared by the developer probes that call fo_jax's comm layer: its functions return
// fo_jax::Status, the probes check cudaError_t and print an error string.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "comm/status.h"

// cudaSuccess for an ok status; otherwise cudaErrorUnknown, with the status's message in *err.
inline cudaError_t ProbeStatus(const fo_jax::Status& status, std::string* err) {
  if (status.ok()) return cudaSuccess;
  if (err != nullptr) *err = status.message();
  return cudaErrorUnknown;
}
