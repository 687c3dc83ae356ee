// See copy_engine_watchdog.h.
#include "comm/copy_engine_watchdog.h"

#include <cstdio>
#include <cstdlib>

#include "comm/comm_registry.h"
#include "comm/copy_engine.h"
#include "comm/stream_wait.h"

namespace fo_jax {

// A field added to CopyEngineFlags must be placed: owed by the peers (listed below) or not.
static_assert(sizeof(CopyEngineFlags) ==
                  4 * (3 * kMaxCopyEngineRanks + kMaxReceiveSlots + kMaxRowPieces +
                       kMaxGemmGroups) +
                      sizeof(CopyEngineFlags::out_table) + 4 /* own_copies */ +
                      4 /* abandoned */,
              "a CopyEngineFlags field is missing from WordsPeersOwe or from this list");

void WordsPeersOwe(CopyEngineFlags* flags, OwedWords (&runs)[kOwedRuns]) {
  runs[0] = {OutReady(flags), kMaxCopyEngineRanks};
  runs[1] = {Arrived(flags), kMaxReceiveSlots};
  runs[2] = {LastPieces(flags), kMaxRowPieces};
  runs[3] = {RingArrived(flags), kMaxGemmGroups};
  runs[4] = {Stored(flags), kMaxCopyEngineRanks};
  runs[5] = {RecvAcked(flags), kMaxCopyEngineRanks};
}

Status EnqueueStuckRankRelease(cudaStream_t stream, CopyEngineFlags* flags, uint32_t through) {
  // `abandoned` first: a band sum that sees a released out_ready must also see it (each stream
  // write fences the stream's earlier ones: stream_wait.h).
  FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(stream, Abandoned(flags), through));
  OwedWords owed[kOwedRuns];
  WordsPeersOwe(flags, owed);
  for (const OwedWords& words : owed) {
    for (int i = 0; i < words.count; ++i) {
      FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(stream, words.first + i, through));
    }
  }
  return Status::Ok();
}

Status ReleaseStuckCopyEngineRank(CommState& s, uint32_t* through) {
  std::shared_ptr<CopyEngineState> ce = s.copy_engine;
  if (!ce) return Status::Internal("no copy-engine state to release");
  *through = ce->epoch.load();
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(s.device), "cudaSetDevice"));
  return EnqueueStuckRankRelease(ce->release_stream, ce->buffers.flags, *through)
      .Within("releasing a stuck copy-engine rank");
}

void EndStuckProcess(const std::string& why) {
  std::fprintf(stderr,
               "fo_jax: %s; ending the process (exit status %d): a stuck GPU cannot be "
               "released otherwise (FO_JAX_COMM_TIMEOUT_S sets the limit; 0 waits)\n",
               why.c_str(), kStuckExitStatus);
  std::fflush(stderr);
  std::_Exit(kStuckExitStatus);
}

}  // namespace fo_jax
