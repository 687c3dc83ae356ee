// See peer_transport.h.
#include "comm/peer_transport.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/peer_copies.h"
#include "comm/stream_wait.h"
#include "kernels/band_sum.h"

namespace fo_jax {
namespace {

struct PeerInfo {
  uint64_t recv;
  uint64_t sync;
  int32_t pid;
  int32_t device;
};

std::string CreatePeerState(CommState& s) {
  auto p = std::make_shared<PeerState>();
  int least = 0, greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&p->copy_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&p->sum_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&p->flag_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->sums_done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->flag_event, cudaEventDisableTiming);
  for (int i = 0; i < PeerState::kCallEvents && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&p->inputs_ready[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->sums_ended[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    return CudaMessage("creating the copy, flag and sum streams and their events", e);
  }
  constexpr size_t sync_bytes = kSyncRegions * kMaxPeerRanks * sizeof(uint32_t);
  e = cudaMalloc(&p->sync, sync_bytes);
  if (e == cudaSuccess) e = cudaMalloc(&p->exchange, kMaxPeerRanks * sizeof(PeerInfo));
  if (e != cudaSuccess) return CudaMessage("allocating the copy-engine flags", e);
  e = cudaMemsetAsync(p->sync, 0, sync_bytes, s.stream);
  if (e != cudaSuccess) return CudaMessage("zeroing the copy-engine flags", e);
  std::string err;
  if (LoadBandSumKernels(&err) != cudaSuccess) return err;
  // At exit, before the CUDA runtime's own teardown (registered earlier, so run later): let the
  // copy threads finish enqueueing (they may still be sending a last call's acks).
  static std::once_flag at_exit_once;
  std::call_once(at_exit_once, [] {
    std::atexit([] {
      for (CommState* state : AllCommStatesForDebug()) {
        if (state->peer && state->peer->copy_thread) {
          (void)state->peer->copy_thread->DrainFor(std::chrono::seconds(1));
        }
      }
    });
  });
  p->copy_thread = std::make_unique<HostWorker>(s.device);
  s.peer = std::move(p);
  return "";
}

// Enqueues on `stream`: wait until every peer q has Region(this rank's sync, region)[q] >= e.
cudaError_t WaitForPeers(PeerState& p, cudaStream_t stream, PeerSyncRegion region, int P, int me,
                         uint32_t e, std::string* error) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    cudaError_t err = EnqueueWaitGeq(stream, Region(p.sync, region) + q, e, error);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t Join(cudaStream_t xla_stream, cudaEvent_t done, std::string* error) {
  cudaError_t err = cudaStreamWaitEvent(xla_stream, done, 0);
  if (err != cudaSuccess) *error = "joining a copy stream into XLA's stream";
  return err;
}

// The last round's band sums on XLA's stream, after the GEMM (whose last chunk is this rank's
// own): out = own chunk + the P - 1 received ones (slots, consecutive from `slots`), in the
// passes a.sum_split asks for (PeerCollectiveArgs). Each pass waits for its arrival flags inside
// the kernel, the last one also for this rank's own copies (they read XLA's workspace:
// band_sum.h); an all-reduce's passes also store their rows at the peers (`remote`).
cudaError_t EnqueueLastRoundSums(CommState& s, cudaStream_t stream, const PeerCollectiveArgs& a,
                                 uint32_t e, const char* own, char* out, const char* slots,
                                 RemoteOutputs remote, std::string* error) {
  PeerState& p = *s.peer;
  const int P = s.nranks, h = a.rounds - 1;
  const size_t chunk_elems = a.band_elems / a.rounds;
  const size_t chunk_bytes = chunk_elems * 2;
  const uint32_t* arrived = Region(p.sync, kArrived) + Slot(P, h, 0);
  const uint32_t* own_copies = Region(p.sync, kOwnCopies);
  using Split = SumSplit;
  const int L = LastSentChunk(P, a.rounds);
  const int pieces = a.chunk_first_group[L + 1] - a.chunk_first_group[L];
  Split split = a.sum_split;
  if ((split == Split::kByBands && P == 2) || (split == Split::kByRows && pieces == 1)) {
    split = Split::kOnePass;  // the same passes
  }
  const void* parts[kMaxPeerRanks];
  cudaError_t err = cudaSuccess;
  if (split == Split::kByRows) {
    // One pass of every part per piece of the last chunk (its groups), each once that piece
    // has landed; the first also waits for the other slots, the last for the own copies.
    const uint32_t* piece_flags = Region(p.sync, kLastPieces);
    for (int k = 0; k < pieces; ++k) {
      const int g = a.chunk_first_group[L] + k;
      const size_t off = size_t(a.group_begin[g] - L * a.tiles_chunk) * a.tile_row_elems;
      const size_t count = size_t(a.group_begin[g + 1] - a.group_begin[g]) * a.tile_row_elems;
      parts[0] = own + off * 2;
      for (int j = 0; j + 1 < P; ++j) parts[j + 1] = slots + j * chunk_bytes + off * 2;
      const ArrivalWait wait =
          k == 0 ? ArrivalWait{arrived, P - 2, e, piece_flags}
                 : ArrivalWait{piece_flags + k, 1, e, k + 1 == pieces ? own_copies : nullptr};
      RemoteOutputs rows = remote;
      rows.offset_bytes += off * 2;
      err = LaunchBandSum(stream, a.dtype, parts, P, out + off * 2, count, error, 0, rows,
                          wait, /*from_end=*/true);
      if (err != cudaSuccess) return err;
      if (k == 0 || k + 1 == pieces) {
        RecordTimelineMark(s, k == 0 ? kFirstSumEnd : kSecondSumEnd, stream);
      }
    }
    return cudaSuccess;
  }
  // kOnePass: every part once all have landed. kByBands: the chunks already there while the
  // last one is in flight, then out += last chunk (at 8192x8192x2048 the last copy ended ~30 us
  // after the GEMM; when the copies end with the GEMM one pass moves fewer bytes).
  const bool bands = split == Split::kByBands;
  const int early = bands ? P - 2 : P - 1;  // received chunks summed in the first pass
  parts[0] = own;
  for (int j = 0; j < early; ++j) parts[j + 1] = slots + j * chunk_bytes;
  // The first pass sweeps from the band's end: the GEMM wrote the own chunk's last rows last, so
  // they are the likeliest still in L2; the second pass then starts where the first ended.
  err = LaunchBandSum(stream, a.dtype, parts, early + 1, out, chunk_elems, error, 0,
                      bands ? RemoteOutputs{} : remote,
                      ArrivalWait{arrived, early, e, bands ? nullptr : own_copies},
                      /*from_end=*/true);
  if (err != cudaSuccess) return err;
  RecordTimelineMark(s, kFirstSumEnd, stream);
  if (!bands) return cudaSuccess;
  // out = out + last chunk, elementwise in place (each element read before it is written, by
  // the same thread).
  const void* last[2] = {out, slots + (P - 2) * chunk_bytes};
  err = LaunchBandSum(stream, a.dtype, last, 2, out, chunk_elems, error, 0, remote,
                      ArrivalWait{arrived + P - 2, 1, e, own_copies});
  if (err != cudaSuccess) return err;
  RecordTimelineMark(s, kSecondSumEnd, stream);
  return cudaSuccess;
}

}  // namespace

std::string PreparePeerTransport(CommState& s, size_t recv_bytes) {
  if (cudaSetDevice(s.device) != cudaSuccess) return "cudaSetDevice";
  if (!s.peer) {
    std::string err = CreatePeerState(s);
    if (!err.empty()) return err;
  }
  PeerState& p = *s.peer;
  if (p.recv_bytes >= recv_bytes) return "";
  // Every rank grows in the same call (same shapes), so every rank joins this exchange. The old
  // buffer stays allocated (cudaFree would synchronize the device while other work may be in
  // flight); doubling bounds how often that happens.
  const size_t capacity = std::max(recv_bytes, 2 * p.recv_bytes);
  void* recv = nullptr;
  cudaError_t e = cudaMalloc(&recv, capacity);
  if (e != cudaSuccess) {
    return CudaMessage(("allocating " + std::to_string(capacity >> 20) +
                 " MiB for the copy-engine receive buffer (outside XLA's memory pool; lower "
                 "XLA_PYTHON_CLIENT_MEM_FRACTION or use OverlapConfig(transport='nccl'))").c_str(),
                e);
  }
  p.recv = recv;
  p.recv_bytes = capacity;
  PeerInfo mine{reinterpret_cast<uint64_t>(p.recv), reinterpret_cast<uint64_t>(p.sync),
                static_cast<int32_t>(getpid()), s.device};
  auto* slots = static_cast<PeerInfo*>(p.exchange);
  std::vector<PeerInfo> all(s.nranks);
  e = cudaMemcpyAsync(slots + s.rank, &mine, sizeof(PeerInfo), cudaMemcpyHostToDevice, s.stream);
  if (e != cudaSuccess) return CudaMessage("address exchange", e);
  ncclResult_t r = ncclAllGather(slots + s.rank, slots, sizeof(PeerInfo), ncclUint8, s.comm,
                                 s.stream);
  if (r != ncclSuccess) {
    return std::string("address exchange (ncclAllGather): ") + ncclGetErrorString(r);
  }
  e = cudaMemcpyAsync(all.data(), slots, s.nranks * sizeof(PeerInfo), cudaMemcpyDeviceToHost,
                      s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  if (e != cudaSuccess) return CudaMessage("address exchange", e);
  for (int q = 0; q < s.nranks; ++q) {
    if (q == s.rank) continue;
    if (all[q].pid != mine.pid) {
      return "the copy-engine transport needs every rank in one process (rank " +
             std::to_string(q) + " is in another); use OverlapConfig(transport='nccl')";
    }
    int ok = 0;
    e = cudaDeviceCanAccessPeer(&ok, s.device, all[q].device);
    if (e != cudaSuccess || !ok) {
      return "GPU " + std::to_string(s.device) + " cannot access GPU " +
             std::to_string(all[q].device) + " directly (no peer access); use "
             "OverlapConfig(transport='nccl')";
    }
    e = cudaDeviceEnablePeerAccess(all[q].device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else if (e != cudaSuccess) {
      return CudaMessage("enabling peer access", e);
    }
    p.peer_recv[q] = reinterpret_cast<void*>(all[q].recv);
    p.peer_sync[q] = reinterpret_cast<uint32_t*>(all[q].sync);
  }
  return "";
}

void SetPeerGroups(PeerCollectiveArgs& a, const OverlapPlan& plan, size_t tile_row_elems) {
  const GemmPlan& g = plan.gemm;
  const int chunks = plan.rounds * plan.axis_size;
  a.rounds = plan.rounds;
  a.ring = plan.ring;
  a.sum_split = plan.sum_split;
  for (int c = 0; c <= chunks; ++c) a.chunk_first_group[c] = ChunkFirstGroup(g, plan.tiles_chunk, c);
  a.num_groups = g.num_groups;
  std::copy(g.group_begin, g.group_begin + g.num_groups + 1, a.group_begin);
  a.tiles_chunk = plan.tiles_chunk;
  a.tile_row_elems = tile_row_elems;
}

std::string PeerAccessProblem(const std::vector<int>& ordinals) {
  for (int a : ordinals) {
    for (int b : ordinals) {
      if (a == b) continue;
      int ok = 0;
      cudaError_t e = cudaDeviceCanAccessPeer(&ok, a, b);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return CudaMessage("cudaDeviceCanAccessPeer", e);
      }
      if (!ok) return "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b);
    }
  }
  return "";
}

void SetGemmRing(CommState& s, const PeerCollectiveArgs& a, int tiles_chunk,
                 SignalingGemmArgs& gemm) {
  if (!a.ring) return;
  const int P = s.nranks;
  PeerState& p = *s.peer;
  // Receive slot j holds rank r + 1's step j, whose logical rows are this rank's step j + 1
  // rows minus one chunk; its groups are flagged by the sender's group index, which is the
  // group of the source rows in the shared group table (SignalingGemmArgs::addend_flags).
  gemm.addend = p.recv;
  gemm.addend_first_tile_row = tiles_chunk;
  gemm.addend_flags = Region(p.sync, kRingArrived);
  gemm.addend_flag_value = p.epoch + 1;  // EnqueuePeerCollective's ++p.epoch
  gemm.tail_out = a.out;
  gemm.tail_first_tile_row = (P - 1) * tiles_chunk;
}

std::string EnsurePeerCopyGraphs(CommState& s, const PeerCollectiveArgs& a) {
  if (!s.peer) return "copy graphs before PreparePeerTransport";
  std::string error;
  if (EnsureCopyGraphs(s, CopyJobFor(*s.peer, a), &error) != cudaSuccess) return error;
  return "";
}

cudaEvent_t NextPeerInputsEvent(CommState& s) {
  PeerState& p = *s.peer;
  p.copy_thread->WaitPending(PeerState::kCallEvents - 1);
  return p.inputs_ready[(p.epoch + 1) % PeerState::kCallEvents];
}

void DrainPeerCopyThread(CommState& s) {
  if (s.peer) s.peer->copy_thread->Drain();
}

std::string PeerCopyFailure(CommState& s) {
  if (!s.peer) return "";
  std::lock_guard<std::mutex> lock(s.peer->failure_mu);
  return s.peer->copy_failure;
}

cudaError_t EnqueuePeerCollective(CommState& s, cudaStream_t xla_stream,
                                  const PeerCollectiveArgs& a, std::string* error) {
  // The plan was validated (overlap_plan.h); this enqueues it.
  const int P = s.nranks, me = s.rank, H = a.rounds;
  const size_t band_bytes = a.band_elems * 2;
  if (!s.peer || s.peer->recv_bytes < (P - 1) * band_bytes) {
    *error = "copy-engine transport used before PreparePeerTransport";
    return cudaErrorInvalidValue;
  }
  PeerState& p = *s.peer;
  const uint32_t e = ++p.epoch;
  p.last_counters = a.counters;
  p.last_num_groups = a.num_groups;
  std::copy(a.expected, a.expected + a.num_groups, p.last_expected);
  uint32_t* arrived = Region(p.sync, kArrived);
  const size_t chunk_elems = a.band_elems / H;
  const size_t chunk_bytes = chunk_elems * 2;
  const char* ws = static_cast<const char*>(a.workspace);
  char* recv = static_cast<char*>(p.recv);
  auto chunk = [&](int h, int b) { return ChunkOffset(P, h, b, chunk_bytes); };

  CopyJob job = CopyJobFor(p, a);
  job.epoch = e;
  job.row = TimelineRowOfCall(s);
  job.inputs_ready = p.inputs_ready[e % PeerState::kCallEvents];
  job.sums_ended = p.sums_ended[e % PeerState::kCallEvents];
  cudaError_t err = cudaSuccess;
  // The copy thread waits for this call's signal before its acknowledgements (after the
  // sums_ended record below); every way out of this function gives it.
  struct SignalOnExit {
    HostWorker* worker;
    uint32_t epoch;
    ~SignalOnExit() {
      if (worker) worker->Signal(epoch);
    }
  } signal_on_exit{p.copy_thread.get(), e};
  p.copy_thread->Push([&s, job] { RunCopyJob(s, job); });
  RecordTimelineHost(s, kHostCopiesEnqueued);

  // An all-reduce's sums also store the summed chunk into the same rows of every peer's output.
  RemoteOutputs remote;
  if (a.all_reduce) {
    remote.table = OutTable(p.sync);
    remote.count = P - 1;
  }
  auto own_out = [&](int h) {
    return a.all_reduce ? static_cast<char*>(a.out) + chunk(h, me) : a.out;
  };

  // Rounds before the last, on the sum stream (all-reduce): once the own chunk and the P - 1
  // received ones are there, one pass sums them and stores the result here and at the peers.
  if (H > 1) {
    cudaStream_t ss = p.sum_stream;
    err = cudaStreamWaitEvent(ss, job.inputs_ready, 0);
    if (err != cudaSuccess) {
      *error = "sum stream waiting for XLA's inputs";
      return err;
    }
    err = WaitForPeers(p, ss, kOutReady, P, me, e, error);
    if (err != cudaSuccess) return err;
    for (int h = 0; h + 1 < H; ++h) {
      const int own = h * P + P - 1;  // logical chunk (h, step P - 1)
      for (int g = a.chunk_first_group[own]; g < a.chunk_first_group[own + 1]; ++g) {
        err = EnqueueWaitGeq(ss, a.counters + g, a.expected[g], error);
        if (err != cudaSuccess) return err;
      }
      const void* parts[kMaxPeerRanks];
      parts[0] = ws + chunk(h, me);
      for (int j = 0; j + 1 < P; ++j) {
        err = EnqueueWaitGeq(ss, arrived + Slot(P, h, j), e, error);
        if (err != cudaSuccess) return err;
        parts[j + 1] = recv + Slot(P, h, j) * chunk_bytes;
      }
      remote.offset_bytes = chunk(h, me);
      // A full grid, not one sized to the free SMs: blocks wait for SMs, so the sum speeds up
      // as soon as the GEMM ends (capped at the 8 free SMs, round 0 of 8192x8192x2048 ran
      // until after the last round's sum: results/overlap_profile_tp4_2026-11-21_fa98730.log).
      err = LaunchBandSum(ss, a.dtype, parts, P, own_out(h), chunk_elems, error, 0, remote);
      if (err != cudaSuccess) return err;
    }
    err = cudaEventRecord(p.sums_done, ss);
    if (err != cudaSuccess) {
      *error = "recording the round sums' completion";
      return err;
    }
  }

  // The last round on XLA's stream, after the GEMM.
  const int h = H - 1;
  RecordTimelineMark(s, kGemmEnd, xla_stream);
  if (a.ring) {
    // The GEMM summed and stored the own band; the call ends once this rank's copies, which
    // read the workspace, are done (their last group lands about when the GEMM ends).
    err = EnqueueWaitGeq(xla_stream, Region(p.sync, kOwnCopies), e, error);
    if (err != cudaSuccess) return err;
  } else {
    if (a.all_reduce) {
      err = WaitForPeers(p, xla_stream, kOutReady, P, me, e, error);
      if (err != cudaSuccess) return err;
      remote.offset_bytes = chunk(h, me);
    }
    err = EnqueueLastRoundSums(s, xla_stream, a, e, ws + chunk(h, me),
                               static_cast<char*>(own_out(h)),
                               recv + Slot(P, h, 0) * chunk_bytes, remote, error);
    if (err != cudaSuccess) return err;
    if (H > 1) {
      err = Join(xla_stream, p.sums_done, error);
      if (err != cudaSuccess) return err;
    }
  }
  // The receive slots are free again once this is reached (the band sums, or the ring's GEMM,
  // have read them): the copy stream acknowledges.
  err = cudaEventRecord(job.sums_ended, xla_stream);
  if (err != cudaSuccess) {
    *error = "recording the band sums' end for the acknowledgements";
    return err;
  }
  if (a.all_reduce) {
    err = TellPeers(job.peer_sync, xla_stream, kStored, P, me, e, error);
    if (err != cudaSuccess) return err;
    // An all-reduce is done when every peer's summed band has landed in this rank's output.
    err = WaitForPeers(p, xla_stream, kStored, P, me, e, error);
    if (err != cudaSuccess) return err;
  }
  RecordTimelineMark(s, kCallEnd, xla_stream);
  return cudaSuccess;
}

PeerCopyCounts CountPeerCopies(CommState& s) {
  std::lock_guard<std::timed_mutex> lock(s.mu);
  if (!s.peer) return {};
  DrainPeerCopyThread(s);  // the calls made so far have enqueued their copies
  return {s.peer->copies.load(), s.peer->graphs_built.load(), s.peer->updates.load()};
}

std::string DescribePeerStateForDebug(CommState& s) {
  std::string text = "GPU " + std::to_string(s.device) + " rank " + std::to_string(s.rank) + "/" +
                     std::to_string(s.nranks);
  std::unique_lock<std::timed_mutex> lock(s.mu, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::milliseconds(200))) text += " [a call holds mu]";
  if (!s.peer) return text + " (no copy-engine state)";
  PeerState& p = *s.peer;
  text += " epoch " + std::to_string(p.epoch) + ", " + std::to_string(p.copies.load()) +
          " copies, " + std::to_string(p.graphs_built.load()) + " copy graphs built";
  {
    std::lock_guard<std::mutex> failure_lock(p.failure_mu);
    if (!p.copy_failure.empty()) text += " [" + p.copy_failure + "]";
  }
  // Read on a stream of its own into pinned memory kept for this (never freed: cudaFreeHost
  // and cudaStreamDestroy wait for the GPU to drain, which a hung GPU never does). The reads
  // are cudaMemcpyAsync calls, which block while another thread waits for this GPU to drain
  // with a driver lock held (NOTES §13): the caller reads on a thread it can abandon.
  static std::mutex reader;
  std::unique_lock<std::mutex> one_reader(reader, std::try_to_lock);
  if (!one_reader.owns_lock()) return text + " (another read is in progress)";
  constexpr size_t words = kSyncRegions * kMaxPeerRanks;
  const int groups = p.last_counters ? p.last_num_groups : 0;
  if (cudaSetDevice(s.device) != cudaSuccess) return text + " (cudaSetDevice failed)";
  if (!p.debug_host &&
      cudaHostAlloc(reinterpret_cast<void**>(&p.debug_host), (words + kMaxGemmGroups) * 4,
                    cudaHostAllocDefault) != cudaSuccess) {
    p.debug_host = nullptr;
  }
  if (p.debug_host && !p.debug_stream &&
      cudaStreamCreateWithFlags(&p.debug_stream, cudaStreamNonBlocking) != cudaSuccess) {
    p.debug_stream = nullptr;
  }
  uint32_t* host = p.debug_host;
  if (!host || !p.debug_stream ||
      cudaMemcpyAsync(host, p.sync, words * 4, cudaMemcpyDeviceToHost, p.debug_stream) !=
          cudaSuccess ||
      (groups > 0 && cudaMemcpyAsync(host + words, p.last_counters, groups * 4,
                                     cudaMemcpyDeviceToHost, p.debug_stream) != cudaSuccess)) {
    (void)cudaGetLastError();
    return text + " (flags: CUDA call failed)";
  }
  bool done = false;
  for (int i = 0; i < 100 && !done; ++i) {
    done = cudaStreamQuery(p.debug_stream) == cudaSuccess;
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!done) return text + " (flags: the read did not finish within a second)";
  auto list = [&](const char* name, const uint32_t* v, int n) {
    text += std::string(" ") + name + "[";
    for (int i = 0; i < n; ++i) text += (i ? "," : "") + std::to_string(v[i]);
    text += "]";
  };
  const int P = s.nranks;
  list("arrived", host + kArrived * kMaxPeerRanks, 4 * (P - 1));  // every slot rounds <= 4 use
  list("acked", host + kRecvAcked * kMaxPeerRanks, P);
  list("stored", host + kStored * kMaxPeerRanks, P);
  list("out_ready", host + kOutReady * kMaxPeerRanks, P);
  list("own_copies", host + kOwnCopies * kMaxPeerRanks, 1);
  list("last_pieces", host + kLastPieces * kMaxPeerRanks, kMaxPeerRanks);
  list("ring_arrived", host + kRingArrived * kMaxPeerRanks, std::max(groups, 1));
  if (groups > 0) {  // the latest call's GEMM progress (XLA may have reused the memory since)
    list("last_call_counters", host + words, groups);
    list("of", p.last_expected, groups);
  }
  return text;
}

}  // namespace fo_jax
