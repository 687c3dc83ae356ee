// See peer_copies.h.
#include "comm/peer_copies.h"

#include <algorithm>
#include <mutex>

#include "comm/call_timeline.h"
#include "comm/stream_wait.h"

namespace fo_jax {

cudaError_t TellPeers(uint32_t* const* peer_sync, cudaStream_t stream, PeerSyncRegion region,
                      int P, int me, uint32_t e, std::string* error) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    cudaError_t err = EnqueueWriteValue(stream, Region(peer_sync[q], region) + me, e, error);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

namespace {

cudaError_t CopyError(cudaError_t e, std::string* error) {
  *error = CudaMessage("copy between GPUs", e);
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
  cudaError_t err = EnqueueWaitGeq(p.copy_stream, a.counters + g, a.expected[g], error);
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

// Visits a call's copies in order: round h, step j sends chunk (h, (me + 1 + j) % P) to its
// owner's slot (the ring: to rank me - 1's slot j), group by group. Calls step(h, j, to, true) before a step's copies, copy(g, index,
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
      const int to = a.ring ? (me + P - 1) % P : (me + 1 + j) % P;
      const int L = h * P + j;  // logical chunk
      cudaError_t err = step(h, j, to, true);
      if (err != cudaSuccess) return err;
      char* dst = static_cast<char*>(job.peer_recv[to]) + Slot(P, h, j) * chunk_bytes;
      const char* src = ws + ChunkOffset(P, h, (me + 1 + j) % P, chunk_bytes);
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

// Where the copy stream's flags are written: on the copy stream itself, or (separate) on the
// flag stream once it has waited for the copies enqueued so far (Fence), so that the copy
// stream's next copy does not queue behind the flag's write (a write fences the stream's earlier
// memory operations, stream_wait.h; the event orders the flag stream after the copies).
struct FlagWriter {
  PeerState& p;
  bool separate;
  std::string* error;

  cudaStream_t stream() const { return separate ? p.flag_stream : p.copy_stream; }
  cudaError_t Fence() {
    if (!separate) return cudaSuccess;
    cudaError_t e = cudaEventRecord(p.flag_event, p.copy_stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(p.flag_stream, p.flag_event, 0);
    if (e != cudaSuccess) *error = "ordering the flag stream after the copies";
    return e;
  }
  cudaError_t Write(uint32_t* address, uint32_t value) {
    return EnqueueWriteValue(stream(), address, value, error);
  }
};

// After a failure while enqueueing a call's copy-stream work: what its partners and its own
// band sum wait for, so that nobody hangs (the call's data is undefined; the failure is
// reported by every later call). Not the output addresses of an all-reduce: a peer that went on
// without this rank's address would store into memory it does not own, so it waits instead.
void ReleaseAfterFailure(CommState& s, const CopyJob& job) {
  PeerState& p = *s.peer;
  const int P = s.nranks, me = s.rank;
  const bool by_rows = job.a.sum_split == SumSplit::kByRows;
  std::string ignored;
  auto flag = [&](int h, int j, int to, bool begin) {
    if (!begin && !job.a.ring) {
      (void)EnqueueWriteValue(p.copy_stream, Region(job.peer_sync[to], kArrived) + Slot(P, h, j),
                              job.epoch, &ignored);
    }
    return cudaSuccess;
  };
  auto piece = [&](int g, int, int, int to, char*, const char*, size_t) {
    if (job.a.ring) {
      (void)EnqueueWriteValue(p.copy_stream, Region(job.peer_sync[to], kRingArrived) + g,
                              job.epoch, &ignored);
      return cudaSuccess;
    }
    const int k = LastChunkPiece(job.a, P, g);
    if (by_rows && k >= 0) {
      (void)EnqueueWriteValue(p.copy_stream, Region(job.peer_sync[to], kLastPieces) + k,
                              job.epoch, &ignored);
    }
    return cudaSuccess;
  };
  (void)ForEachCopy(job, P, me, flag, piece);
  (void)EnqueueWriteValue(p.copy_stream, Region(p.sync, kOwnCopies), job.epoch, &ignored);
  (void)cudaStreamWaitEvent(p.copy_stream, job.sums_ended, 0);
  (void)TellPeers(job.peer_sync, p.copy_stream, kRecvAcked, P, me, job.epoch, &ignored);
  (void)cudaGetLastError();
}

void NoteCopyFailure(PeerState& p, const std::string& what) {
  std::lock_guard<std::mutex> lock(p.failure_mu);
  if (p.copy_failure.empty()) p.copy_failure = "copy-engine transport (copy thread): " + what;
}

}  // namespace

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
      *error = CudaMessage("creating the graph of a copy between GPUs", err);
      return err;
    }
    std::lock_guard<std::mutex> graphs(p.graph_mu);
    PublishCopyGraph(p, to, k, built, dst, src, bytes);  // only XLA's thread fills slots
    return cudaSuccess;
  };
  return ForEachCopy(job, s.nranks, s.rank, step, copy);
}

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
  // A step's receiver must have finished reading the previous call's slots. The direct form
  // waits for every receiver before its first copy: that could hold the whole chain for the
  // slowest one, but saves a wait at each step boundary, and the first copy rarely starts
  // before they are in. The ring has one receiver, awaited before its first step.
  auto wait_ack = [&](int to) {
    return EnqueueWaitGeq(cs, Region(p.sync, kRecvAcked) + to, e - 1, error);
  };
  if (!a.ring) {
    for (int j = 0; j + 1 < P && err == cudaSuccess; ++j) err = wait_ack((me + 1 + j) % P);
    if (err != cudaSuccess) return err;
    RecordTimelineMarkAt(s, job.row, kCopyAcked, cs);
  }
  // The flags of every step but the last go on the flag stream (PeerState::flag_stream).
  FlagWriter flags{p, true, error}, inline_flags{p, false, error};
  const int last = LastSentChunk(P, H);
  const bool by_rows = !a.ring && a.sum_split == SumSplit::kByRows;
  auto step = [&](int h, int j, int to, bool begin) {
    cudaError_t r = cudaSuccess;
    if (begin) {
      if (h == 0 && a.ring && j == 0) {  // the ring's one receiver: once
        r = wait_ack(to);
        if (r == cudaSuccess && j == 0) RecordTimelineMarkAt(s, job.row, kCopyAcked, cs);
      }
      return r;
    }
    const bool last_step = h * P + j == last;
    if (a.ring) {  // its groups were flagged as they landed (copy below)
      if (j < kTimelineCopySlots) {
        RecordTimelineMarkAt(s, job.row, TimelineMark(kCopySent0 + j),
                             last_step ? cs : flags.stream());
      }
      return r;
    }
    // The last step's flags stay on the copy stream, which has nothing left to do: the flag
    // stream's event adds ~5 us between a copy's end and its flag (results/
    // timeline_probe_tp4_2026-11-22_a349b20.log), and the call's last sums wait for these.
    FlagWriter& w = last_step ? inline_flags : flags;
    r = w.Fence();
    if (r == cudaSuccess && last_step && by_rows) {  // the step's last piece (the others: copy)
      const int pieces = a.chunk_first_group[last + 1] - a.chunk_first_group[last];
      r = w.Write(Region(job.peer_sync[to], kLastPieces) + pieces - 1, e);
    }
    if (r == cudaSuccess) r = w.Write(Region(job.peer_sync[to], kArrived) + Slot(P, h, j), e);
    if (r == cudaSuccess && h == H - 1 && j < kTimelineCopySlots) {
      RecordTimelineMarkAt(s, job.row, TimelineMark(kCopySent0 + j), w.stream());
    }
    // After the call's last copy: this rank's own copies are done (its last band sum waits).
    if (r == cudaSuccess && last_step) r = w.Write(Region(p.sync, kOwnCopies), e);
    return r;
  };
  auto copy = [&](int g, int index, int ordinal, int to, char* dst, const char* src,
                  size_t bytes) {
    cudaError_t r = GatedCopy(s, a, job.row, g, index, ordinal, to, dst, src, bytes, error);
    if (r == cudaSuccess && a.ring) {
      // Each group's flag as soon as it lands (the receiver's GEMM waits for it); the last
      // group's on the copy stream, which has nothing left to do, followed by this rank's own
      // copies being done (XLA's stream waits for that: the copies read its workspace).
      const bool last_group = g + 1 == a.chunk_first_group[last + 1];
      FlagWriter& w = last_group ? inline_flags : flags;
      r = w.Fence();
      if (r == cudaSuccess) r = w.Write(Region(job.peer_sync[to], kRingArrived) + g, e);
      if (r == cudaSuccess && last_group) r = w.Write(Region(p.sync, kOwnCopies), e);
      return r;
    }
    // kByRows: each piece of the last step but its last is flagged as soon as it lands (the
    // last one with the step's flag).
    if (r == cudaSuccess && by_rows && g >= a.chunk_first_group[last] &&
        g + 1 < a.chunk_first_group[last + 1]) {
      r = flags.Fence();
      if (r == cudaSuccess) {
        r = flags.Write(Region(job.peer_sync[to], kLastPieces) + g - a.chunk_first_group[last],
                        e);
      }
    }
    return r;
  };
  return ForEachCopy(job, P, me, step, copy);
}

cudaError_t EnqueueAcks(CommState& s, const CopyJob& job, std::string* error) {
  // On the copy stream, idle by then, not on XLA's: results/overlap_profile_tp4_2026-11-21_
  // fe573db.log, 11 us between the sum and the next call's GEMM.
  PeerState& p = *s.peer;
  cudaError_t err = cudaStreamWaitEvent(p.copy_stream, job.sums_ended, 0);
  if (err != cudaSuccess) {
    *error = "copy stream waiting for the band sums";
    return err;
  }
  return TellPeers(job.peer_sync, p.copy_stream, kRecvAcked, s.nranks, s.rank, job.epoch, error);
}

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

}  // namespace fo_jax
