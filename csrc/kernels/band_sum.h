// out = sum of P equally sized bands (the local half of the copy-engine reduce-scatter: this
// rank's own band of the GEMM output plus the bands the other ranks copied into its receive
// buffer), accumulated in fp32 and rounded once, like the GEMM.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/signaling_gemm.h"

namespace fo_jax {

constexpr int kMaxBandSumParts = 16;

// Enqueues out[i] = sum_{p < nparts} parts[p][i] for i < count on `stream`. count % 8 == 0 and
// every pointer 16-byte aligned (checked); 1 <= nparts <= kMaxBandSumParts. out may be one of the
// parts (each element is read before it is written, by the same thread). max_blocks > 0 caps
// the grid (the probes measure the sum on a few SMs next to a GEMM); 0: two blocks per SM.
//
// Remote outputs (the copy-engine all-reduce's way back): `table` is a device array of `count`
// addresses that this kernel reads on the GPU (other GPUs wrote them with stream memory
// operations); address + offset_bytes receives the same values as out, typically another GPU's
// memory over NVLink.
// `abandoned`, if set, is a word set to the latest epoch of a call released rather than
// completed (by the progress watchdog, comm/copy_engine_watchdog.h, or by a peer's failed call,
// comm/failed_call.h). Read after the arrival wait, a value that has reached `epoch` means the
// call's parts are undefined and the table may hold stale addresses, so nothing is stored
// remotely and out is written with NaNs (a failed call's output reads as failed, never as a
// plausible sum). Any call may set it (table null, count 0: a reduce-scatter's sums).
struct RemoteOutputs {
  const uint64_t* table = nullptr;
  int count = 0;
  size_t offset_bytes = 0;
  const uint32_t* abandoned = nullptr;
  uint32_t epoch = 0;
};
// Flags to wait for inside the kernel, before any part is read: flags[0 .. count) >= value
// (acquire loads at system scope: other GPUs' stream memory operations write them after their
// copies). A wait in the kernel instead of cuStreamWaitValue32 ops before the launch: each stream
// op between the GEMM and the sum left the GPU idle a few us (12 us between the GEMM's end and
// the sum behind two satisfied waits; raw log in git history:
// benchmarks/results/overlap_profile_tp4_2026-11-21_fe573db.log). Only for a sum that runs after
// the GEMM: its blocks hold SMs while they wait.
struct ArrivalWait {
  const uint32_t* flags = nullptr;
  int count = 0;
  uint32_t value = 0;
  // One more flag to wait for (*also >= value) that need not follow `flags`, e.g. the copy-engine
  // transport's "this GPU's own pushes are done" (so XLA's stream needs no wait of its own) or
  // a piece of the last band that landed.
  const uint32_t* also = nullptr;
};
// `from_end`: the blocks sweep the band from its last vector to its first (else first to last),
// so that a pass reads first what is most likely still in L2: the rows the GEMM or the previous
// pass wrote last.
cudaError_t LaunchBandSum(cudaStream_t stream, GemmDtype dtype, const void* const* parts,
                          int nparts, void* out, size_t count, std::string* error,
                          int max_blocks = 0, RemoteOutputs remote = {},
                          ArrivalWait wait = {}, bool from_end = false);

// Loads both instantiations into the current device's context (lazy loading would otherwise
// serialize their first launch behind the running GEMM: DESIGN.md). Idempotent.
cudaError_t LoadBandSumKernels(std::string* error);

}  // namespace fo_jax
