// See copy_engine_worker.h.
#include "comm/copy_engine_worker.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "comm/call_timeline.h"
#include "comm/copy_engine.h"
#include "comm/failed_call.h"
#include "comm/stream_wait.h"
#include "comm/test_failures.h"

namespace fo_jax {

CopyJob CopyJobFor(const CopyEngineBuffers& b, const CopyEngineArgs& a) {
  CopyJob job;
  job.a = a;
  std::copy(b.peer_recv, b.peer_recv + kMaxCopyEngineRanks, job.peer_recv);
  std::copy(b.peer_flags, b.peer_flags + kMaxCopyEngineRanks, job.peer_flags);
  OutputAddressesForPeers(b, kMaxCopyEngineRanks, a.out, job.out_at_peer);
  return job;
}

Status TellPeers(CopyEngineFlags* const* peer_flags, cudaStream_t stream, RankFlags field, int P,
                 int me, uint32_t e) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(stream, field(peer_flags[q]) + me, e));
  }
  return Status::Ok();
}

namespace {

// On the copy stream: once counters[g] is full, copy `bytes` from src to peer `to`'s dst, the
// call's `ordinal`-th copy to that peer (copy_engine_graphs.h). (Two halves on two copy streams
// measured no faster.) `index`: the copy's place in the call (timeline marks).
Status GatedCopy(CommState& s, const CopyEngineArgs& a, int row, int g, int index, int ordinal,
                 int to, char* dst, const char* src, size_t bytes) {
  CopyEngineState& ce = *s.copy_engine;
  const cudaStream_t stream = ce.worker.copy_stream;
  FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(stream, a.counters + g, a.expected[g]));
  const bool marked = index < kTimelineCopySlots;
  if (marked) RecordTimelineMarkAt(s, row, TimelineMark(kCopyGo0 + index), stream);
  FO_JAX_RETURN_IF_ERROR(LaunchCopyGraph(ce.graphs, to, ordinal, dst, src, bytes, stream));
  if (marked) RecordTimelineMarkAt(s, row, TimelineMark(kCopyDone0 + index), stream);
  return Status::Ok();
}

// Visits a call's copies in order: round h, step j sends chunk (h, (me + 1 + j) % P) to its
// owner's slot (the ring: to rank me - 1's slot j), group by group. Calls step(h, j, to, true)
// before a step's copies, copy(g, index, ordinal, to, dst, src, bytes) for each (index: its
// place in the call, ordinal: its place among the call's copies to that peer) and
// step(h, j, to, false) after them; stops at the first error.
template <class Step, class Copy>
Status ForEachCopy(const CopyJob& job, int P, int me, Step&& step, Copy&& copy) {
  const CopyEngineArgs& a = job.a;
  const size_t chunk_bytes = a.band_elems / a.rounds * 2;
  const size_t tile_row_bytes = a.tile_row_elems * 2;
  const char* ws = static_cast<const char*>(a.workspace);
  int index = 0;                         // copies so far in this call, and
  int sent_to[kMaxCopyEngineRanks] = {};  // to each peer
  for (int h = 0; h < a.rounds; ++h) {
    for (int j = 0; j + 1 < P; ++j) {
      const int to = a.ring ? (me + P - 1) % P : (me + 1 + j) % P;
      const int L = h * P + j;  // logical chunk
      FO_JAX_RETURN_IF_ERROR(step(h, j, to, true));
      char* dst = static_cast<char*>(job.peer_recv[to]) + Slot(P, h, j) * chunk_bytes;
      const char* src = ws + ChunkOffset(P, h, (me + 1 + j) % P, chunk_bytes);
      for (int g = a.chunk_first_group[L]; g < a.chunk_first_group[L + 1]; ++g) {
        const size_t at = size_t(a.group_begin[g] - L * a.tiles_chunk) * tile_row_bytes;
        const size_t bytes = size_t(a.group_begin[g + 1] - a.group_begin[g]) * tile_row_bytes;
        FO_JAX_RETURN_IF_ERROR(copy(g, index++, sent_to[to]++, to, dst + at, src + at, bytes));
      }
      FO_JAX_RETURN_IF_ERROR(step(h, j, to, false));
    }
  }
  return Status::Ok();
}

// All-reduce: writes this call's output address, as peer q addresses it (out_at_peer[q]), into
// every peer's out table (slot j of rank q holds the address of rank (q + 1 + j) % P) and flags
// it with the epoch. The peer's band sum reads it on the GPU; the address stays valid until this
// rank's call ends, which waits for the peer's `stored` flag (written after that sum).
Status SendOutputAddress(CopyEngineFlags* const* peer_flags, cudaStream_t stream,
                         const uint64_t* out_at_peer, int P, int me, uint32_t e) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    const uint64_t address = out_at_peer[q];
    const int slot = (me - q - 1 + P) % P;
    auto* words = reinterpret_cast<uint32_t*>(OutTable(peer_flags[q]) + slot);
    FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(stream, words, uint32_t(address)));
    FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(stream, words + 1, uint32_t(address >> 32)));
    FO_JAX_RETURN_IF_ERROR(EnqueueWriteValue(stream, OutReady(peer_flags[q]) + me, e));
  }
  return Status::Ok();
}

// Where the copy stream's flags are written: on the copy stream itself, or (separate) on the
// flag stream once it has waited for the copies enqueued so far (Fence), so that the copy
// stream's next copy does not queue behind the flag's write (a write fences the stream's earlier
// memory operations, stream_wait.h; the event orders the flag stream after the copies).
struct FlagWriter {
  CopyWorker& w;
  bool separate;

  cudaStream_t stream() const { return separate ? w.flag_stream : w.copy_stream; }
  Status Fence() {
    if (!separate) return Status::Ok();
    cudaError_t e = cudaEventRecord(w.flag_event, w.copy_stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(w.flag_stream, w.flag_event, 0);
    return CudaStatus(e, "ordering the flag stream after the copies");
  }
  Status Write(uint32_t* address, uint32_t value) {
    return EnqueueWriteValue(stream(), address, value);
  }
};

// The first failure, kept for this rank (CopyWorkerFailure) and for the group, so that every
// later call of every rank raises.
void NoteCopyFailure(CommState& s, const std::string& what) {
  CopyWorker& w = s.copy_engine->worker;
  const std::string failure = "copy-engine transport (copy thread of rank " +
                              std::to_string(s.rank) + "): " + what;
  {
    std::lock_guard<std::mutex> lock(w.failure_mu);
    if (w.failure.empty()) w.failure = failure;
  }
  FailCommGroup(s, failure);
}

// The copies of the call, their flags and the own-copies flag (copy_engine_worker.h).
Status EnqueueCopies(CommState& s, const CopyJob& job) {
  CopyEngineState& ce = *s.copy_engine;
  CopyWorker& w = ce.worker;
  const CopyEngineArgs& a = job.a;
  const int P = s.nranks, me = s.rank, H = a.rounds;
  const uint32_t e = job.epoch;
  const cudaStream_t cs = w.copy_stream;
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(cs, job.inputs_ready, 0),
                                    "copy stream waiting for XLA's inputs"));
  RecordTimelineMarkAt(s, job.row, kCopyInputs, cs);
  if (a.all_reduce) {
    FO_JAX_RETURN_IF_ERROR(SendOutputAddress(job.peer_flags, cs, job.out_at_peer, P, me, e));
  }
  // A step's receiver must have finished reading the previous call's slots. The direct form
  // waits for every receiver before its first copy: that could hold the whole chain for the
  // slowest one, but saves a wait at each step boundary, and the first copy rarely starts
  // before they are in. The ring has one receiver, awaited before its first step.
  auto wait_ack = [&](int to) {
    return EnqueueWaitGeq(cs, RecvAcked(ce.buffers.flags) + to, e - 1);
  };
  if (!a.ring) {
    for (int j = 0; j + 1 < P; ++j) FO_JAX_RETURN_IF_ERROR(wait_ack((me + 1 + j) % P));
    RecordTimelineMarkAt(s, job.row, kCopyAcked, cs);
  }
  // The flags of every step but the last go on the flag stream (CopyWorker::flag_stream).
  FlagWriter flags{w, true}, inline_flags{w, false};
  const int last = LastSentChunk(P, H);
  const bool by_rows = !a.ring && a.sum_split == SumSplit::kByRows;
  auto step = [&](int h, int j, int to, bool begin) -> Status {
    if (begin) {
      if (h == 0 && a.ring && j == 0) {  // the ring's one receiver: once
        FO_JAX_RETURN_IF_ERROR(wait_ack(to));
        RecordTimelineMarkAt(s, job.row, kCopyAcked, cs);
      }
      return Status::Ok();
    }
    const bool last_step = h * P + j == last;
    if (a.ring) {  // its groups were flagged as they landed (copy below)
      if (j < kTimelineCopySlots) {
        RecordTimelineMarkAt(s, job.row, TimelineMark(kCopySent0 + j),
                             last_step ? cs : flags.stream());
      }
      return Status::Ok();
    }
    // The last step's flags stay on the copy stream, which has nothing left to do: the flag
    // stream's event adds ~5 us between a copy's end and its flag, and the call's last sums
    // wait for these.
    FlagWriter& fw = last_step ? inline_flags : flags;
    FO_JAX_RETURN_IF_ERROR(fw.Fence());
    if (last_step && by_rows) {  // the step's last piece (the others: copy)
      const int pieces = a.chunk_first_group[last + 1] - a.chunk_first_group[last];
      FO_JAX_RETURN_IF_ERROR(fw.Write(LastPieces(job.peer_flags[to]) + pieces - 1, e));
    }
    FO_JAX_RETURN_IF_ERROR(fw.Write(Arrived(job.peer_flags[to]) + Slot(P, h, j), e));
    if (h == H - 1 && j < kTimelineCopySlots) {
      RecordTimelineMarkAt(s, job.row, TimelineMark(kCopySent0 + j), fw.stream());
    }
    // After the call's last copy: this rank's own copies are done (its last band sum waits).
    if (last_step) FO_JAX_RETURN_IF_ERROR(fw.Write(OwnCopies(ce.buffers.flags), e));
    return Status::Ok();
  };
  auto copy = [&](int g, int index, int ordinal, int to, char* dst, const char* src,
                  size_t bytes) -> Status {
    FO_JAX_RETURN_IF_ERROR(GatedCopy(s, a, job.row, g, index, ordinal, to, dst, src, bytes));
    if (a.ring) {
      // Each group's flag as soon as it lands (the receiver's GEMM waits for it); the last
      // group's on the copy stream, which has nothing left to do, followed by this rank's own
      // copies being done (XLA's stream waits for that: the copies read its workspace).
      const bool last_group = g + 1 == a.chunk_first_group[last + 1];
      FlagWriter& fw = last_group ? inline_flags : flags;
      FO_JAX_RETURN_IF_ERROR(fw.Fence());
      FO_JAX_RETURN_IF_ERROR(fw.Write(RingArrived(job.peer_flags[to]) + g, e));
      if (last_group) FO_JAX_RETURN_IF_ERROR(fw.Write(OwnCopies(ce.buffers.flags), e));
      return Status::Ok();
    }
    // kByRows: each piece of the last step but its last is flagged as soon as it lands (the
    // last one with the step's flag).
    if (by_rows && g >= a.chunk_first_group[last] && g + 1 < a.chunk_first_group[last + 1]) {
      FO_JAX_RETURN_IF_ERROR(flags.Fence());
      FO_JAX_RETURN_IF_ERROR(
          flags.Write(LastPieces(job.peer_flags[to]) + g - a.chunk_first_group[last], e));
    }
    return Status::Ok();
  };
  return ForEachCopy(job, P, me, step, copy);
}

// On the copy stream, once XLA's stream has read the receive slots (the call's last band sum):
// acknowledge to every sender that they are free again. On the copy stream, idle by then, not
// on XLA's: there they put ~11 us between the sum and the next call's GEMM.
Status EnqueueAcks(CommState& s, const CopyJob& job) {
  const cudaStream_t cs = s.copy_engine->worker.copy_stream;
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(cs, job.sums_ended, 0),
                                    "copy stream waiting for the band sums"));
  return TellPeers(job.peer_flags, cs, RecvAcked, s.nranks, s.rank, job.epoch);
}

}  // namespace

Status EnsureCopyGraphs(CommState& s, const CopyJob& job) {
  CopyGraphs& graphs = s.copy_engine->graphs;
  auto step = [](int, int, int, bool) { return Status::Ok(); };
  auto copy = [&](int, int, int ordinal, int to, char* dst, const char* src, size_t bytes) {
    return EnsureCopyGraph(graphs, to, ordinal, dst, src, bytes);
  };
  return ForEachCopy(job, s.nranks, s.rank, step, copy);
}

void RunCopyJob(CommState& s, const CopyJob& job) {
  CopyWorker& w = s.copy_engine->worker;
  Status status = TestFailureAt(FailStage::kCopy, s.rank)
                      ? Status::Internal("enqueueing the copies failed " +
                                         InjectedFailureMessage(FailStage::kCopy))
                      : EnqueueCopies(s, job);
  RecordTimelineHostAt(s, job.row, kHostCopiesIssued);
  w.thread->AwaitSignal(job.epoch);  // the call recorded job.sums_ended (or failed)
  if (status.ok()) status = EnqueueAcks(s, job);
  if (!status.ok()) {
    NoteCopyFailure(s, status.message());
    // What the call's partners and its own band sum wait for (failed_call.h).
    ReleaseOnCopyStream(s, job, FailedPart::kCopyStream);
  }
}

}  // namespace fo_jax
