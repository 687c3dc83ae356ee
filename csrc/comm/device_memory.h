// Device memory that fo_jax allocates itself, outside XLA's pool (cudaMalloc): every such
// allocation goes through here, so that fo_jax can say how much it holds per GPU
// (`python -m fo_jax.info`, fo_jax.info.device_resources) and a failed allocation says what to
// do. docs/troubleshooting.md, "Memory outside XLA's pool", lists what is allocated and when.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/status.h"

namespace fo_jax {

// cudaMalloc of `bytes` on the current device (`device`), counted under `what` (a short name:
// "copy-engine receive buffer"). A failure says how much was asked for, what fo_jax already
// holds on that GPU and how to make room.
Status DeviceAlloc(int device, const char* what, size_t bytes, void** ptr);

// cudaFree of an allocation of DeviceAlloc. cudaFree synchronizes the device: callers free only
// where no call can be using the memory and no GPU work waits for the host (comments at the
// callers say why their point is one).
Status DeviceFree(int device, const char* what, size_t bytes, void* ptr);

struct DeviceBytes {
  int device = -1;
  std::string what;
  size_t bytes = 0;        // held now
  int allocations = 0;     // held now
  size_t freed_bytes = 0;  // freed so far (superseded buffers)
};

// What fo_jax holds now, one row per (device, what).
std::vector<DeviceBytes> DeviceBytesHeld();

}  // namespace fo_jax
