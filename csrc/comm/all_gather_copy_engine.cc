// See all_gather_copy_engine.h.
#include "comm/all_gather_copy_engine.h"

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/ag_exchange.h"
#include "comm/copy_engine_graphs.h"
#include "comm/device_memory.h"
#include "comm/host_worker.h"
#include "comm/nan_fill.h"
#include "comm/stream_wait.h"
#include "comm/test_failures.h"

namespace fo_jax {
namespace {

// "Call started" events per rank, reused round-robin: rank r re-records slot e % kRing for call e
// only once every peer's copy thread has enqueued its wait on call e - kRing's.
constexpr int kRing = kAgRing;
static_assert(kAgMaxRanks == kMaxCopyEngineRanks, "the exchange holds every rank of a group");
static_assert(sizeof(cudaIpcEventHandle_t) == kAgEventHandleBytes, "an event's IPC handle");
// A host wait on a peer (its entry, or its copy thread's progress) longer than this fails the
// call: the peer stopped calling (a rank that failed, or a program whose ranks disagree). The
// progress watchdog's limit where one is set (FO_JAX_COMM_TIMEOUT_S), else 300 s.
std::chrono::milliseconds PeerTimeout() {
  const double limit = CommTimeoutSeconds();
  return std::chrono::milliseconds(limit > 0 ? static_cast<int64_t>(limit * 1000) : 300000);
}

// What rank r published for its call `epoch`, as this process uses it (its AgEntry's addresses,
// which are this process's: every rank of the group is in it).
struct Entry {
  uint32_t epoch = 0;
  void* gathered = nullptr;
  uint32_t* flags = nullptr;
  cudaEvent_t started = nullptr;
  int device = -1;  // its local ordinal
};

Entry FromShared(const AgEntry& a) {
  return Entry{a.epoch, reinterpret_cast<void*>(a.gathered), reinterpret_cast<uint32_t*>(a.flags),
               reinterpret_cast<cudaEvent_t>(a.event), a.device};
}

AgEntry ToShared(const Entry& e) {
  AgEntry a;
  a.epoch = e.epoch;
  a.device = e.device;
  a.gathered = reinterpret_cast<uint64_t>(e.gathered);
  a.flags = reinterpret_cast<uint64_t>(e.flags);
  a.event = reinterpret_cast<uint64_t>(e.started);
  return a;
}

using Exchange = AgExchange;

// One rank's copy-engine all-gather state (created on first use, never destroyed: its streams,
// events and device word may be in use by queued work).
struct AgState {
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t started[kRing] = {};
  uint32_t* copies_done = nullptr;  // device word: the latest call whose copies all ended
  uint32_t epoch = 0;               // calls made (under the communicator's lock)
  CopyGraphs graphs;
  bool peer_ready[kMaxCopyEngineRanks] = {};  // peer access enabled towards that rank's GPU
  std::shared_ptr<Exchange> exchange;  // the group's (ag_exchange.h)
  std::unique_ptr<HostWorker> worker;
  std::mutex failure_mu;
  std::string failure;  // the copy thread's first failure
};

std::mutex& RegistryMu() {
  static auto* mu = new std::mutex();
  return *mu;
}

// Creates this rank's state (streams, events, the device word) on its first call.
Status CreateAgState(CommState& state, cudaStream_t xla_stream, AgState& s) {
  if (TestFailureAt(FailStage::kSetup, state.rank)) {
    return Status::Internal("creating the copy-engine all-gather's state failed " +
                            InjectedFailureMessage(FailStage::kSetup));
  }
  cudaError_t err = cudaSuccess;
  int least = 0, greatest = 0;
  err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (err == cudaSuccess) {
    err = cudaStreamCreateWithPriority(&s.copy_stream, cudaStreamNonBlocking, greatest);
  }
  for (int i = 0; i < kRing && err == cudaSuccess; ++i) {
    err = cudaEventCreateWithFlags(&s.started[i], cudaEventDisableTiming);
  }
  FO_JAX_RETURN_IF_ERROR(CudaStatus(err, "creating the copy-engine all-gather's state"));
  // Now, not at a failure: releases fill the bands that will not come with NaNs from it.
  FO_JAX_RETURN_IF_ERROR(PrepareNanFill());
  FO_JAX_RETURN_IF_ERROR(DeviceAlloc(state.device, "copy-engine all-gather word",
                                     sizeof(uint32_t), reinterpret_cast<void**>(&s.copies_done)));
  // Zero in XLA's stream order, before the first call's "call started", which the copy stream
  // waits on before it writes the word (no device synchronization: peers may be mid-call).
  return CudaStatus(cudaMemsetAsync(s.copies_done, 0, sizeof(uint32_t), xla_stream),
                    "creating the copy-engine all-gather's state");
}

Status GetAgState(CommState& state, cudaStream_t xla_stream, AgState** out) {
  static auto* states = new std::map<const CommState*, std::unique_ptr<AgState>>();
  static auto* exchanges = new std::map<const CommGroup*, std::shared_ptr<Exchange>>();
  std::lock_guard<std::mutex> lock(RegistryMu());
  auto it = states->find(&state);
  if (it != states->end()) {
    *out = it->second.get();
    return Status::Ok();
  }
  // The group's exchange first: a rank that cannot create its state fails the exchange, so its
  // peers' waits for its entries end at once (not after PeerTimeout()) and every rank's call
  // raises. It retries on its next call; the exchange stays failed.
  std::shared_ptr<Exchange>& ex = (*exchanges)[state.group.get()];
  if (!ex) {
    ex = std::shared_ptr<Exchange>(AgExchange::CreateLocal(state.nranks));
    if (!ex) return Status::Internal("creating the copy-engine all-gather's exchange failed");
  }
  auto s = std::make_unique<AgState>();
  const Status created = CreateAgState(state, xla_stream, *s);
  if (!created.ok()) {
    ex->Fail("rank " + std::to_string(state.rank) + " of the group could not create its "
             "copy-engine all-gather state: " + created.message());
    return created;
  }
  s->exchange = ex;
  s->worker = std::make_unique<HostWorker>(state.device);
  *out = s.get();
  (*states)[&state] = std::move(s);
  return Status::Ok();
}

// Waits on the host until rank q's entry for call e is there; its copy, or the failure. On a
// failure rank `me` gives up on q for call e (the exchange's `released`): the caller must then
// set its own flags of q's bands.
Status AwaitEntry(Exchange& ex, int me, int q, uint32_t e, Entry* out) {
  AgEntry got;
  const std::string failed = ex.AwaitEntry(me, q, e, PeerTimeout(), &got);
  if (!failed.empty()) return Status::Internal(failed);
  *out = FromShared(got);
  return Status::Ok();
}

void Fail(AgState& ag, const Status& status) {
  std::lock_guard<std::mutex> lock(ag.failure_mu);
  if (ag.failure.empty()) ag.failure = "copy-engine all-gather: " + status.message();
}

struct Job {
  int P = 0, me = 0;
  uint32_t epoch = 0;
  const char* x = nullptr;
  char* own_gathered = nullptr;   // this call's gathered output (this rank's GEMM reads it)
  uint32_t* own_flags = nullptr;  // this call's band flags (this rank's GEMM waits for them)
  cudaEvent_t own_started = nullptr;
  AllGatherBands bands;
  size_t band_bytes = 0;
};

// The copy thread's part of call job.epoch: a wait for this rank's own "call started" (x is
// ready), then per step s rank me + s's entry, a wait for its "call started", then this rank's
// bands into its gathered rows, each followed by its flag. After a failure it still releases
// every peer whose entry it gets (EnqueueBandRelease: that peer's GEMM waits for the flags, and
// its rows from this rank read as NaNs) and writes the copies_done word (XLA's stream waits for
// it).
void RunJob(AgState& ag, const Job& job) {
  Exchange& ex = *ag.exchange;
  const Status own_ready = CudaStatus(cudaStreamWaitEvent(ag.copy_stream, job.own_started, 0),
                                      "waiting for this rank's inputs");
  Status status = own_ready;
  if (status.ok() && TestFailureAt(FailStage::kCopy, job.me)) {
    status = Status::Internal("enqueueing the copies failed " +
                              InjectedFailureMessage(FailStage::kCopy));
  }
  auto note_waited = [&](int q) { ex.NoteWaited(q, job.me, job.epoch); };
  // A release (EnqueueBandRelease) fills rows with NaNs only where the copy stream is ordered
  // after that call's start: before it, XLA may still use the memory for earlier work. Its flags
  // are written either way (the GEMM waits for them).
  auto release = [&](char* gathered, uint32_t* flags, int first_band, bool ordered) {
    if (ordered) {
      (void)EnqueueBandRelease(ag.copy_stream, gathered, flags, first_band, job.bands.per_rank,
                               job.band_bytes);
      return;
    }
    for (int c = 0; c < job.bands.per_rank; ++c) {
      (void)EnqueueWriteValue(ag.copy_stream, flags + first_band + c, 1);
    }
  };
  note_waited(job.me);
  for (int s = 1; s < job.P; ++s) {
    const int q = (job.me + s) % job.P;
    Entry peer;
    const Status got = AwaitEntry(ex, job.me, q, job.epoch, &peer);
    if (!got.ok()) {
      if (status.ok()) status = got;
      // Without its entry the peer has not launched its GEMM for this call and may never send
      // its bands: this rank's GEMM waits for their flags, released here (after the zeroing:
      // the copy stream waited on own_started), their rows NaNs.
      release(job.own_gathered, job.own_flags, q * job.bands.per_rank, own_ready.ok());
      continue;
    }
    if (ex.PeerGaveUp(q, job.me, job.epoch)) continue;  // its call may be over: nothing into it
    // Always, even after a failure: a flag written before the peer zeroed its flags would be
    // lost, and the peer's GEMM would wait for it forever.
    const Status started =
        CudaStatus(cudaStreamWaitEvent(ag.copy_stream, peer.started, 0),
                   "waiting for rank " + std::to_string(q) + "'s call to start");
    if (status.ok()) status = started;
    note_waited(q);
    if (!status.ok()) {  // no copies: the peer's GEMM released, its rows from here NaNs
      release(static_cast<char*>(peer.gathered), peer.flags, job.me * job.bands.per_rank,
              started.ok());
      continue;
    }
    status = EnqueueBandPushes(ag.graphs, q, ag.copy_stream, job.x,
                               static_cast<char*>(peer.gathered), peer.flags,
                               job.me * job.bands.per_rank, job.bands.per_rank, job.band_bytes);
  }
  const Status done = EnqueueWriteValue(ag.copy_stream, ag.copies_done, job.epoch);
  if (status.ok()) status = done;
  if (!status.ok()) Fail(ag, status);
}

// XLA's thread, before re-recording ring slot e % kRing: every copy thread of the group (this
// rank's too) has waited on call e - kRing's event.
Status AwaitRingSlot(Exchange& ex, int me, uint32_t e) {
  const std::string failed = ex.AwaitRingSlot(me, e, PeerTimeout());
  return failed.empty() ? Status::Ok() : Status::Internal(failed);
}

Status PreparePeers(AgState& ag, int device, int P, int me, uint32_t e,
                    const AllGatherBands& bands, size_t band_bytes, const void* x) {
  for (int s = 1; s < P; ++s) {
    const int q = (me + s) % P;
    bool graphs_built = true;
    {
      std::lock_guard<std::mutex> lock(ag.graphs.mu);
      for (int c = 0; c < bands.per_rank && c < CopyGraphs::kPerPeer; ++c) {
        graphs_built = graphs_built && ag.graphs.exec[q][c] != nullptr;
      }
    }
    if (ag.peer_ready[q] && graphs_built) continue;
    Entry peer;
    FO_JAX_RETURN_IF_ERROR(AwaitEntry(*ag.exchange, me, q, e, &peer));
    if (!ag.peer_ready[q]) {
      int ok = 0;
      cudaError_t err = cudaDeviceCanAccessPeer(&ok, device, peer.device);
      FO_JAX_RETURN_IF_ERROR(CudaStatus(err, "peer access query"));
      if (!ok) {
        return Status::Internal("GPU " + std::to_string(device) + " cannot access GPU " +
                                std::to_string(peer.device) + " directly (no peer access); use "
                                "OverlapConfig(transport='nccl')");
      }
      err = cudaDeviceEnablePeerAccess(peer.device, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        FO_JAX_RETURN_IF_ERROR(CudaStatus(err, "enabling peer access"));
      }
      ag.peer_ready[q] = true;
    }
    if (TestFailureAt(FailStage::kGraph, me)) {  // after peer access, as a real build failure
      return Status::Internal("building the copy graphs failed " +
                              InjectedFailureMessage(FailStage::kGraph));
    }
    for (int c = 0; c < bands.per_rank; ++c) {
      const int band = me * bands.per_rank + c;
      FO_JAX_RETURN_IF_ERROR(EnsureCopyGraph(
          ag.graphs, q, c, static_cast<char*>(peer.gathered) + band * band_bytes,
          static_cast<const char*>(x) + c * band_bytes, band_bytes));
    }
  }
  return Status::Ok();
}

// Rank `me`, giving up on every peer for this call: releases on XLA's stream (before the GEMM)
// the bands of every other rank (EnqueueBandRelease: their rows NaNs); its own are there. A peer
// that took this call's entry before may still push its rows over the NaNs, so each element of
// the call's results is then either right or NaN.
Status ReleaseOtherRanks(cudaStream_t xla_stream, const AllGatherBuffers& buffers,
                         const AllGatherBands& bands, int P, int me, size_t band_bytes) {
  Status first = Status::Ok();
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    const Status released =
        EnqueueBandRelease(xla_stream, static_cast<char*>(buffers.gathered), buffers.flags,
                           q * bands.per_rank, bands.per_rank, band_bytes);
    if (first.ok()) first = released;
  }
  return first;
}

}  // namespace

Status EnqueueBandPushes(CopyGraphs& graphs, int peer, cudaStream_t stream, const char* src,
                         char* gathered, uint32_t* flags, int first_band, int per_rank,
                         size_t band_bytes) {
  Status status = Status::Ok();
  for (int c = 0; c < per_rank; ++c) {
    const int band = first_band + c;
    if (status.ok()) {
      status = LaunchCopyGraph(graphs, peer, c, gathered + band * band_bytes,
                               src + c * band_bytes, band_bytes, stream);
    }
    if (!status.ok()) {  // this band's copy is not enqueued: its rows read as failed
      (void)EnqueueBandRelease(stream, gathered, flags, band, 1, band_bytes);
      continue;
    }
    status = EnqueueWriteValue(stream, flags + band, 1);
  }
  return status;
}

Status EnqueueBandRelease(cudaStream_t stream, char* gathered, uint32_t* flags, int first_band,
                          int count, size_t band_bytes) {
  Status first = Status::Ok();
  for (int band = first_band; band < first_band + count; ++band) {
    const Status filled = EnqueueNanFill(stream, gathered + band * band_bytes, band_bytes);
    const Status flagged = EnqueueWriteValue(stream, flags + band, 1);
    if (first.ok()) first = filled.ok() ? flagged : filled;
  }
  return first.Within("releasing all-gather bands");
}

Status EnqueueAllGatherCopyEngine(CommState& state, cudaStream_t xla_stream,
                                  const OverlapPlan& plan, const OverlapShape& shape,
                                  SignalingGemmArgs gemm, const AllGatherBuffers& buffers) {
  AgState* ag = nullptr;
  FO_JAX_RETURN_IF_ERROR(GetAgState(state, xla_stream, &ag));
  Exchange& ex = *ag->exchange;
  const int P = state.nranks, me = state.rank;
  const AllGatherBands bands = AllGatherBandsOf(plan, shape);
  const uint32_t e = ++ag->epoch;
  const int slot = static_cast<int>(e % kRing);
  FO_JAX_RETURN_IF_ERROR(AwaitRingSlot(ex, me, e));

  // XLA's stream: the flags zeroed, the own rows and their flags (all_gather_nccl.h), then the
  // event after which the peers may write this call's buffers.
  FO_JAX_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(buffers.flags, 0, bands.count * sizeof(uint32_t), xla_stream),
                 "zeroing the band flags"));
  const size_t band_bytes = static_cast<size_t>(bands.rows * shape.k) * GemmInputBytes(shape.dtype);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(static_cast<char*>(buffers.gathered) + me * bands.per_rank * band_bytes,
                      buffers.x, bands.per_rank * band_bytes, cudaMemcpyDeviceToDevice,
                      xla_stream),
      "the own rows into the gathered output"));
  for (int c = 0; c < bands.per_rank; ++c) {
    FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(xla_stream, buffers.flags + me * bands.per_rank + c,
                                             1));
  }
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ag->started[slot], xla_stream),
                                    "recording the all-gather's start"));
  // The group's failure when this call published ("" while healthy).
  const std::string failed =
      ex.Publish(me, ToShared(Entry{e, buffers.gathered, buffers.flags, ag->started[slot],
                                    state.device}));
  if (!failed.empty()) {
    // A peer's copy thread may have given up on this call before it was published: nothing
    // might write these flags, so they are released here.
    ex.ReleaseAllPeers(me, e);
    FO_JAX_RETURN_IF_ERROR(ReleaseOtherRanks(xla_stream, buffers, bands, P, me, band_bytes));
  }

  // First use of a peer: peer access towards its GPU (the stream writes of its flags need it).
  // The copy graphs, built here (building may wait for this GPU to drain: never on the copy
  // thread). Both need the peer's entry, which this waits for only then. On a failure the call
  // still runs (the copy thread releases every flag it can), its own flags released here.
  const Status prepared = PreparePeers(*ag, state.device, P, me, e, bands, band_bytes, buffers.x);
  if (!prepared.ok()) {
    Fail(*ag, prepared);
    ex.ReleaseAllPeers(me, e);
    FO_JAX_RETURN_IF_ERROR(ReleaseOtherRanks(xla_stream, buffers, bands, P, me, band_bytes));
  }

  Job job;
  job.P = P;
  job.me = me;
  job.epoch = e;
  job.x = static_cast<const char*>(buffers.x);
  job.own_gathered = static_cast<char*>(buffers.gathered);
  job.own_flags = buffers.flags;
  job.own_started = ag->started[slot];
  job.bands = bands;
  job.band_bytes = band_bytes;
  ag->worker->Push([ag, job] { RunJob(*ag, job); });

  gemm.a = buffers.gathered;
  gemm.wait_flags = buffers.flags;
  gemm.counters = nullptr;
  std::string msg;
  const Status launched =
      TestFailureAt(FailStage::kLaunch, me)
          ? Status::Internal("consumer GEMM launch failed " +
                             InjectedFailureMessage(FailStage::kLaunch))
          : LaunchStatus(LaunchSignalingGemm(xla_stream, gemm, &msg), "consumer GEMM launch",
                         msg);
  // x is XLA's: the call ends only once this rank's copies have read it.
  FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(xla_stream, ag->copies_done, e));
  if (!launched.ok()) Fail(*ag, launched);  // the peers got their rows: nobody waits for it
  std::lock_guard<std::mutex> lock(ag->failure_mu);
  if (ag->failure.empty() && !failed.empty()) ag->failure = "copy-engine all-gather: " + failed;
  if (!ag->failure.empty()) {
    // Every later call of the group, on every rank, raises with it (comm_registry.h).
    FailCommGroup(state, ag->failure + " (rank " + std::to_string(me) + ")");
    return Status::Internal(ag->failure + " (this call ran so that the group's other ranks do "
                            "not wait for this one; its result and every later call's are "
                            "undefined: restart the process)");
  }
  return Status::Ok();
}

}  // namespace fo_jax
