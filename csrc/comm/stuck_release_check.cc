// See stuck_release_check.h.
#include "comm/stuck_release_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "comm/copy_engine_flags.h"
#include "comm/copy_engine_watchdog.h"
#include "comm/failed_call.h"
#include "comm/gpu_check_resources.h"
#include "comm/stream_wait.h"
#include "kernels/band_sum.h"

namespace fo_jax {

StuckReleaseCheckResult RunStuckReleaseCheck(uint32_t epoch_start, ReleaseBy release,
                                             int elements, double timeout_s) {
  StuckReleaseCheckResult r;
  if (elements <= 0 || elements % 8 != 0) {
    r.error = "elements must be a positive multiple of 8";
    return r;
  }
  const size_t n = static_cast<size_t>(elements), bytes = n * 2;
  const uint32_t e = epoch_start + 1;  // the stuck call's epoch (wraps from 2^32 - 1)
  GpuCheckResources res;
  auto fail = [&](cudaError_t err, const char* what) {
    r.error = std::string(what) + ": " + cudaGetErrorString(err);
    return r;
  };
  cudaError_t err = cudaSetDevice(0);
  if (err != cudaSuccess) return fail(err, "cudaSetDevice");
  const Status prepared = PrepareStreamWait();
  if (!prepared.ok()) {
    r.error = prepared.message();
    return r;
  }
  std::string launch_error;
  if ((err = LoadBandSumKernels(&launch_error)) != cudaSuccess) return fail(err, "band sums");
  // flags: the stuck rank's (rank 0); peer_own: the failing peer's own (kFailedPeer).
  CopyEngineFlags *flags = nullptr, *peer_own = nullptr;
  uint16_t *own = nullptr, *slot = nullptr, *out = nullptr, *canary = nullptr;
  for (auto [p, size] : {std::pair<void**, size_t>{reinterpret_cast<void**>(&own), bytes},
                         {reinterpret_cast<void**>(&slot), bytes},
                         {reinterpret_cast<void**>(&out), bytes},
                         {reinterpret_cast<void**>(&canary), bytes},
                         {reinterpret_cast<void**>(&flags), sizeof(CopyEngineFlags)},
                         {reinterpret_cast<void**>(&peer_own), sizeof(CopyEngineFlags)}}) {
    if ((err = res.Alloc(p, size)) != cudaSuccess) return fail(err, "cudaMalloc");
  }
  // Small integers: their bf16 sum is exact, so the expected output is known bit for bit.
  std::vector<uint16_t> h_own(n), h_slot(n), h_sum(n), h_canary(n, 0x1234);
  for (size_t i = 0; i < n; ++i) {
    const float a = float(i % 7) + 1, b = float(i % 5) - 2;
    h_own[i] = Bf16Bits(a);
    h_slot[i] = Bf16Bits(b);
    h_sum[i] = Bf16Bits(a + b);
  }
  // Every epoch word at the start; the out table's first entry the canary: an address that an
  // earlier call of the peer left there.
  std::vector<uint32_t> words(sizeof(CopyEngineFlags) / 4, epoch_start);
  const uint64_t stale = reinterpret_cast<uint64_t>(canary);
  for (int q = 0; q < kMaxCopyEngineRanks; ++q) {
    std::memcpy(reinterpret_cast<char*>(words.data()) + offsetof(CopyEngineFlags, out_table) +
                    q * 8,
                &stale, 8);
  }
  const std::pair<void*, const void*> uploads[] = {
      {own, h_own.data()}, {slot, h_slot.data()}, {canary, h_canary.data()}};
  for (auto [dst, src] : uploads) {
    if ((err = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
      return fail(err, "upload");
    }
  }
  if ((err = cudaMemset(out, 0, bytes)) != cudaSuccess ||
      (err = cudaMemcpy(flags, words.data(), sizeof(CopyEngineFlags), cudaMemcpyHostToDevice)) !=
          cudaSuccess ||
      (err = cudaMemcpy(peer_own, words.data(), sizeof(CopyEngineFlags),
                        cudaMemcpyHostToDevice)) != cudaSuccess) {
    return fail(err, "setting the flags");
  }
  if ((err = res.CreateStreams()) != cudaSuccess) return fail(err, "streams");

  // Rank 0 of 2 in an all-reduce: its peer (rank 1) owes out_ready[1] (with the address),
  // arrived[0] and a piece of the last band, stored[1] and the acknowledgement recv_acked[1].
  Status enqueued = EnqueueWaitGeq(res.call, OutReady(flags) + 1, e);
  const void* parts[2] = {own, slot};
  RemoteOutputs remote;
  remote.table = OutTable(flags);
  remote.count = 1;
  remote.abandoned = Abandoned(flags);
  remote.epoch = e;
  const ArrivalWait wait{Arrived(flags), 1, e, LastPieces(flags)};
  if (enqueued.ok()) {
    enqueued = LaunchStatus(
        LaunchBandSum(res.call, GemmDtype::kBF16, parts, 2, out, n, &launch_error, 0, remote,
                      wait),
        "band sum", launch_error);
  }
  if (enqueued.ok()) enqueued = EnqueueWaitGeq(res.call, Stored(flags) + 1, e);
  if (enqueued.ok()) enqueued = EnqueueWaitGeq(res.call, RecvAcked(flags) + 1, e);
  if (!enqueued.ok()) {
    r.error = enqueued.message();
    return r;
  }
  if ((err = cudaEventRecord(res.done, res.call)) != cudaSuccess) return fail(err, "record");

  r.stuck_before = res.StillRunningAfter(300);

  // The words this call waits for, as its peer (rank 1) writes them.
  uint32_t* const awaited[] = {OutReady(flags) + 1, Arrived(flags), LastPieces(flags),
                               Stored(flags) + 1, RecvAcked(flags) + 1};
  // The peer's call, for kFailedPeer: an all-reduce over 2 ranks, one round, the direct form,
  // its one sent chunk summed by rows (so it owes the piece and the step's flag), its output
  // (the address it gives rank 0) the canary.
  CopyEngineArgs peer_call;
  peer_call.all_reduce = true;
  peer_call.sum_split = SumSplit::kByRows;
  peer_call.num_groups = 2;
  peer_call.chunk_first_group[1] = 1;
  peer_call.chunk_first_group[2] = 2;
  peer_call.out = canary;
  const std::vector<FlagRelease> peer_releases =
      FailedCallReleases(peer_call, 2, 1, FailedPart::kWholeCall);
  CopyEngineFlags* const peer_flags[2] = {flags, peer_own};
  const auto t0 = std::chrono::steady_clock::now();
  Status wrote = Status::Ok();
  if (release == ReleaseBy::kWatchdog) {
    wrote = EnqueueStuckRankRelease(res.release, flags, e);
  } else if (release == ReleaseBy::kFailedPeer) {
    const uint64_t canary_at[2] = {reinterpret_cast<uint64_t>(canary),
                                   reinterpret_cast<uint64_t>(canary)};
    wrote = EnqueueFailedCallWrites(res.release, peer_flags, peer_own, 2, 1, peer_releases, e,
                                    canary_at);
  } else {  // the control: the awaited words as a healthy peer writes them
    for (uint32_t* word : awaited) {
      if (wrote.ok()) wrote = EnqueueWriteValue(res.release, word, e);
    }
  }
  if (!wrote.ok()) {
    r.error = wrote.message();
    return r;
  }
  err = res.AwaitDone(t0, timeout_s, &r.release_ms);
  r.released = err == cudaSuccess;
  if (!r.released) {
    if (err != cudaErrorNotReady) return fail(err, "the stuck call");
    // Still stuck: end the waits so that the check can free its memory.
    for (uint32_t* word : awaited) (void)EnqueueWriteValue(res.release, word, e);
    return r;
  }
  std::vector<uint16_t> h_out(n), h_canary_after(n);
  std::vector<uint32_t> after(words.size()), peer_after(words.size());
  if ((err = cudaMemcpy(h_out.data(), out, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
      (err = cudaMemcpy(h_canary_after.data(), canary, bytes, cudaMemcpyDeviceToHost)) !=
          cudaSuccess ||
      (err = cudaMemcpy(after.data(), flags, sizeof(CopyEngineFlags), cudaMemcpyDeviceToHost)) !=
          cudaSuccess ||
      (err = cudaMemcpy(peer_after.data(), peer_own, sizeof(CopyEngineFlags),
                        cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return fail(err, "download");
  }
  r.sum_equal = h_out == h_sum;
  r.out_poisoned = std::all_of(h_out.begin(), h_out.end(), Bf16IsNaN);
  r.canary_untouched = h_canary_after == h_canary;
  if (release == ReleaseBy::kHealthyPeer) return r;
  // Which words of rank 0's flags the release must have set to e; every other epoch word
  // (not the out table's addresses) must still read epoch_start.
  std::vector<bool> released(words.size(), false);
  auto index_of = [&](const CopyEngineFlags* base, const uint32_t* word) {
    return (reinterpret_cast<const char*>(word) - reinterpret_cast<const char*>(base)) / 4;
  };
  released[index_of(flags, Abandoned(flags))] = true;
  if (release == ReleaseBy::kWatchdog) {
    OwedWords owed[kOwedRuns];
    WordsPeersOwe(flags, owed);
    for (const OwedWords& run : owed) {
      for (int i = 0; i < run.count; ++i) released[index_of(flags, run.first + i)] = true;
    }
  } else {
    for (const FlagRelease& pr : peer_releases) {
      released[index_of(flags, FlagWordAddress(flags, pr))] = true;
    }
  }
  const size_t table_begin = offsetof(CopyEngineFlags, out_table) / 4;
  const size_t table_end = table_begin + sizeof(CopyEngineFlags::out_table) / 4;
  bool ok = true;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i >= table_begin && i < table_end) continue;
    ok = ok && after[i] == (released[i] ? e : epoch_start);
  }
  if (release == ReleaseBy::kFailedPeer) {
    // The failing peer marks its own flags too and says its own copies are done.
    ok = ok && peer_after[index_of(peer_own, Abandoned(peer_own))] == e &&
         peer_after[index_of(peer_own, OwnCopies(peer_own))] == e;
  }
  r.words_released = ok;
  return r;
}

}  // namespace fo_jax
