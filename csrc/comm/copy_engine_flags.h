// The copy-engine transport's flags: one CopyEngineFlags per rank in device memory
// (CopyEngineBuffers::flags). The peers write into each other's with stream memory operations
// (cuStreamWriteValue32 after their copies: the write fences them), streams wait on them
// (cuStreamWaitValue32) and kernels read them (band_sum.h's ArrivalWait, the GEMM's addend
// flags). Every value is an epoch (the communicator's call count), so a flag is never reset: a
// wait for "this call" is a wait for >= its epoch. docs/design.md, "Flags and epochs", draws the
// protocol.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/overlap_plan.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct CopyEngineFlags {
  // [slot]: epoch of the chunk that arrived in receive slot `slot` (round h, step j: slot
  // h * (P - 1) + j).
  uint32_t arrived[kMaxReceiveSlots];
  // [q]: the last epoch in which rank q finished reading its receive slots (its senders may then
  // overwrite them).
  uint32_t recv_acked[kMaxCopyEngineRanks];
  // [q]: epoch in which rank q stored its summed band into this rank's output (all-reduce).
  uint32_t stored[kMaxCopyEngineRanks];
  // [q]: epoch of the output address rank q wrote into out_table (all-reduce).
  uint32_t out_ready[kMaxCopyEngineRanks];
  // [j]: output address of rank (this + 1 + j) % P (all-reduce), written as two 32-bit words.
  uint64_t out_table[kMaxCopyEngineRanks];
  // Epoch of this rank's latest call whose copies have all completed (they read XLA's
  // workspace, so the call's last band sum waits for it).
  uint32_t own_copies;
  // [k]: epoch in which piece k of the last chunk received arrived (SumSplit::kByRows: the
  // sender flags each group of its last step).
  uint32_t last_pieces[kMaxRowPieces];
  // [g]: epoch in which the ring's sender's group g arrived (the GEMM's addend flags).
  uint32_t ring_arrived[kMaxGemmGroups];
  // The latest epoch whose calls were released rather than completed on this rank: by its
  // progress watchdog (copy_engine_watchdog.h), which wrote the words above that the peers
  // owed, or by a peer whose call failed (failed_call.h). Band sums of those calls write NaNs and
  // store nothing into the peers (the out table may be stale); the ring's GEMM tiles that add a
  // slot store NaNs (SignalingGemmArgs::addend_abandoned).
  uint32_t abandoned;
};

// Device addresses of a CopyEngineFlags' fields: `flags` is device memory (this GPU's or a
// peer's), never read on the host; these only compute addresses.
template <typename T>
inline T* FlagField(CopyEngineFlags* flags, size_t offset) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(flags) + offset);
}
inline uint32_t* Arrived(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, arrived));
}
inline uint32_t* RecvAcked(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, recv_acked));
}
inline uint32_t* Stored(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, stored));
}
inline uint32_t* OutReady(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, out_ready));
}
inline uint64_t* OutTable(CopyEngineFlags* f) {
  return FlagField<uint64_t>(f, offsetof(CopyEngineFlags, out_table));
}
inline uint32_t* OwnCopies(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, own_copies));
}
inline uint32_t* LastPieces(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, last_pieces));
}
inline uint32_t* RingArrived(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, ring_arrived));
}
inline uint32_t* Abandoned(CopyEngineFlags* f) {
  return FlagField<uint32_t>(f, offsetof(CopyEngineFlags, abandoned));
}

// A per-rank flag array of CopyEngineFlags ([q] = rank q's word): recv_acked, stored, out_ready.
using RankFlags = uint32_t* (*)(CopyEngineFlags*);

}  // namespace fo_jax
