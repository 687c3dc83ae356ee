// Gating a stream on a 32-bit counter in device memory that a running kernel increments:
// cuStreamWaitValue32 (holds no SM; resolved through the runtime, no libcuda link) or, where the
// driver lacks it, a 1-thread spin kernel. Both must be enqueued AFTER the producer kernel, and
// both kernels must be loaded before (CUDA lazy loading serializes first launches:
// docs/troubleshooting.md, "Lazy module loading").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "comm/status.h"

namespace fo_jax {

// Loads the spin kernel and resolves cuStreamWaitValue32 / cuStreamWriteValue32 for the current
// device. Idempotent.
Status PrepareStreamWait();

// Enqueues on `stream`: wait until *counter >= value (the spin kernel only where the driver
// lacks cuStreamWaitValue32).
Status EnqueueWaitGeq(cudaStream_t stream, const uint32_t* counter, uint32_t value);

// Enqueues on `stream`: *address = value (cuStreamWriteValue32; no SM). The driver fences the
// stream's earlier memory operations before the write ("similar semantics to
// __threadfence_system()"), so a consumer that sees the value also sees the data the stream wrote
// before it, e.g. a copy into a peer GPU's memory. `address` may be a peer GPU's memory.
Status EnqueueWriteValue(cudaStream_t stream, uint32_t* address, uint32_t value);

}  // namespace fo_jax
