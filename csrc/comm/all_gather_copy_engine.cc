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
#include "comm/all_gather_peers.h"
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

// What rank r published for its call `epoch`, as this process uses it: for a rank in this process
// its AgEntry's own addresses and event, for one in another process the addresses in this
// process's mapping of its XLA allocation and the event of its ring opened here (Resolve).
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

// A call's gathered output and band flags, in bytes (the same on every rank).
uint64_t GatheredBytes(const AllGatherBands& bands, size_t band_bytes) {
  return static_cast<uint64_t>(bands.count) * band_bytes;
}
uint64_t FlagBytes(const AllGatherBands& bands) {
  return static_cast<uint64_t>(bands.count) * sizeof(uint32_t);
}

// One rank's copy-engine all-gather state (created on first use, never destroyed: its streams,
// events and device word may be in use by queued work).
struct AgState {
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t started[kRing] = {};
  uint32_t* copies_done = nullptr;  // device word: the latest call whose copies all ended
  bool copies_done_zeroed = false;  // by the first call, in XLA's stream order
  uint32_t epoch = 0;               // calls made (under the communicator's lock)
  CopyGraphs graphs;
  bool peer_ready[kMaxCopyEngineRanks] = {};  // peer access enabled towards that rank's GPU
  std::shared_ptr<Exchange> exchange;  // the group's (ag_exchange.h)
  // Whether a peer lives in another process, and how this rank reaches those peers
  // (all_gather_peers.h); the exchange is then this rank's mapping of the shared segment.
  bool spans_processes = false;
  AgPeers peers;
  std::unique_ptr<HostWorker> worker;
  std::mutex failure_mu;
  std::string failure;  // the copy thread's first failure
};

std::mutex& RegistryMu() {
  static auto* mu = new std::mutex();
  return *mu;
}

// Creates this rank's state (streams, events, the device word) on its first call.
Status CreateAgState(CommState& state, bool interprocess, AgState& s) {
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
    // Peers in other processes wait on them through their IPC handles.
    err = cudaEventCreateWithFlags(&s.started[i], cudaEventDisableTiming |
                                                      (interprocess ? cudaEventInterprocess : 0));
  }
  FO_JAX_RETURN_IF_ERROR(CudaStatus(err, "creating the copy-engine all-gather's state"));
  // Now, not at a failure: releases fill the bands that will not come with NaNs from it.
  FO_JAX_RETURN_IF_ERROR(PrepareNanFill());
  // Zeroed by the first call (EnqueueAllGatherCopyEngine), in XLA's stream order.
  return DeviceAlloc(state.device, "copy-engine all-gather word", sizeof(uint32_t),
                     reinterpret_cast<void**>(&s.copies_done));
}

std::map<const CommState*, std::unique_ptr<AgState>>& States() {
  static auto* states = new std::map<const CommState*, std::unique_ptr<AgState>>();
  return *states;
}

// This rank's state, or nullptr before PrepareAllGatherCopyEngine made it.
AgState* FindAgState(const CommState& state) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  auto it = States().find(&state);
  return it == States().end() ? nullptr : it->second.get();
}

// Where a rank's peers live, learnt once (a collective) on its first call; and for a group
// that spans processes, why its connection failed (every rank fails it together, so every rank
// then stops trying, and no rank waits in a collective the others skip).
struct AgLayout {
  bool other_process[kMaxCopyEngineRanks] = {};
  bool spans = false;
  std::string failed;
};

std::map<const CommState*, AgLayout>& Layouts() {
  static auto* layouts = new std::map<const CommState*, AgLayout>();
  return *layouts;
}

// This rank's state, created with the group's exchange on its first call (every rank of the
// group makes it, so the collectives below, none under the registry's lock, see every rank: two
// ranks of this process meet in them). In one process a rank that cannot create its state
// tries again on its next call, alone.
Status SetUpAgState(CommState& state, const AllGatherBuffers& buffers, uint64_t gathered_bytes) {
  static auto* exchanges = new std::map<const CommGroup*, std::shared_ptr<Exchange>>();
  if (FindAgState(state) != nullptr) return Status::Ok();
  AgLayout layout;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    auto it = Layouts().find(&state);
    if (it != Layouts().end()) {
      layout = it->second;
      known = true;
    }
  }
  if (!known) {
    FO_JAX_RETURN_IF_ERROR(AllGatherProcessLayout(state, layout.other_process, &layout.spans));
    std::lock_guard<std::mutex> lock(RegistryMu());
    Layouts()[&state] = layout;
  }
  if (!layout.failed.empty()) return Status::Internal(layout.failed);
  const bool* other_process = layout.other_process;
  auto s = std::make_unique<AgState>();
  if (layout.spans) {
    // Every rank creates its state first and reports it in the connection's all-gathers, so the
    // group connects or fails together; a failed group raises on every later call.
    const Status created = CreateAgState(state, /*interprocess=*/true, *s);
    // A rank without its state joins the connection's all-gathers as a failed one (no buffer:
    // MapPeerPools cannot export).
    std::unique_ptr<Exchange> shared;
    const Status connected = ConnectAllGatherPeers(
        state, created.ok() ? buffers.gathered : nullptr, created.ok() ? gathered_bytes : 0,
        s->started, other_process, &shared, &s->peers);
    const Status failed = created.ok() ? connected : created;
    if (!failed.ok()) {
      {
        std::lock_guard<std::mutex> lock(RegistryMu());
        Layouts()[&state].failed = failed.message();
      }
      FailCommGroup(state, "copy-engine all-gather: " + failed.message());
      return failed;
    }
    s->exchange = std::shared_ptr<Exchange>(std::move(shared));
    s->spans_processes = true;
  } else {
    std::lock_guard<std::mutex> lock(RegistryMu());
    // The group's exchange first: a rank that cannot create its state fails the exchange, so
    // its peers' waits for its entries end at once (not after PeerTimeout()) and every rank's
    // call raises. It retries on its next call; the exchange stays failed.
    std::shared_ptr<Exchange>& ex = (*exchanges)[state.group.get()];
    if (!ex) {
      ex = std::shared_ptr<Exchange>(AgExchange::CreateLocal(state.nranks));
      if (!ex) return Status::Internal("creating the copy-engine all-gather's exchange failed");
    }
    const Status created = CreateAgState(state, /*interprocess=*/false, *s);
    if (!created.ok()) {
      ex->Fail("rank " + std::to_string(state.rank) + " of the group could not create its "
               "copy-engine all-gather state: " + created.message());
      return created;
    }
    s->exchange = ex;
  }
  s->worker = std::make_unique<HostWorker>(state.device);
  std::lock_guard<std::mutex> lock(RegistryMu());
  States()[&state] = std::move(s);
  return Status::Ok();
}

// Rank q's entry as this process reaches it: its own addresses and event for a rank in this
// process; for one in another process its gathered output and flags in this process's mapping of
// its XLA allocation (the ranges checked: a buffer outside it fails) and the slot of its ring.
Status Resolve(const AgState& ag, int q, const AgEntry& a, uint64_t gathered_bytes,
               uint64_t flag_bytes, Entry* out) {
  Entry e = FromShared(a);
  if (ag.spans_processes && ag.peers.other_process[q]) {
    e.gathered = PeerAddressHere(ag.peers, q, a.gathered, gathered_bytes);
    e.flags = static_cast<uint32_t*>(PeerAddressHere(ag.peers, q, a.flags, flag_bytes));
    e.started = ag.peers.events[q][a.epoch % kRing];
    e.device = -1;  // its ordinal means nothing here; the mapping gave this GPU access
    if (e.gathered == nullptr || e.flags == nullptr) {
      return Status::Internal("rank " + std::to_string(q) + "'s all-gather buffers lie outside "
                              "the XLA memory this process mapped at the group's first call");
    }
  }
  *out = e;
  return Status::Ok();
}

// Waits on the host until rank q's entry for call e is there; its copy, or the failure. On a
// failure rank `me` gives up on q for call e (the exchange's `released`): the caller must then
// set its own flags of q's bands. The caller takes the entry (TakeEntry) before it resolves it:
// a rank whose buffers its peers cannot reach gives up on every peer before it publishes.
Status AwaitEntry(Exchange& ex, int me, int q, uint32_t e, AgEntry* out) {
  const std::string failed = ex.AwaitEntry(me, q, e, PeerTimeout(), out);
  return failed.empty() ? Status::Ok() : Status::Internal(failed);
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
    AgEntry published;
    const Status got = AwaitEntry(ex, job.me, q, job.epoch, &published);
    if (!got.ok()) {
      if (status.ok()) status = got;
      // Without its entry the peer has not launched its GEMM for this call and may never send
      // its bands: this rank's GEMM waits for their flags, released here (after the zeroing:
      // the copy stream waited on own_started), their rows NaNs.
      release(job.own_gathered, job.own_flags, q * job.bands.per_rank, own_ready.ok());
      continue;
    }
    // From here on q's call waits for this rank's bands (a give-up of q's leaves them to this
    // thread): every path below writes them, rows or after a failure NaNs and flags, but for a
    // peer whose memory this rank cannot map (unreachable, below).
    if (!ex.TakeEntry(q, job.me, job.epoch)) {  // q gave up: its call may be over, nothing into it
      note_waited(q);  // nothing here waits on its event: its ring slot is free to reuse
      continue;
    }
    Entry peer;
    const Status resolved = Resolve(ag, q, published, GatheredBytes(job.bands, job.band_bytes),
                                    FlagBytes(job.bands), &peer);
    if (!resolved.ok()) {
      // Unreachable where the owner checked its buffers before publishing (it then gave up on
      // every peer, above); the group fails, and nothing goes into memory this rank cannot map.
      ex.Fail(resolved.message());
      if (status.ok()) status = resolved;
      continue;
    }
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
    AgEntry published;
    FO_JAX_RETURN_IF_ERROR(AwaitEntry(*ag.exchange, me, q, e, &published));
    if (ag.exchange->PeerGaveUp(q, me, e)) continue;  // nothing goes into it this call
    Entry peer;
    FO_JAX_RETURN_IF_ERROR(Resolve(ag, q, published, GatheredBytes(bands, band_bytes),
                                   FlagBytes(bands), &peer));
    // A peer in another process: this GPU reaches its memory through the mapping
    // (all_gather_peers.h), which granted access.
    if (!ag.peer_ready[q] && ag.spans_processes && ag.peers.other_process[q]) {
      ag.peer_ready[q] = true;
    }
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

// Rank `me`, having given up on the peers in `given_up` (bit q; ReleaseAllPeers) for this
// call: releases on XLA's stream (before the GEMM) their bands (EnqueueBandRelease: their rows
// NaNs); its own are there, and a peer that took the call's entry first writes its own bands,
// which the GEMM, and so the call, waits for: nothing lands in this call's buffers after it.
Status ReleaseOtherRanks(cudaStream_t xla_stream, const AllGatherBuffers& buffers,
                         const AllGatherBands& bands, int P, uint32_t given_up,
                         size_t band_bytes) {
  Status first = Status::Ok();
  for (int q = 0; q < P; ++q) {
    if (!(given_up >> q & 1)) continue;
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

Status PrepareAllGatherCopyEngine(CommState& state, const OverlapPlan& plan,
                                  const OverlapShape& shape, const AllGatherBuffers& buffers) {
  const AllGatherBands bands = AllGatherBandsOf(plan, shape);
  return SetUpAgState(state, buffers, GatheredBytes(bands, bands.band_bytes));
}

Status EnqueueAllGatherCopyEngine(CommState& state, cudaStream_t xla_stream,
                                  const OverlapPlan& plan, const OverlapShape& shape,
                                  SignalingGemmArgs gemm, const AllGatherBuffers& buffers) {
  const int P = state.nranks, me = state.rank;
  const AllGatherBands bands = AllGatherBandsOf(plan, shape);
  const size_t band_bytes = bands.band_bytes;
  AgState* const ag = FindAgState(state);
  if (ag == nullptr) {
    return Status::Internal("the copy-engine all-gather ran before its setup "
                            "(PrepareAllGatherCopyEngine)");
  }
  Exchange& ex = *ag->exchange;
  // A failure before this call's entry goes out is the group's at once: the peers' waits for
  // the entry end with it instead of after PeerTimeout().
  auto before_entry = [&](const Status& st) {
    if (!st.ok()) ex.Fail("rank " + std::to_string(me) + ": " + st.message());
    return st;
  };
  if (!ag->copies_done_zeroed) {
    // Before the first call's "call started", which the copy stream waits on before it writes
    // the word (no device synchronization: peers may be mid-call).
    FO_JAX_RETURN_IF_ERROR(before_entry(CudaStatus(
        cudaMemsetAsync(ag->copies_done, 0, sizeof(uint32_t), xla_stream),
        "zeroing the copy-engine all-gather's word")));
    ag->copies_done_zeroed = true;
  }
  const uint32_t e = ++ag->epoch;
  const int slot = static_cast<int>(e % kRing);
  FO_JAX_RETURN_IF_ERROR(AwaitRingSlot(ex, me, e));

  // XLA's stream: the flags zeroed, the own rows and their flags (all_gather_nccl.h), then the
  // event after which the peers may write this call's buffers.
  FO_JAX_RETURN_IF_ERROR(before_entry(
      CudaStatus(cudaMemsetAsync(buffers.flags, 0, bands.count * sizeof(uint32_t), xla_stream),
                 "zeroing the band flags")));
  FO_JAX_RETURN_IF_ERROR(before_entry(CudaStatus(
      cudaMemcpyAsync(static_cast<char*>(buffers.gathered) + me * bands.per_rank * band_bytes,
                      buffers.x, bands.per_rank * band_bytes, cudaMemcpyDeviceToDevice,
                      xla_stream),
      "the own rows into the gathered output")));
  for (int c = 0; c < bands.per_rank; ++c) {
    FO_JAX_RETURN_IF_ERROR(before_entry(
        EnqueueWriteValue(xla_stream, buffers.flags + me * bands.per_rank + c, 1)));
  }
  FO_JAX_RETURN_IF_ERROR(before_entry(CudaStatus(cudaEventRecord(ag->started[slot], xla_stream),
                                                 "recording the all-gather's start")));
  // Peers in other processes reach this call's buffers through their mapping of this rank's XLA
  // allocation: buffers outside it (JAX's preallocation off) fail the group and give up on every
  // peer before the entry goes out, so the peers write nothing into them (PeerGaveUp) and this
  // rank releases its own flags below; its own rows still go to the peers.
  if (ag->spans_processes && (!InOwnPool(ag->peers, buffers.gathered,
                                         GatheredBytes(bands, band_bytes)) ||
                              !InOwnPool(ag->peers, buffers.flags, FlagBytes(bands)))) {
    ex.Fail("rank " + std::to_string(me) + "'s all-gather buffers lie outside the XLA memory "
            "that its peers in other processes mapped at the group's first call (JAX's memory "
            "preallocation is off, XLA_PYTHON_CLIENT_PREALLOCATE=false, or another allocator "
            "is in use, so XLA's memory is not one allocation); use "
            "OverlapConfig(transport='nccl') for this all-gather");
    (void)ex.ReleaseAllPeers(me, e);  // before the entry: no peer takes it
  }
  // The group's failure when this call published ("" while healthy).
  const std::string failed =
      ex.Publish(me, ToShared(Entry{e, buffers.gathered, buffers.flags, ag->started[slot],
                                    state.device}));
  if (!failed.empty()) {
    // A peer's copy thread may have given up on this call before it was published: nothing
    // might write these flags, so they are released here (but a peer's that took the entry).
    FO_JAX_RETURN_IF_ERROR(ReleaseOtherRanks(xla_stream, buffers, bands, P,
                                             ex.ReleaseAllPeers(me, e), band_bytes));
  }

  // First use of a peer: peer access towards its GPU (the stream writes of its flags need it).
  // The copy graphs, built here (building may wait for this GPU to drain: never on the copy
  // thread). Both need the peer's entry, which this waits for only then. On a failure the call
  // still runs (the copy thread releases every flag it can), its own flags released here.
  const Status prepared = PreparePeers(*ag, state.device, P, me, e, bands, band_bytes, buffers.x);
  if (!prepared.ok()) {
    Fail(*ag, prepared);
    FO_JAX_RETURN_IF_ERROR(ReleaseOtherRanks(xla_stream, buffers, bands, P,
                                             ex.ReleaseAllPeers(me, e), band_bytes));
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
