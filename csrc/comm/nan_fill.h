// NaN fills that need no SM: copies from one pinned host buffer of 0xFF bytes (a NaN in bf16,
// fp16 and e4m3), which the GPU's copy engines carry out. The copy-engine all-gather releases a
// band that will not come this way (all_gather_copy_engine.h, EnqueueBandRelease): its consumer
// GEMM, waiting for the band's flag that the release writes next, may hold every SM, so a
// memset kernel queued before that flag could wait for an SM forever.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "comm/status.h"

namespace fo_jax {

// The host buffer's size: a fill of more bytes is several copies.
inline constexpr size_t kNanFillChunkBytes = size_t(4) << 20;

// Allocates the process's pinned buffer (kNanFillChunkBytes of host memory, portable to every
// GPU) on first use; later calls return at once. Callers prepare it where a failure can still be
// reported, so that a release never allocates.
Status PrepareNanFill();

// Enqueues on `stream` copies of 0xFF bytes over [dst, dst + bytes), in chunks of the host
// buffer; dst may be another GPU's memory that this one can access. Needs PrepareNanFill() first.
// Returns the first failure (the copies after it are not enqueued).
Status EnqueueNanFill(cudaStream_t stream, void* dst, size_t bytes);

}  // namespace fo_jax
