// One copy-engine call's arguments (copy_engine.h), derived from its validated plan and the
// GEMM's arguments: what the call enqueues on XLA's stream and hands to the copy worker.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/overlap_plan.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct CopyEngineArgs {
  // The dtype of what is copied and summed: the GEMM's output (OverlapShape::out_dtype).
  GemmDtype dtype = GemmDtype::kBF16;
  // Reduce-scatter: workspace = the GEMM's output [P * band rows, N] in natural row order, out =
  // [band rows, N]. All-reduce: the GEMM writes straight into the output, workspace = out =
  // [P * band rows, N]; the own band is summed in place, the others overwritten by the peers.
  bool all_reduce = false;
  const void* workspace = nullptr;
  void* out = nullptr;
  size_t band_elems = 0;  // band rows * N
  // Rounds (all-reduce): each band is `rounds` chunks; the GEMM visits round h's chunks (rows
  // of chunk (h, b) = [(h * P + b) * chunk rows, ...), owner b) in destination order, round by
  // round, and round h's sum and stores run on the sum stream while the GEMM computes the next
  // rounds, on the SMs the GEMM leaves free (sm_budget) and on every SM once it ends (the sum's
  // blocks beyond the free SMs wait for them): the all-gather overlaps the GEMM instead of
  // following it. Reduce-scatter: rounds = 1.
  int rounds = 1;
  // The ring reduce-scatter (copy_engine.h; rounds 1): steps 0 .. P - 2 go to rank r - 1, each
  // group flagged on landing, and the GEMM's epilogue adds the partial sums (SetGemmRing gives
  // it their address, flags and the output); nothing is summed after the GEMM.
  bool ring = false;
  // How the last round is summed after the GEMM (overlap_plan.h); kByRows is one pass when the
  // last chunk sent is one group. Unused by the ring.
  SumSplit sum_split = SumSplit::kOnePass;
  // The GEMM's groups (logical tile rows in visit order; SignalingGemmArgs::group_begin) refine
  // the chunks (round h, step j is logical chunk h * P + j, step P - 1 the own chunk): every
  // chunk boundary k * tiles_chunk is a group boundary, and a chunk may be several groups, each
  // copied as soon as its counter is full (the chain of copies then starts, and ends, sooner;
  // each copy costs the copy engine ~9 us of turnaround: docs/performance.md).
  const uint32_t* counters = nullptr;
  uint32_t expected[kMaxGemmGroups] = {};
  int num_groups = 0;
  int group_begin[kMaxGemmGroups + 1] = {};
  int chunk_first_group[kMaxGemmGroups + 1] = {};  // first group of each chunk; [chunks] = groups
  int tiles_chunk = 0;
  size_t tile_row_elems = 0;  // tile_m * N
};

// The arguments of a validated copy-engine plan whose GEMM has arguments `gemm` (its output
// gemm.d is the workspace of a reduce-scatter, the output of an all-reduce; `out` the call's
// output).
CopyEngineArgs CopyEngineArgsOf(const OverlapPlan& plan, const OverlapShape& shape,
                                const SignalingGemmArgs& gemm, void* out);

// Group g's place among the groups (pieces) of the last chunk sent, or -1 if it is not one of
// them: SumSplit::kByRows flags each piece on landing (CopyEngineFlags::last_pieces).
inline int LastChunkPiece(const CopyEngineArgs& a, int P, int g) {
  const int first = a.chunk_first_group[LastSentChunk(P, a.rounds)];
  const int end = a.chunk_first_group[LastSentChunk(P, a.rounds) + 1];
  return g >= first && g < end ? g - first : -1;
}

}  // namespace fo_jax
