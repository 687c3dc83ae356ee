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

std::string Cuda(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// FO_JAX_CE_COPY_THREAD=0 enqueues the copy stream's work on XLA's thread (PeerState).
bool CopyThreadEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FO_JAX_CE_COPY_THREAD");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

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
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->sums_done, cudaEventDisableTiming);
  for (int i = 0; i < PeerState::kCallEvents && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&p->inputs_ready[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->sums_ended[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) return Cuda("creating the copy and sum streams and their events", e);
  constexpr size_t sync_bytes = kSyncRegions * kMaxPeerRanks * sizeof(uint32_t);
  e = cudaMalloc(&p->sync, sync_bytes);
  if (e == cudaSuccess) e = cudaMalloc(&p->exchange, kMaxPeerRanks * sizeof(PeerInfo));
  if (e != cudaSuccess) return Cuda("allocating the copy-engine flags", e);
  e = cudaMemsetAsync(p->sync, 0, sync_bytes, s.stream);
  if (e != cudaSuccess) return Cuda("zeroing the copy-engine flags", e);
  std::string err;
  if (LoadBandSumKernels(&err) != cudaSuccess) return err;
  if (CopyThreadEnabled()) {
    // At exit, before the CUDA runtime's own teardown (registered earlier, so run later): let
    // the copy threads finish enqueueing (they may still be sending a last call's acks).
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
  }
  s.peer = std::move(p);
  return "";
}

uint32_t* Region(uint32_t* sync, PeerSyncRegion r) { return sync + r * kMaxPeerRanks; }

// Enqueues *Region(peer q's sync, region)[me] = e for every peer q (after the stream's earlier
// work: stream_wait.h).
cudaError_t TellPeers(uint32_t* const* peer_sync, cudaStream_t stream, PeerSyncRegion region,
                      int P, int me, uint32_t e, std::string* error) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    cudaError_t err = EnqueueWriteValue(stream, Region(peer_sync[q], region) + me, e, error);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// Enqueues on `stream`: wait until every peer q has Region(this rank's sync, region)[q] >= e.
cudaError_t WaitForPeers(PeerState& p, cudaStream_t stream, PeerSyncRegion region, int P, int me,
                         uint32_t e, std::string* error) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    cudaError_t err = EnqueueWaitGeq(stream, Region(p.sync, region) + q, e, false, error);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

uint64_t* OutTable(uint32_t* sync) {
  return reinterpret_cast<uint64_t*>(Region(sync, kOutTable));
}

// All-reduce: writes this call's output address into every peer's out table (slot j of rank q
// holds the address of rank (q + 1 + j) % P) and flags it with the epoch. The peer's band sum
// reads it on the GPU; the address stays valid until this rank's call ends, which waits for the
// peer's kStored flag (written after that sum).
cudaError_t SendOutputAddress(uint32_t* const* peer_sync, cudaStream_t stream, void* out, int P,
                              int me, uint32_t e, std::string* error) {
  const uint64_t address = reinterpret_cast<uint64_t>(out);
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    const int slot = (me - q - 1 + P) % P;
    auto* words = reinterpret_cast<uint32_t*>(OutTable(peer_sync[q]) + slot);
    cudaError_t err = EnqueueWriteValue(stream, words, uint32_t(address), error);
    if (err == cudaSuccess) {
      err = EnqueueWriteValue(stream, words + 1, uint32_t(address >> 32), error);
    }
    if (err == cudaSuccess) {
      err = EnqueueWriteValue(stream, Region(peer_sync[q], kOutReady) + me, e, error);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t Join(cudaStream_t xla_stream, cudaEvent_t done, std::string* error) {
  cudaError_t err = cudaStreamWaitEvent(xla_stream, done, 0);
  if (err != cudaSuccess) *error = "joining a copy stream into XLA's stream";
  return err;
}

cudaError_t CopyError(cudaError_t e, std::string* error) {
  *error = Cuda("copy between GPUs", e);
  return e;
}

// A one-node graph copying `bytes` from src (this GPU) to dst (peer memory) (PeerState::copy_exec
// says why copies are graph launches), built without touching PeerState. Only on XLA's thread:
// building one may wait for this GPU to drain (the copy thread must never wait for that, since
// XLA's stream may be waiting for the copy thread's copies: NOTES §19).
struct CopyGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t node = nullptr;
};
cudaError_t BuildCopyGraph(void* dst, const void* src, size_t bytes, CopyGraph* out) {
  CopyGraph g;
  cudaError_t e = cudaGraphCreate(&g.graph, 0);
  if (e == cudaSuccess) {
    e = cudaGraphAddMemcpyNode1D(&g.node, g.graph, nullptr, 0, dst, src, bytes,
                                 cudaMemcpyDeviceToDevice);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, g.graph, 0);
  if (e != cudaSuccess) {
    if (g.graph) (void)cudaGraphDestroy(g.graph);
    return e;
  }
  *out = g;  // the graph is kept with its exec: updates name its node
  return cudaSuccess;
}

// Puts a built graph into slot k of peer q (under p.graph_mu), replacing the slot's graph; an
// exec destroyed while launches of it are queued is freed when they complete.
void PublishCopyGraph(PeerState& p, int q, int k, const CopyGraph& g, void* dst, const void* src,
                      size_t bytes) {
  if (p.copy_exec[q][k]) (void)cudaGraphExecDestroy(p.copy_exec[q][k]);
  if (p.copy_graph[q][k]) (void)cudaGraphDestroy(p.copy_graph[q][k]);
  p.copy_graph[q][k] = g.graph;
  p.copy_exec[q][k] = g.exec;
  p.copy_node[q][k] = g.node;
  p.copy_set[q][k] = {dst, src, bytes};
  ++p.graphs_built;
}

// On the copy stream: once counters[g] is full, copy `bytes` from src to peer `to`'s dst.
// (Two halves on two copy streams measured no faster: benchmarks/NOTES.md §8.) An update only
// affects later launches, so earlier ones may still be queued. The call's `ordinal`-th copy to a
// peer prefers graph slot `ordinal` (clamped), so that each group keeps a graph of its own and,
// when XLA hands the call the same workspace as the previous one, launches it without an update
// (PeerState::copy_set; an update costs host time per copy). Otherwise the first graph of the
// peer whose update accepts these operands makes the copy; if none does (memory of a kind no
// graph was built for), the copy fails. Never builds a graph: EnsureCopyGraphs built the
// preferred slot before the call was handed over. `index`: the copy's place in the call
// (timeline marks).
cudaError_t GatedCopy(CommState& s, const PeerCollectiveArgs& a, int row, int g, int index,
                      int ordinal, int to, char* dst, const char* src, size_t bytes,
                      std::string* error) {
  PeerState& p = *s.peer;
  cudaError_t err = EnqueueWaitGeq(p.copy_stream, a.counters + g, a.expected[g], false, error);
  if (err != cudaSuccess) return err;
  const bool marked = index < kTimelineCopySlots;
  if (marked) RecordTimelineMarkAt(s, row, TimelineMark(kCopyGo0 + index), p.copy_stream);
  ++p.copies;
  std::lock_guard<std::mutex> graphs(p.graph_mu);
  constexpr int kSlots = PeerState::kCopyGraphs;
  const int preferred = std::min(ordinal, kSlots - 1);
  int k = -1;
  for (int t = 0; t < kSlots && k < 0; ++t) {  // the preferred slot first, then the others
    const int i = (preferred + t) % kSlots;
    if (!p.copy_exec[to][i]) continue;
    PeerState::CopyOperands& set = p.copy_set[to][i];
    if (set.dst == dst && set.src == src && set.bytes == bytes) {
      k = i;
      break;
    }
    err = cudaGraphExecMemcpyNodeSetParams1D(p.copy_exec[to][i], p.copy_node[to][i], dst, src,
                                             bytes, cudaMemcpyDeviceToDevice);
    if (err == cudaSuccess) {
      set = {dst, src, bytes};
      ++p.updates;
      k = i;
    } else if (err == cudaErrorInvalidValue) {
      (void)cudaGetLastError();  // memory of another kind: try the next graph
    } else {
      return CopyError(err, error);
    }
  }
  if (k < 0) {
    *error = "no copy graph accepts the buffers of a copy between GPUs (memory of a kind the "
             "graphs were not built for); use OverlapConfig(transport='nccl')";
    return cudaErrorInvalidValue;
  }
  err = cudaGraphLaunch(p.copy_exec[to][k], p.copy_stream);
  if (err != cudaSuccess) return CopyError(err, error);
  if (marked) RecordTimelineMarkAt(s, row, TimelineMark(kCopyDone0 + index), p.copy_stream);
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
    return Cuda(("allocating " + std::to_string(capacity >> 20) +
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
  if (e != cudaSuccess) return Cuda("address exchange", e);
  ncclResult_t r = ncclAllGather(slots + s.rank, slots, sizeof(PeerInfo), ncclUint8, s.comm,
                                 s.stream);
  if (r != ncclSuccess) {
    return std::string("address exchange (ncclAllGather): ") + ncclGetErrorString(r);
  }
  e = cudaMemcpyAsync(all.data(), slots, s.nranks * sizeof(PeerInfo), cudaMemcpyDeviceToHost,
                      s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  if (e != cudaSuccess) return Cuda("address exchange", e);
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
      return Cuda("enabling peer access", e);
    }
    p.peer_recv[q] = reinterpret_cast<void*>(all[q].recv);
    p.peer_sync[q] = reinterpret_cast<uint32_t*>(all[q].sync);
  }
  return "";
}

std::string SetPeerGroups(PeerCollectiveArgs& a, int P, const int* group_begin, int num_groups,
                          int tiles_chunk, size_t tile_row_elems) {
  const int chunks = a.rounds * P;
  if (tiles_chunk <= 0 || num_groups < chunks || num_groups > kMaxGemmGroups ||
      group_begin[num_groups] != chunks * tiles_chunk ||
      size_t(tiles_chunk) * tile_row_elems * a.rounds != a.band_elems) {
    return "the groups do not cover the rounds x ranks chunks";
  }
  int c = 0;  // chunks whose first row starts a group
  for (int g = 0; g < num_groups; ++g) {
    if (c < chunks && group_begin[g] == c * tiles_chunk) a.chunk_first_group[c++] = g;
  }
  if (c != chunks) return "the groups do not split along the rounds x ranks chunks";
  a.chunk_first_group[chunks] = num_groups;
  a.num_groups = num_groups;
  std::copy(group_begin, group_begin + num_groups + 1, a.group_begin);
  a.tiles_chunk = tiles_chunk;
  a.tile_row_elems = tile_row_elems;
  return "";
}

std::string PeerAccessProblem(const std::vector<int>& ordinals) {
  for (int a : ordinals) {
    for (int b : ordinals) {
      if (a == b) continue;
      int ok = 0;
      cudaError_t e = cudaDeviceCanAccessPeer(&ok, a, b);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return Cuda("cudaDeviceCanAccessPeer", e);
      }
      if (!ok) return "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b);
    }
  }
  return "";
}

namespace {

// The copy stream's part of one call, as the handler hands it over (by value: the copy thread
// may enqueue it after the handler returned, and after a later call grew the receive buffers).
struct CopyJob {
  PeerCollectiveArgs a;
  uint32_t epoch = 0;
  int row = -1;  // timeline row of the call (-1: not recorded)
  cudaEvent_t inputs_ready = nullptr, sums_ended = nullptr;  // ring slots of the call
  void* peer_recv[kMaxPeerRanks] = {};
  uint32_t* peer_sync[kMaxPeerRanks] = {};
};

// Receive slot of round h, step j (j = P - 1 would be the own chunk, which is not sent).
int Slot(int P, int h, int j) { return h * (P - 1) + j; }

// Byte offset of chunk (round h, owner b) in the GEMM output (the workspace; the output itself
// for an all-reduce).
size_t ChunkOffset(int P, int h, int b, size_t chunk_bytes) {
  return size_t(h * P + b) * chunk_bytes;
}

// Visits a call's copies in order: round h, step j sends chunk (h, (me + 1 + j) % P) to its
// owner's slot, group by group. Calls step(h, j, to, true) before a step's copies, copy(g, index,
// ordinal, to, dst, src, bytes) for each (index: its place in the call, ordinal: its place among
// the call's copies to that peer) and step(h, j, to, false) after them; stops at the first error.
template <class Step, class Copy>
cudaError_t ForEachCopy(const CopyJob& job, int P, int me, Step&& step, Copy&& copy) {
  const PeerCollectiveArgs& a = job.a;
  const size_t chunk_bytes = a.band_elems / a.rounds * 2;
  const size_t tile_row_bytes = a.tile_row_elems * 2;
  const char* ws = static_cast<const char*>(a.workspace);
  int index = 0;                   // copies so far in this call, and
  int sent_to[kMaxPeerRanks] = {};  // to each peer
  for (int h = 0; h < a.rounds; ++h) {
    for (int j = 0; j + 1 < P; ++j) {
      const int to = (me + 1 + j) % P;
      const int L = h * P + j;  // logical chunk
      cudaError_t err = step(h, j, to, true);
      if (err != cudaSuccess) return err;
      char* dst = static_cast<char*>(job.peer_recv[to]) + Slot(P, h, j) * chunk_bytes;
      const char* src = ws + ChunkOffset(P, h, to, chunk_bytes);
      for (int g = a.chunk_first_group[L]; g < a.chunk_first_group[L + 1]; ++g) {
        const size_t at = size_t(a.group_begin[g] - L * a.tiles_chunk) * tile_row_bytes;
        const size_t bytes = size_t(a.group_begin[g + 1] - a.group_begin[g]) * tile_row_bytes;
        err = copy(g, index++, sent_to[to]++, to, dst + at, src + at, bytes);
        if (err != cudaSuccess) return err;
      }
      err = step(h, j, to, false);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

// On XLA's thread, before the call's copies are enqueued (by the copy thread or inline): builds
// the graph of every slot that one of the call's copies prefers (GatedCopy) and that has none
// yet, from that copy's operands, so that the copy thread never builds one (BuildCopyGraph says
// why).
cudaError_t EnsureCopyGraphs(CommState& s, const CopyJob& job, std::string* error) {
  PeerState& p = *s.peer;
  auto step = [](int, int, int, bool) { return cudaSuccess; };
  auto copy = [&](int, int, int ordinal, int to, char* dst, const char* src, size_t bytes) {
    const int k = std::min(ordinal, PeerState::kCopyGraphs - 1);
    {
      std::lock_guard<std::mutex> graphs(p.graph_mu);
      if (p.copy_exec[to][k]) return cudaSuccess;
    }
    CopyGraph built;  // outside the lock: building may wait for this GPU, the copy thread not
    cudaError_t err = BuildCopyGraph(dst, src, bytes, &built);
    if (err != cudaSuccess) {
      *error = Cuda("creating the graph of a copy between GPUs", err);
      return err;
    }
    std::lock_guard<std::mutex> graphs(p.graph_mu);
    PublishCopyGraph(p, to, k, built, dst, src, bytes);  // only XLA's thread fills slots
    return cudaSuccess;
  };
  return ForEachCopy(job, s.nranks, s.rank, step, copy);
}

// On the copy stream: after XLA's inputs are ready, each step's copies once their receiver has
// finished the previous call, each copy as soon as its group is done, then the step's arrival
// flag; at the end, flags this rank's own copies done (the call's last band sum waits for that:
// the copies read XLA's workspace).
cudaError_t EnqueueCopies(CommState& s, const CopyJob& job, std::string* error) {
  PeerState& p = *s.peer;
  const PeerCollectiveArgs& a = job.a;
  const int P = s.nranks, me = s.rank, H = a.rounds;
  const uint32_t e = job.epoch;
  cudaStream_t cs = p.copy_stream;
  cudaError_t err = cudaStreamWaitEvent(cs, job.inputs_ready, 0);
  if (err != cudaSuccess) {
    *error = "copy stream waiting for XLA's inputs";
    return err;
  }
  RecordTimelineMarkAt(s, job.row, kCopyInputs, cs);
  if (a.all_reduce) {
    err = SendOutputAddress(job.peer_sync, cs, a.out, P, me, e, error);
    if (err != cudaSuccess) return err;
  }
  auto step = [&](int h, int j, int to, bool begin) {
    cudaError_t r = cudaSuccess;
    if (begin) {
      if (h == 0) {
        // Only the receiver of this step must have finished reading the previous call's slots:
        // waiting for every peer before the first copy would hold the whole chain for the
        // slowest one.
        r = EnqueueWaitGeq(cs, Region(p.sync, kRecvAcked) + to, e - 1, false, error);
        if (r == cudaSuccess && j == 0) RecordTimelineMarkAt(s, job.row, kCopyAcked, cs);
      }
      return r;
    }
    r = EnqueueWriteValue(cs, Region(job.peer_sync[to], kArrived) + Slot(P, h, j), e, error);
    if (r == cudaSuccess && h == H - 1 && j < kTimelineCopySlots) {
      RecordTimelineMarkAt(s, job.row, TimelineMark(kCopySent0 + j), cs);
    }
    return r;
  };
  auto copy = [&](int g, int index, int ordinal, int to, char* dst, const char* src,
                  size_t bytes) {
    return GatedCopy(s, a, job.row, g, index, ordinal, to, dst, src, bytes, error);
  };
  err = ForEachCopy(job, P, me, step, copy);
  if (err != cudaSuccess) return err;
  return EnqueueWriteValue(cs, Region(p.sync, kOwnCopies), e, error);
}

// On the copy stream, once XLA's stream has read the receive slots (the call's last band sum):
// acknowledge to every sender that they are free again. (On the copy stream, idle by then, not
// on XLA's: results/overlap_profile_tp4_2026-11-21_fe573db.log, 11 us between the sum and the
// next call's GEMM.)
cudaError_t EnqueueAcks(CommState& s, const CopyJob& job, std::string* error) {
  PeerState& p = *s.peer;
  cudaError_t err = cudaStreamWaitEvent(p.copy_stream, job.sums_ended, 0);
  if (err != cudaSuccess) {
    *error = "copy stream waiting for the band sums";
    return err;
  }
  return TellPeers(job.peer_sync, p.copy_stream, kRecvAcked, s.nranks, s.rank, job.epoch, error);
}

// After a failure while enqueueing a call's copy-stream work: what its partners and its own
// band sum wait for, so that nobody hangs (the call's data is undefined; the failure is
// reported by every later call). Not the output addresses of an all-reduce: a peer that went on
// without this rank's address would store into memory it does not own, so it waits instead.
void ReleaseAfterFailure(CommState& s, const CopyJob& job) {
  PeerState& p = *s.peer;
  const int P = s.nranks, me = s.rank;
  std::string ignored;
  auto flag = [&](int h, int j, int to, bool begin) {
    if (!begin) {
      (void)EnqueueWriteValue(p.copy_stream, Region(job.peer_sync[to], kArrived) + Slot(P, h, j),
                              job.epoch, &ignored);
    }
    return cudaSuccess;
  };
  auto no_copy = [](int, int, int, int, char*, const char*, size_t) { return cudaSuccess; };
  (void)ForEachCopy(job, P, me, flag, no_copy);
  (void)EnqueueWriteValue(p.copy_stream, Region(p.sync, kOwnCopies), job.epoch, &ignored);
  (void)cudaStreamWaitEvent(p.copy_stream, job.sums_ended, 0);
  (void)TellPeers(job.peer_sync, p.copy_stream, kRecvAcked, P, me, job.epoch, &ignored);
  (void)cudaGetLastError();
}

void NoteCopyFailure(PeerState& p, const std::string& what) {
  std::lock_guard<std::mutex> lock(p.failure_mu);
  if (p.copy_failure.empty()) p.copy_failure = "copy-engine transport (copy thread): " + what;
}

// The copy thread's job for one call.
void RunCopyJob(CommState& s, const CopyJob& job) {
  PeerState& p = *s.peer;
  std::string error;
  cudaError_t err = EnqueueCopies(s, job, &error);
  RecordTimelineHostAt(s, job.row, kHostCopiesIssued);
  p.copy_thread->AwaitSignal(job.epoch);  // the handler recorded job.sums_ended (or failed)
  if (err == cudaSuccess) err = EnqueueAcks(s, job, &error);
  if (err != cudaSuccess) {
    NoteCopyFailure(p, error);
    ReleaseAfterFailure(s, job);
  }
}

}  // namespace

cudaEvent_t NextPeerInputsEvent(CommState& s) {
  PeerState& p = *s.peer;
  if (p.copy_thread) p.copy_thread->WaitPending(PeerState::kCallEvents - 1);
  return p.inputs_ready[(p.epoch + 1) % PeerState::kCallEvents];
}

void DrainPeerCopyThread(CommState& s) {
  if (s.peer && s.peer->copy_thread) s.peer->copy_thread->Drain();
}

std::string PeerCopyFailure(CommState& s) {
  if (!s.peer) return "";
  std::lock_guard<std::mutex> lock(s.peer->failure_mu);
  return s.peer->copy_failure;
}

cudaError_t EnqueuePeerCollective(CommState& s, cudaStream_t xla_stream,
                                  const PeerCollectiveArgs& a, std::string* error) {
  const int P = s.nranks, me = s.rank, H = a.rounds;
  if (P < 2 || P > kMaxPeerRanks) {
    *error = "copy-engine transport: 2 to " + std::to_string(kMaxPeerRanks) + " ranks";
    return cudaErrorInvalidValue;
  }
  if (H < 1 || H * (P - 1) > kMaxReceiveSlots || H * P > a.num_groups ||
      a.band_elems % H != 0 || (H > 1 && !a.all_reduce)) {
    *error = "copy-engine transport: bad number of rounds";
    return cudaErrorInvalidValue;
  }
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

  CopyJob job;
  job.a = a;
  job.epoch = e;
  job.row = TimelineRowOfCall(s);
  job.inputs_ready = p.inputs_ready[e % PeerState::kCallEvents];
  job.sums_ended = p.sums_ended[e % PeerState::kCallEvents];
  std::copy(p.peer_recv, p.peer_recv + kMaxPeerRanks, job.peer_recv);
  std::copy(p.peer_sync, p.peer_sync + kMaxPeerRanks, job.peer_sync);
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
  err = EnsureCopyGraphs(s, job, error);
  if (err != cudaSuccess) return err;
  if (p.copy_thread) {
    p.copy_thread->Push([&s, job] { RunCopyJob(s, job); });
  } else {
    err = EnqueueCopies(s, job, error);
    if (err != cudaSuccess) return err;
  }
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
        err = EnqueueWaitGeq(ss, a.counters + g, a.expected[g], false, error);
        if (err != cudaSuccess) return err;
      }
      const void* parts[kMaxPeerRanks];
      parts[0] = ws + chunk(h, me);
      for (int j = 0; j + 1 < P; ++j) {
        err = EnqueueWaitGeq(ss, arrived + Slot(P, h, j), e, false, error);
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

  // The last round on XLA's stream, after the GEMM (whose last chunk is this rank's own): sum
  // the own chunk and the P - 1 received ones (the kernels wait for their arrival flags
  // themselves, and the last one also for this rank's own copies: band_sum.h). With split_sum
  // the chunks already there are summed while the last one is in flight, and only out += last
  // chunk remains after it (two passes, more bytes): at 8192x8192x2048 the last copy ended ~30
  // us after the GEMM. When the copies end with the GEMM one pass moves fewer bytes.
  const int h = H - 1;
  RecordTimelineMark(s, kGemmEnd, xla_stream);
  if (a.all_reduce) {
    err = WaitForPeers(p, xla_stream, kOutReady, P, me, e, error);
    if (err != cudaSuccess) return err;
    remote.offset_bytes = chunk(h, me);
  }
  const void* parts[kMaxPeerRanks];
  parts[0] = ws + chunk(h, me);
  const bool split = a.split_sum && P > 2;
  const int early = split ? P - 2 : P - 1;  // received chunks summed in the first pass
  for (int j = 0; j < early; ++j) parts[j + 1] = recv + Slot(P, h, j) * chunk_bytes;
  const uint32_t* own_copies = Region(p.sync, kOwnCopies);
  // The first pass sweeps from the band's end: the GEMM wrote the own chunk's last rows last, so
  // they are the likeliest still in L2; the second pass then starts where the first ended.
  err = LaunchBandSum(xla_stream, a.dtype, parts, early + 1, own_out(h), chunk_elems, error, 0,
                      split ? RemoteOutputs{} : remote,
                      ArrivalWait{arrived + Slot(P, h, 0), early, e, split ? nullptr : own_copies},
                      /*from_end=*/true);
  if (err != cudaSuccess) return err;
  RecordTimelineMark(s, kFirstSumEnd, xla_stream);
  if (split) {
    // out = out + last chunk, elementwise in place (each element read before it is written, by
    // the same thread).
    const void* last[2] = {own_out(h), recv + Slot(P, h, P - 2) * chunk_bytes};
    err = LaunchBandSum(xla_stream, a.dtype, last, 2, own_out(h), chunk_elems, error, 0, remote,
                        ArrivalWait{arrived + Slot(P, h, P - 2), 1, e, own_copies});
    if (err != cudaSuccess) return err;
    RecordTimelineMark(s, kSecondSumEnd, xla_stream);
  }
  if (H > 1) {
    err = Join(xla_stream, p.sums_done, error);
    if (err != cudaSuccess) return err;
  }
  // The receive slots are free again once this is reached: the copy stream acknowledges.
  err = cudaEventRecord(job.sums_ended, xla_stream);
  if (err != cudaSuccess) {
    *error = "recording the band sums' end for the acknowledgements";
    return err;
  }
  if (!p.copy_thread) {
    err = EnqueueAcks(s, job, error);
    if (err != cudaSuccess) return err;
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
  if (groups > 0) {  // the latest call's GEMM progress (XLA may have reused the memory since)
    list("last_call_counters", host + words, groups);
    list("of", p.last_expected, groups);
  }
  return text;
}

}  // namespace fo_jax
