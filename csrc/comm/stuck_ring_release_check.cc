// See stuck_ring_release_check.h.
#include "comm/stuck_ring_release_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "comm/copy_engine_args.h"
#include "comm/copy_engine_buffers.h"
#include "comm/copy_engine_flags.h"
#include "comm/copy_engine_watchdog.h"
#include "comm/failed_call.h"
#include "comm/gpu_check_resources.h"
#include "comm/stream_wait.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {
namespace {

// Rank 0 of a 3-rank ring: chunks of 512 rows (4 tile-rows of the 128-row addend config, two
// groups of two each: the 2-CTA cluster's rows stay in one group), N two 192-column tiles, K
// one tile-loop of 128. Natural visit order (no rotation), so logical chunk j is rows
// [j * 512, (j + 1) * 512): step 0 adds nothing, step 1 adds receive slot 0, step 2 (the own
// band, the tail output) adds slot 1.
constexpr int kRanks = 3, kChunkRows = 512, kN = 384, kK = 128, kGroupsPerChunk = 2;
constexpr int kM = kRanks * kChunkRows;

// Small integers: A and B in {-1, 0, 1} (|A B| <= K = 128), the slots in [-2, 2], so every sum
// is an integer of at most 130 in magnitude: exact in bf16 (8 significant bits) and fp16 (11).
int AValue(size_t i) { return int((i * 7 + 3) % 3) - 1; }
int BValue(size_t i) { return int((i * 5 + 1) % 3) - 1; }
int SlotValue(size_t i) { return int((i * 11 + 2) % 5) - 2; }

}  // namespace

StuckRingReleaseCheckResult RunStuckRingReleaseCheck(uint32_t epoch_start, ReleaseBy release,
                                                     GemmDtype dtype, double timeout_s) {
  StuckRingReleaseCheckResult r;
  if (dtype != GemmDtype::kBF16 && dtype != GemmDtype::kF16) {
    r.error = "the ring's dtypes are bfloat16 and float16";
    return r;
  }
  const bool bf16 = dtype == GemmDtype::kBF16;
  auto bits = [bf16](int v) { return bf16 ? Bf16Bits(float(v)) : F16Bits(float(v)); };
  const uint32_t e = epoch_start + 1;  // the stuck call's epoch (wraps from 2^32 - 1)
  GpuCheckResources res;
  auto fail = [&](cudaError_t err, const std::string& what) {
    r.error = what + ": " + cudaGetErrorString(err);
    return r;
  };
  cudaError_t err = cudaSetDevice(0);
  if (err != cudaSuccess) return fail(err, "cudaSetDevice");
  const Status prepared = PrepareStreamWait();
  if (!prepared.ok()) {
    r.error = prepared.message();
    return r;
  }
  int cfg = -1;
  for (int i = 0; i < NumGemmConfigs() && cfg < 0; ++i) {
    if (GemmConfigTakesAddends(i) && GemmConfigSupportsDtype(i, dtype) &&
        GetGemmConfig(i).tile_m == 128) {
      cfg = i;
    }
  }
  if (cfg < 0) {
    r.error = "no GEMM config of this dtype with 128-row tiles takes an addend";
    return r;
  }
  const int tile_m = GetGemmConfig(cfg).tile_m;
  const int tiles_chunk = kChunkRows / tile_m;
  const size_t chunk = size_t(kChunkRows) * kN;

  // The stuck rank's flags (rank 0), its sender's (rank 1: kFailedPeer marks its own) and
  // rank 2's (kFailedPeer acknowledges it too); A, B, the GEMM's D (steps 0 and 1), the two
  // receive slots, the output (step 2) and the GEMM's counters.
  CopyEngineFlags* flags[kRanks] = {};
  uint16_t *a = nullptr, *b = nullptr, *d = nullptr, *slots = nullptr, *out = nullptr;
  uint32_t* counters = nullptr;
  void* nan_tile = nullptr;
  for (CopyEngineFlags*& f : flags) {
    if ((err = res.Alloc(&f, sizeof(CopyEngineFlags))) != cudaSuccess) return fail(err, "malloc");
  }
  if ((err = res.Alloc(&a, size_t(kM) * kK * 2)) != cudaSuccess ||
      (err = res.Alloc(&b, size_t(kK) * kN * 2)) != cudaSuccess ||
      (err = res.Alloc(&d, size_t(kM) * kN * 2)) != cudaSuccess ||
      (err = res.Alloc(&slots, 2 * chunk * 2)) != cudaSuccess ||
      (err = res.Alloc(&out, chunk * 2)) != cudaSuccess ||
      (err = res.Alloc(&counters, kMaxGemmGroups * 4)) != cudaSuccess ||
      (err = res.Alloc(&nan_tile, kNanTileBytes)) != cudaSuccess) {
    return fail(err, "cudaMalloc");
  }
  std::vector<uint16_t> h_a(size_t(kM) * kK), h_b(size_t(kK) * kN), h_slots(2 * chunk);
  for (size_t i = 0; i < h_a.size(); ++i) h_a[i] = bits(AValue(i));
  for (size_t i = 0; i < h_b.size(); ++i) h_b[i] = bits(BValue(i));
  for (size_t i = 0; i < h_slots.size(); ++i) h_slots[i] = bits(SlotValue(i));
  // The expected D (steps 0 and 1) and output (step 2): the product plus the slot it adds.
  std::vector<uint16_t> want(size_t(kM) * kN);
  for (int i = 0; i < kM; ++i) {
    for (int j = 0; j < kN; ++j) {
      int sum = 0;
      for (int k = 0; k < kK; ++k) sum += AValue(size_t(i) * kK + k) * BValue(size_t(k) * kN + j);
      if (i >= kChunkRows) sum += SlotValue(size_t(i - kChunkRows) * kN + j);
      want[size_t(i) * kN + j] = bits(sum);
    }
  }
  const std::vector<uint32_t> words(sizeof(CopyEngineFlags) / 4, epoch_start);
  const std::vector<uint16_t> poison(size_t(kM) * kN, 0x1234);
  for (CopyEngineFlags* f : flags) {
    if ((err = cudaMemcpy(f, words.data(), sizeof(CopyEngineFlags), cudaMemcpyHostToDevice)) !=
        cudaSuccess) {
      return fail(err, "setting the flags");
    }
  }
  if ((err = cudaMemcpy(a, h_a.data(), h_a.size() * 2, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaMemcpy(b, h_b.data(), h_b.size() * 2, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaMemcpy(slots, h_slots.data(), h_slots.size() * 2, cudaMemcpyHostToDevice)) !=
          cudaSuccess ||
      (err = cudaMemcpy(d, poison.data(), size_t(kM) * kN * 2, cudaMemcpyHostToDevice)) !=
          cudaSuccess ||
      (err = cudaMemcpy(out, poison.data(), chunk * 2, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaMemset(counters, 0, kMaxGemmGroups * 4)) != cudaSuccess ||
      (err = cudaMemset(nan_tile, 0xFF, kNanTileBytes)) != cudaSuccess) {
    return fail(err, "uploads");
  }
  if ((err = res.CreateStreams()) != cudaSuccess) return fail(err, "streams");

  // The ring's GEMM as SetGemmRing (copy_engine.cc) sets it up for epoch e.
  SignalingGemmArgs gemm;
  gemm.dtype = dtype;
  gemm.m = kM;
  gemm.n = kN;
  gemm.k = kK;
  gemm.a = a;
  gemm.b = b;
  gemm.d = d;
  gemm.config = cfg;
  gemm.num_groups = kRanks * kGroupsPerChunk;
  for (int g = 0; g <= gemm.num_groups; ++g) gemm.group_begin[g] = g * tiles_chunk / 2;
  gemm.counters = counters;
  gemm.addend = slots;
  gemm.addend_first_tile_row = tiles_chunk;
  gemm.addend_flags = RingArrived(flags[0]);
  gemm.addend_flag_value = e;
  gemm.addend_abandoned = Abandoned(flags[0]);
  gemm.addend_nan = nan_tile;  // as the transport's NaN tile (copy_engine_buffers.h)
  gemm.tail_out = out;
  gemm.tail_first_tile_row = (kRanks - 1) * tiles_chunk;
  std::string launch_error;
  if ((err = LoadAllGemmKernels(&launch_error)) != cudaSuccess) {
    return fail(err, "loading the GEMM kernels (" + launch_error + ")");
  }
  if ((err = LaunchSignalingGemm(res.call, gemm, &launch_error)) != cudaSuccess) {
    return fail(err, "the ring GEMM's launch (" + launch_error + ")");
  }
  if ((err = cudaEventRecord(res.done, res.call)) != cudaSuccess) return fail(err, "record");

  r.stuck_before = res.StillRunningAfter(300);

  // The slots' flags: ring_arrived of the groups of slot rows (the sender's steps 0 and 1).
  const int slot_groups = 2 * kGroupsPerChunk;
  // The sender's call, for kFailedPeer: rank 1 of the same ring, whose steps go to rank 0.
  CopyEngineArgs sender;
  sender.ring = true;
  sender.num_groups = gemm.num_groups;
  for (int c = 0; c <= kRanks; ++c) sender.chunk_first_group[c] = c * kGroupsPerChunk;
  const std::vector<FlagRelease> sender_releases =
      FailedCallReleases(sender, kRanks, 1, FailedPart::kWholeCall);
  const auto t0 = std::chrono::steady_clock::now();
  Status wrote = Status::Ok();
  if (release == ReleaseBy::kWatchdog) {
    wrote = EnqueueStuckRankRelease(res.release, flags[0], e);
  } else if (release == ReleaseBy::kFailedPeer) {
    wrote = EnqueueFailedCallWrites(res.release, flags, flags[1], kRanks, 1, sender_releases, e,
                                    nullptr);
  } else {  // the control: the slots' flags as a healthy sender writes them after its copies
    for (int g = 0; g < slot_groups && wrote.ok(); ++g) {
      wrote = EnqueueWriteValue(res.release, RingArrived(flags[0]) + g, e);
    }
  }
  if (!wrote.ok()) {
    r.error = wrote.message();
    return r;
  }
  err = res.AwaitDone(t0, timeout_s, &r.release_ms);
  r.released = err == cudaSuccess;
  if (!r.released) {
    if (err != cudaErrorNotReady) return fail(err, "the stuck GEMM");
    // Still stuck: end its waits so that the check can free its memory.
    for (int g = 0; g < slot_groups; ++g) {
      (void)EnqueueWriteValue(res.release, RingArrived(flags[0]) + g, e);
    }
    return r;
  }
  std::vector<uint16_t> h_d(size_t(kM) * kN), h_out(chunk);
  std::vector<uint32_t> after(words.size());
  if ((err = cudaMemcpy(h_d.data(), d, h_d.size() * 2, cudaMemcpyDeviceToHost)) != cudaSuccess ||
      (err = cudaMemcpy(h_out.data(), out, chunk * 2, cudaMemcpyDeviceToHost)) != cudaSuccess ||
      (err = cudaMemcpy(after.data(), flags[0], sizeof(CopyEngineFlags),
                        cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return fail(err, "download");
  }
  // Step 0 = D's first chunk; the sums = D's second chunk (step 1) and the output (step 2).
  r.first_step_exact = std::equal(h_d.begin(), h_d.begin() + chunk, want.begin());
  std::vector<uint16_t> sums(h_d.begin() + chunk, h_d.begin() + 2 * chunk);
  sums.insert(sums.end(), h_out.begin(), h_out.end());
  r.sums_exact = std::equal(sums.begin(), sums.end(), want.begin() + chunk);
  r.sums_poisoned = std::all_of(sums.begin(), sums.end(), bf16 ? Bf16IsNaN : F16IsNaN);
  auto word = [&](const uint32_t* p) {
    return after[(reinterpret_cast<const char*>(p) - reinterpret_cast<const char*>(flags[0])) / 4];
  };
  bool ok = word(Abandoned(flags[0])) == (release == ReleaseBy::kHealthyPeer ? epoch_start : e);
  for (int g = 0; g < slot_groups; ++g) ok = ok && word(RingArrived(flags[0]) + g) == e;
  r.words_released = ok;
  return r;
}

}  // namespace fo_jax
