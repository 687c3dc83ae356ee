// Diagnostics of the copy-engine transport (copy_engine.h): what a hung machine's flags and
// counters say, and how many copies and graphs a communicator made.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct CommState;  // comm/comm_registry.h

struct CopyEngineDebug {
  // The latest call's GEMM counters (the communicator's: group_counters.h) and what its waits
  // count them to.
  const uint32_t* last_counters = nullptr;
  uint32_t last_expected[kMaxGemmGroups] = {};
  int last_num_groups = 0;
  // A pinned buffer and a stream to read the flags and counters on a hung machine without any
  // call that waits for a GPU to drain (both made on first use, never freed).
  void* host = nullptr;
  cudaStream_t stream = nullptr;
};

// One line of text for a hang (fo_jax/_diagnostics.py): the rank, whether a call holds
// state.mu now (a host thread stuck inside the handler), the number of calls enqueued (epoch),
// copies and copy graphs built, and the flags and the latest call's GEMM counters as the GPU
// holds them, read by a copy on a stream of this function's own (given up after a second: a
// stuck GPU may not serve it).
std::string DescribeCopyEngineForDebug(CommState& state);

// Copies launched, copy graphs built and graph updates made so far by this communicator's
// copy-engine transport (all 0 before its first call). Once every kind of memory has its graph,
// graphs_built stops growing; updates grow only while a copy's operands change between calls.
struct CopyEngineCounts {
  uint64_t copies = 0;
  uint64_t graphs_built = 0;
  uint64_t updates = 0;
};
CopyEngineCounts CountCopyEngineCopies(CommState& state);

}  // namespace fo_jax
