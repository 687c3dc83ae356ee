// The copy-engine transport's progress timeout (FO_JAX_COMM_TIMEOUT_S; docs/design.md, "Failure
// handling"). A rank whose partner stopped calling (its XLA thread stopped, its process was
// killed) waits on words that nobody will write: stream waits (cuStreamWaitValue32), the band
// sums' waits and the ring GEMM's, all inside the GPU, none with a timeout of its own. The
// progress watchdog (comm_registry.h), once a call of the group has not completed for the
// limit, fails the group and, on each local rank whose calls have not completed, writes into
// that rank's own flags every word that its peers owe it, with the epoch of its latest enqueued
// call: every wait of its pending calls is then satisfied, and the next call raises. The
// release writes `abandoned` first: the band sums and the ring GEMM's tiles that wait on the
// released words write NaNs (band_sum.h, SignalingGemmArgs::addend_abandoned), so those outputs
// read as failed. (The all-gather's copy threads release a peer that never came themselves, with
// NaN rows: all_gather_copy_engine.h.) Only the rank's own memory is written, so a release is the
// same whether the peers are in this process or another.
//
// An all-reduce's out table may then hold a peer's address from an earlier call, which its band
// sums must not store through: the release writes `abandoned` first, and a band sum whose epoch
// it has reached stores nothing remotely (band_sum.h, RemoteOutputs).
//
// The release goes on a stream of its own, but streams beyond CUDA_DEVICE_MAX_CONNECTIONS share
// the GPU's hardware queues, where it may queue behind a blocked wait of another stream. So a
// call still stuck one more limit after its release ends the process (kStuckExitStatus, after a
// message naming the group and the call), as PyTorch's NCCL watchdog does: a process that exits
// can be restarted by its launcher, one that hangs cannot.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "comm/copy_engine_flags.h"
#include "comm/status.h"

namespace fo_jax {

struct CommState;  // comm_registry.h

// The exit status of a process that the watchdog ends (EX_SOFTWARE).
inline constexpr int kStuckExitStatus = 70;

// A run of `count` words of a CopyEngineFlags that the peers write.
struct OwedWords {
  uint32_t* first;
  int count;
};
inline constexpr int kOwedRuns = 6;

// Every word of `flags` that peers write: out_ready, arrived, last_pieces, ring_arrived, stored,
// recv_acked (not own_copies: this rank's; not the out table: addresses, not epochs).
void WordsPeersOwe(CopyEngineFlags* flags, OwedWords (&runs)[kOwedRuns]);

// Enqueues on `stream`: flags->abandoned = through, then every word of WordsPeersOwe(flags) =
// through. `flags` is this rank's own CopyEngineFlags. The one-GPU check (stuck_release_check.h)
// runs it too.
Status EnqueueStuckRankRelease(cudaStream_t stream, CopyEngineFlags* flags, uint32_t through);

// The watchdog's release of a rank with a copy-engine state: EnqueueStuckRankRelease on the
// state's release stream through its latest enqueued epoch, which it returns in *through. Takes
// no lock (the stuck call's thread may hold the state's).
Status ReleaseStuckCopyEngineRank(CommState& state, uint32_t* through);

// Prints `why` (with the exit status and FO_JAX_COMM_TIMEOUT_S) to stderr and ends the process
// at once, without exit handlers (they would wait for the stuck GPU work).
[[noreturn]] void EndStuckProcess(const std::string& why);

}  // namespace fo_jax
