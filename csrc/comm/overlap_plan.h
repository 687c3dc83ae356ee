// The plan of one overlapped call, as Python made it (fo_jax/_plan.py, OverlapPlan): every
// choice is made there; here it is validated once (ValidateOverlapPlan) and turned into
// arguments (OverlapGemmArgs), never chosen again. JAX-free: the FFI handler decodes its struct
// attribute into this (ffi/plan_attrs.h); the enums are bound to Python by the nanobind module,
// so their values exist in one place.
#pragma once

#include <cstdint>

#include "comm/gemm_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// kAllGather: all_gather(x) @ w, the GEMM consuming the gathered rows band by band as they
// arrive (docs/design.md, "The all-gather").
enum class Collective : int32_t { kReduceScatter = 0, kAllReduce = 1, kAllGather = 2 };
enum class Transport : int32_t { kNccl = 0, kCopyEngine = 1 };
// How a copy-engine call sums its last round after the GEMM (docs/design.md, "Direct form").
// kOnePass: every part at once, once the last chunk has landed. kByBands: the
// chunks already received first, while the last one is in flight, then out += last (more
// memory traffic, but off the critical path when the last copy outlasts the GEMM). kByRows: one
// pass of every part per group (piece) of the last chunk, each once its piece has landed: the
// traffic of one pass, and after the last copy only its rows remain.
enum class SumSplit : int32_t { kOnePass = 0, kByBands = 1, kByRows = 2 };

// Ranks the copy-engine transport takes at most (its flags hold one word per rank).
constexpr int kMaxCopyEngineRanks = 16;
// Receive slots of the copy engine: rounds * (P - 1) at most.
constexpr int kMaxReceiveSlots = 4 * kMaxCopyEngineRanks;
// Groups of the last chunk sent that sums by rows take at most (one flag each).
constexpr int kMaxRowPieces = kMaxCopyEngineRanks;

struct OverlapPlan {
  Collective collective = Collective::kReduceScatter;
  Transport transport = Transport::kNccl;
  int axis_size = 0;  // ranks of the reduced axis (P)
  GemmPlan gemm;
  int nccl_max_ctas = 0;  // the communicator's CTA bound (0: NCCL's default)
  // The copy-engine program; the NCCL transport's plan has rounds 1, no ring, kOnePass and
  // tiles_chunk 0.
  int rounds = 1;  // the all-reduce's rounds: each band is `rounds` chunks
  bool ring = false;  // the ring reduce-scatter: partial sums added in the GEMM's epilogue
  SumSplit sum_split = SumSplit::kOnePass;
  int tiles_chunk = 0;  // GEMM tile-rows per chunk
  // An all-gather's plan uses tiles_chunk as the tile-rows of one band:
  // each rank's rows are rows_per_rank / (tiles_chunk * tile_m) bands, one group each, and the
  // GEMM is a consumer config's (SignalingGemmArgs::wait_flags).
};

// The operands of a call: x[m, k] @ w[k, n] per rank; for an all-gather m is the GEMM's rows,
// the gathered x (x is [m / P, k] per rank). `dtype` is the operands'; what the collective moves
// and sums is the GEMM's output, of out_dtype(): the operands' for bf16/f16, bf16 for fp8
// operands (the fp8 kernel writes bf16 only), so the NCCL data type, the band sums and the
// copy engine's byte counts follow out_dtype(), the GEMM's kernel and its plan dtype.
struct OverlapShape {
  GemmDtype dtype = GemmDtype::kBF16;
  int64_t m = 0, n = 0, k = 0;

  GemmDtype out_dtype() const { return dtype == GemmDtype::kE4M3 ? GemmDtype::kBF16 : dtype; }
};

// Checks the plan against the operands, once per call, with a message that names what is
// wrong: the collective's and transport's requirements (rows divisible by the axis size, the
// batch the transport's layout needs), the GEMM plan (ValidateGemmPlan), and for the copy
// engine the chunk arithmetic (rounds x P chunks of tiles_chunk whole tile-rows each, refined by
// groups of whole clusters), the receive slots, the ring's kernel and the row pieces. fp8
// operands (GemmDtype::kE4M3) take the reduce-scatter and the all-reduce on either transport,
// but neither the ring (no fp8 kernel takes an addend) nor the all-gather (no fp8 consumer
// kernel).
Status ValidateOverlapPlan(const OverlapPlan& plan, const OverlapShape& shape);

// The GEMM's arguments for rank `rank` of a validated plan, without buffers or counters: the
// plan's, plus the copy engine's tile-row rotation (round h visits the chunks of its P bands
// rotated, logical chunk j being physical chunk (rank + 1 + j) % P, so each round's own chunk
// comes last).
SignalingGemmArgs OverlapGemmArgs(const OverlapPlan& plan, const OverlapShape& shape, int rank);

// Rows of the call's output: m / P for a reduce-scatter, m for an all-reduce and an all-gather.
int64_t OutputRows(const OverlapPlan& plan, const OverlapShape& shape);

// Logical chunk of the last round's last step: the chunk whose arrival the last sum waits for.
int LastSentChunk(int P, int rounds);
// The group that starts logical chunk `chunk` (chunks of tiles_chunk tile-rows; chunk = the
// chunk count gives num_groups), or -1 when no group starts there.
int ChunkFirstGroup(const GemmPlan& gemm, int tiles_chunk, int chunk);

// An all-gather's bands: `per_rank` bands of `rows` rows per rank, band q * per_rank + c being
// chunk c of rank q's rows. Arrival order on rank `rank` (the NCCL transport's steps, and the
// consumer GEMM's visit order): the own bands first (no wait), then step s = 1 .. P-1 brings
// rank (rank - s) mod P's bands, chunk by chunk.
struct AllGatherBands {
  int per_rank = 0;
  int64_t rows = 0;
  int count = 0;          // P * per_rank
  size_t band_bytes = 0;  // one band of x: rows x K elements of the GEMM's input
};
AllGatherBands AllGatherBandsOf(const OverlapPlan& plan, const OverlapShape& shape);
// The rank whose rows arrive at step s on rank `rank` (step 0: its own).
inline int AllGatherSource(int rank, int step, int P) { return (rank - step % P + P) % P; }

}  // namespace fo_jax
