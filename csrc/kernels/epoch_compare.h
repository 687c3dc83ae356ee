// Wrap-safe comparison of 32-bit epochs, shared by every wait on a flag (host and device).
//
// The copy-engine transport's flags carry the communicator's call count as a 32-bit epoch and
// are never reset (comm/copy_engine_flags.h); after 2^32 calls the count wraps. A plain unsigned
// `seen >= value` would then read every flag left by the calls before the wrap as "reached" (a
// band sum adding a slot that has not landed; an all-reduce storing through a stale peer
// address). The cyclic comparison below reads a flag up to 2^31 - 1 epochs behind the awaited
// value as "not yet", whatever the wrap: the protocol keeps every flag within a few epochs of the
// awaited value (a call waits for flags of its own epoch or of the previous one), so the window
// is never approached.
//
// It is the comparison CUDA's stream memory operations use: cuda.h documents
// CU_STREAM_WAIT_VALUE_GEQ (cuStreamWaitValue32's default) as "(int32_t)(*addr - value) >= 0
// ... a cyclic comparison which ignores wraparound", so the stream waits and the kernels' waits
// agree on every value.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FO_JAX_EPOCH_HOST_DEVICE __host__ __device__
#else
#define FO_JAX_EPOCH_HOST_DEVICE
#endif

namespace fo_jax {

// Whether a flag that reads `seen` has reached epoch `value` (cyclic: see above). The subtraction
// wraps modulo 2^32 and the conversion to int32_t is two's complement (C++20; every compiler
// fo_jax supports does so already).
FO_JAX_EPOCH_HOST_DEVICE constexpr bool EpochReached(uint32_t seen, uint32_t value) {
  return static_cast<int32_t>(seen - value) >= 0;
}

}  // namespace fo_jax

#undef FO_JAX_EPOCH_HOST_DEVICE
