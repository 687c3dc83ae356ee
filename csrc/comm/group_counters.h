// The reduce-scatter's and all-reduce's group counters, kept per communicator across calls.
//
// The signaling GEMM adds each finished tile to its group's counter (kernels/signaling_gemm.h),
// and the transport's streams wait until a group's counter reaches the group's tile count (the
// NCCL transport's comm stream, the copy engine's copy and sum streams). Counters that start
// every call at zero need a memset between two GEMMs, which costs 0.6-1.8 us a call in a stream
// of calls on an H200 (docs/gemm_performance.md, "The producer's signals"). So the counters live
// in the communicator's state and are not zeroed between calls that succeed: each word only
// grows, and a call's consumers wait for `base + count`, where `base` is what the word reads once
// every earlier call's GEMM has finished (the sum of their counts, modulo 2^32). The waits compare
// cyclically, as the copy engine's epochs do (kernels/epoch_compare.h), so the words may wrap.
//
// This relies on what the copy engine's epochs rely on already: the calls of one communicator
// run on the GPU in the order their host thread enqueued them (one XLA stream per device), and
// only their GEMMs add to the words.
//
// A call that does not end well (its GEMM not launched, a release of what its peers wait for, a
// failed group) may leave a word short of or past its base: the next call zeroes the words again
// on XLA's stream before its GEMM (after every earlier GEMM, in stream order) and counts from
// bases of 0. So does the first call (cudaMalloc leaves the words undefined). Such a call zeroes
// every word, not only its own groups': a later call with more groups counts the others from 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct GroupCounters {
  uint32_t* words = nullptr;  // kMaxGemmGroups words of the communicator's device memory
  // Each word's value once every call counted so far has finished: a call's waits add total[g]
  // to its groups' tile counts (the base). All 0 from a zeroing call's BeginCountedCall on.
  uint32_t total[kMaxGemmGroups] = {};
  bool zero_next = true;  // the next call zeroes the words first
};

inline constexpr size_t kGroupCounterBytes = kMaxGemmGroups * sizeof(uint32_t);

// Under the communicator's lock, before the call's waits are planned: whether the call zeroes
// the words on XLA's stream before its GEMM (then `total` is reset to 0 here).
bool BeginCountedCall(GroupCounters& counters);

// For a call that zeroes: zeroes the words past its `num_groups` groups on `stream`. Its own
// groups' words are zeroed by the GEMM's launcher right before the kernel
// (SignalingGemmArgs::zero_counters_on_launch), after the host has built the kernel's parameters.
Status ZeroCountersPastGroups(const GroupCounters& counters, int num_groups, cudaStream_t stream);

// After the call: with `counted` (its GEMM launched with the words and the call succeeded) the
// GEMM's counts are added to the totals; otherwise the next call zeroes the words.
void EndCountedCall(GroupCounters& counters, const SignalingGemmArgs& gemm, bool counted);

}  // namespace fo_jax
