// The last step of a copy-engine all-reduce whose peers live in other processes: NaNs over the
// whole output when the call was abandoned. A peer that fails its call after handing its copies
// over (its band sums not launched) marks this rank's `abandoned` before it writes `stored`, but
// this rank's own sums may have passed their waits before the mark landed, and the band that
// peer owed this output is missing. Within one process such a call fails as a whole (one JAX
// call: nobody reads the output); across processes this rank's JAX call succeeds, so its output
// must say that the call failed (failed_call.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "comm/status.h"

namespace fo_jax {

// Loads the kernel into the current device's context, where a failure can still be reported
// and nothing waits: CUDA loads a kernel lazily at its first launch, which inside a call can
// wait for this GPU to drain while the GPU waits for work another thread must still enqueue.
Status LoadPoisonIfAbandoned();

// Enqueues on `stream` a kernel that reads *abandoned (an acquire load at system scope: peers
// write it with stream memory operations) and, where it has reached `epoch` (epoch_compare.h),
// fills [out, out + bytes) with 0xFF bytes (NaN in bf16 and fp16). `bytes` is a multiple of 16.
Status EnqueuePoisonIfAbandoned(cudaStream_t stream, const uint32_t* abandoned, uint32_t epoch,
                                void* out, size_t bytes);

}  // namespace fo_jax
