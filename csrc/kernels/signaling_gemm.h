// Signaling GEMM for Hopper (sm90a): D = A @ B with fp32 accumulation, bf16/fp16 in and out, or
// fp8 e4m3 in (B given K-major) and bf16 out with per-tensor scales (GemmDtype::kE4M3).
// The persistent kernel visits output tiles group by group and, once a tile's output is fully in
// global memory, adds 1 to counters[group]. A second stream can then consume finished groups.
// Its consumer variant (SignalingGemmArgs::wait_flags) reads A band by band as the bands arrive
// from other GPUs: the all-gather feeding the GEMM.
// This header is the kernels' whole interface: no XLA, no Python, no NCCL.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace fo_jax {

// kE4M3: A and B float8_e4m3fn, D bf16, B given K-major ([n, k] row-major: fp8 wgmma reads both
// operands K-major from shared memory), D = a_scale * b_scale * (A @ B) (SignalingGemmArgs).
// Only the table's fp8 rows (tile_k 128) have kernels for it, and the bf16/f16 rows none.
enum class GemmDtype : int { kBF16 = 0, kF16 = 1, kE4M3 = 2 };

// Bytes of one operand element (A's and B's; an fp8 GEMM's D is bf16).
inline constexpr size_t GemmInputBytes(GemmDtype dtype) {
  return dtype == GemmDtype::kE4M3 ? 1 : 2;
}

// Most groups one launch accepts (the group table travels in the kernel parameters).
inline constexpr int kMaxGemmGroups = 64;
// Most bands of a consumer launch (SignalingGemmArgs::wait_flags): every band holds a group.
inline constexpr int kMaxGemmBands = kMaxGemmGroups;

// One compiled tile configuration (rows of csrc/kernels/gemm_configs.py).
struct GemmTileConfig {
  const char* name;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  bool pingpong;  // false: cooperative (two consumer warpgroups share one tile)
  bool fast_accum;  // fp8 rows: the whole K sum in the tensor cores' accumulator (no fp32 promotion)
  int promotion_k_tiles;  // accurate fp8 rows: k-tiles summed in the tensor cores per promotion
};

int NumGemmConfigs();
// Whether the configuration (index) has kernels for the operand dtype (fp8 rows serve kE4M3
// only, the others kBF16 and kF16).
bool GemmConfigSupportsDtype(int config, GemmDtype dtype);
// Whether the configuration (index) has a kernel that takes SignalingGemmArgs' addend.
bool GemmConfigTakesAddends(int config);
// Whether the configuration (index) has a consumer kernel (SignalingGemmArgs' wait_flags).
bool GemmConfigHasConsumer(int config);
const GemmTileConfig& GetGemmConfig(int index);
// The index of the configuration named `name` (GemmTileConfig::name), or -1 if none is.
int FindGemmConfig(const char* name);

// Heuristic pick of a configuration for a problem (index into the table). Contract: every row
// of the table that supports the dtype (GemmConfigSupportsDtype) serves every use of the kernel
// (groups, counters, the batched reduce-scatter remap, tile-row rotation, any SM budget of at
// least one cluster), so any such index is a valid producer of an overlapped call; only
// GemmConfigTakesAddends rows take an addend (no fp8 row does) and only GemmConfigHasConsumer
// rows wait for A's bands; the pick is always a row of the dtype. fo_jax's
// Python planner chooses with the table measured on the GPU (fo_jax/_gemm_choice.py) and passes
// the index; this rule serves C++ callers (config -1) and the planner when no table is fitted.
int SelectGemmConfig(GemmDtype dtype, int m, int n, int k, int batch, int sm_budget);
// The pick for a consumer launch (SignalingGemmArgs::wait_flags) whose A has bands of band_rows
// rows: SelectGemmConfig's, unless that config has no consumer kernel or its cluster rows
// (tile_m * cluster_m) do not divide band_rows; then the consumer config with one 128-row tile
// (fp8: cooperative 128x128).
int SelectConsumerGemmConfig(GemmDtype dtype, int m, int n, int k, int band_rows, int sm_budget);

// Arguments of one launch. A is [batch * m, k] row-major (batch l starts at row l * m), B is
// [k, n] row-major (kE4M3: [n, k] row-major) and shared by all batches, D is [batch * m, n]
// row-major.
//
// Tile order and groups: group_begin[g] .. group_begin[g+1] are tile-rows (units of tile_m, within
// one batch) of group g; group_begin[0] == 0 and group_begin[num_groups] == ceil(m / tile_m).
// Tiles are visited group by group; within a group every batch and every column tile.
//
// Output placement: with batch == 1 row i of the product goes to row i of D. With batch > 1
// (the reduce-scatter layout of DESIGN.md) rows are grouped group-major: logical row i of batch l,
// in group g, goes to D row  batch * r0(g) + l * rows(g) + (i - r0(g)),  where
// r0(g) = min(group_begin[g] * tile_m, m) and rows(g) = min(group_begin[g+1] * tile_m, m) - r0(g).
// So group g occupies the contiguous rows [batch * r0(g), batch * r0(g+1)) of D, laid out
// [batch 0 band | batch 1 band | ...]. No row outside a tile's own band is ever written.
//
// Signal: if counters != nullptr, each finished tile adds 1 to counters[its group], after its
// output is complete and visible in global memory (release at GPU scope). A CTA adds its
// consecutive tiles of one group in one release-add when it moves to another group or finishes
// (cooperative configs; ping-pong signals each tile), so a counter may jump by more than 1. A
// group is done when its counter has grown by its count, batch * (group_begin[g+1] -
// group_begin[g]) * ceil(n / tile_n): the kernel only adds, so a consumer waits for what the
// counter held before the kernel plus that count. The caller zeroes the counters in stream order,
// sets zero_counters_on_launch (below), or keeps them from earlier launches and adds what those
// counted to its waits (the overlapped calls: comm/group_counters.h).
struct SignalingGemmArgs {
  GemmDtype dtype = GemmDtype::kBF16;
  int m = 0, n = 0, k = 0;  // multiples of 8 (kE4M3: k of 16, 16-byte rows of A and B)
  int batch = 1;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  // kE4M3 only: device float scalars (nullptr: 1) whose product scales the fp32 accumulator in
  // the epilogue before the one rounding to bf16. Read by the kernel, so the host never waits.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int num_groups = 1;
  int group_begin[kMaxGemmGroups + 1] = {};
  uint32_t* counters = nullptr;  // device memory, num_groups entries, or nullptr: no signal
  int sm_budget = 0;             // persistent CTAs at most this many SMs; 0: all SMs
  int config = -1;               // index into the table; -1: SelectGemmConfig
  // Tile-row rotation (batch 1 only): the group table and the visit order refer to logical
  // tile-rows t = 0 .. tiles_m-1, and logical tile-row t is computed from and stored to the
  // physical tile-row (t + rotate_tile_rows) % tiles_m; the output stays in natural row order.
  // The copy-engine reduce-scatter uses it to visit the band for rank r+1 first and its own
  // band last. Requires m % tile_m == 0 and rotate_tile_rows and tiles_m multiples of the
  // config's cluster_m.
  int rotate_tile_rows = 0;
  // With rotate_period_tile_rows = R > 0 the rotation applies within each run of R tile-rows:
  // logical t -> physical (t / R) * R + (t % R + rotate_tile_rows) % R (the copy-engine
  // all-reduce visits its output as several rounds of bands). R divides tiles_m, is a multiple
  // of cluster_m and exceeds rotate_tile_rows. 0: R = tiles_m.
  int rotate_period_tile_rows = 0;
  // Zero `counters` on the stream right before the kernel launch, after all host-side setup
  // (TMA descriptors, parameters), so the GPU does not idle between the two. If
  // after_zero_event is set it is recorded between the zeroing and the kernel (a consumer stream
  // that waits on it sees zeroed counters and inputs ready, and does not wait for the kernel).
  bool zero_counters_on_launch = false;
  cudaEvent_t after_zero_event = nullptr;
  // Addend (batch 1, whole tiles of whole clusters, configs with GemmConfigTakesAddends only;
  // nullptr: none): every tile of logical tile-row t >= addend_first_tile_row adds
  // addend[((t - addend_first_tile_row) * tile_m + i) * n + col] (a row-major [rows, n] matrix of
  // the GEMM's dtype, 16-byte aligned) in fp32 before its one rounding (a CUTLASS epilogue
  // source, loaded by TMA). The addend's tile-row s = t - addend_first_tile_row is read only once
  // addend_flags[g] >= addend_flag_value, g being the group of this launch's table that holds
  // tile-row s (acquire loads at system scope): the addend is another GPU's output of the same
  // group table, copied into this GPU group by group, each group's flag written by a stream
  // memory operation after its copy. The copy-engine reduce-scatter's ring uses it: each rank
  // adds the partial sum that the next rank computed one step earlier (comm/copy_engine.h).
  // The wait is in the producer's epilogue warp: it holds back only that CTA's epilogue.
  const void* addend = nullptr;
  int addend_first_tile_row = 0;
  const uint32_t* addend_flags = nullptr;  // num_groups words of device memory
  uint32_t addend_flag_value = 0;
  // With an addend (nullptr: none): a word of device memory that whoever releases a call that
  // never completes writes (comm/copy_engine_flags.h, `abandoned`) before the flags it releases,
  // and addend_nan, device memory holding at least tile_m * tile_n NaNs of the GEMM's dtype
  // (the config's tile; 16-byte aligned; never written while a kernel may read it). Once a
  // group's flag has reached addend_flag_value, the epilogue warp reads the word; if it too has
  // reached that value (the rows were never sent), the group's tiles add NaNs instead of their
  // addend rows: a released ring call's partial sums and output read as failed on every GPU they
  // reach, in the same call.
  const uint32_t* addend_abandoned = nullptr;
  const void* addend_nan = nullptr;
  // Tail output (with an addend, ping-pong configs only; nullptr: none): the tiles of logical
  // tile-rows t >= tail_first_tile_row are stored at rows (t - tail_first_tile_row) * tile_m of
  // tail_out (a row-major [(tiles_m - tail_first_tile_row) * tile_m, n] matrix, 16-byte aligned)
  // instead of into D; their counters still count them. The ring's own band goes straight into
  // the reduce-scatter's output this way.
  void* tail_out = nullptr;
  int tail_first_tile_row = 0;
  // Consumer ("all-gather") launch (configs with GemmConfigHasConsumer only; nullptr: none). A is
  // the gathered input: m / band_rows bands of band_rows rows each, band b being rows
  // [b * band_rows, (b + 1) * band_rows), which arrive in A from other GPUs at different times.
  // Band b's rows are read only once wait_flags[b] has reached wait_flag_value: the warp that
  // issues A's TMA loads waits (acquire at system scope, then the async-proxy fence) before the
  // first load of a tile of the band, once per band and CTA. A band's flag is written by a
  // stream memory operation after the band's copy, on this GPU or a peer. Flags are epoch-tagged
  // and never reset: each call passes the next value, and "reached" is the wrap-safe
  // (int32_t)(flag - wait_flag_value) >= 0, so a flag left by an earlier call (value - 1,
  // value - 2, ...: up to 2^31 behind) never passes, across 2^32 too.
  // Visit order: the bands in band_order[0 .. num_bands-1] (a permutation of the bands, own band
  // first: it needs no wait), each band's groups in ascending order, tiles within a group as
  // above. The group table covers all m rows in natural order and every band boundary is a group
  // boundary; groups, counters and D rows are all physical (D in natural row order). Needs batch
  // 1, no rotation, no addend, band_rows a multiple of tile_m * cluster_m (a cluster's tile-rows
  // stay in one band) dividing m; with config -1 a consumer config that fits is picked.
  // Whatever writes the flags must not need an SM that the waiting kernel holds: copy-engine
  // copies and stream memory operations need none; a copy kernel or NCCL needs sm_budget to
  // leave it SMs (a device-to-device copy within one GPU runs as a kernel).
  const uint32_t* wait_flags = nullptr;  // num_bands words of device memory
  uint32_t wait_flag_value = 0;
  int band_rows = 0;
  int band_order[kMaxGemmBands] = {};
  // Split K (1: none), for problems of few tiles and long K: the tiles of the last partial
  // wave (all of them when there are fewer tiles than SMs) have their K divided among k_splits
  // units of work that run on different SMs; the last adds the others' fp32 partial sums in
  // split order (a fixed order: the result does not depend on timing) and then stores and
  // signals the tile like an unsplit kernel (group_tile_scheduler.cuh). Cooperative configs only,
  // and not with an addend or wait_flags; needs ceil(k / tile_k) >= k_splits. split_partials:
  // device memory (16-byte aligned, any contents) of split_partial_floats floats;
  // split_flags: split_flag_words words of device memory, zero when the kernel starts, which
  // the kernel leaves zero. SplitKPartialFloats / SplitKFlagWords bound what a launch needs; the
  // launcher checks the exact need (the tail's tiles) against the two sizes. A batched launch
  // whose m is not a multiple of tile_m runs unsplit (the launcher runs it as two launches).
  int k_splits = 1;
  float* split_partials = nullptr;
  long long split_partial_floats = 0;
  uint32_t* split_flags = nullptr;
  long long split_flag_words = 0;
};

// Most units of work one output tile is split into (SignalingGemmArgs::k_splits).
inline constexpr int kMaxKSplits = 16;

// Device memory that suffices for a split-K launch (0 when args.k_splits <= 1) on a device of
// `sms` SMs, for the configuration args.config (resolved as LaunchSignalingGemm does when -1):
// one flag word and k_splits - 1 partial tiles of tile_m * tile_n floats per tile of the last
// partial wave, which has fewer cluster tiles than the clusters resident at once
// (min(sms, sm_budget) / cluster_m at most) and no more than the problem has.
long long SplitKFlagWords(const SignalingGemmArgs& args, int sms);
long long SplitKPartialFloats(const SignalingGemmArgs& args, int sms);

// Tiles whose completion counters[g] counts, for the configuration args.config (resolved as
// LaunchSignalingGemm does when -1):
// batch * (group_begin[g+1] - group_begin[g]) * ceil(n / tile_n).
int ExpectedGroupCount(const SignalingGemmArgs& args, int g);

// Validates the arguments and enqueues the kernel on `stream`. On failure returns the CUDA
// error (cudaErrorInvalidValue for bad arguments) and sets *error to a readable message.
cudaError_t LaunchSignalingGemm(cudaStream_t stream, const SignalingGemmArgs& args,
                                std::string* error);

// Loads every GEMM kernel into the current device's context (cudaFuncGetAttributes and the
// shared-memory attribute), so that no first launch is serialized by CUDA lazy loading. Call once
// per device before any overlapped launch; cheap after the first call.
cudaError_t LoadAllGemmKernels(std::string* error);

}  // namespace fo_jax
