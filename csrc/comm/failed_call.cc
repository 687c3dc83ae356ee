// See failed_call.h.
#include "comm/failed_call.h"

#include "comm/copy_engine.h"
#include "comm/stream_wait.h"

namespace fo_jax {

std::vector<FlagRelease> FailedCallReleases(const CopyEngineArgs& a, int P, int me,
                                            FailedPart part) {
  std::vector<FlagRelease> out;
  const bool copy_part = part != FailedPart::kXlaStream;
  const bool xla_part = part != FailedPart::kCopyStream;
  auto each_peer = [&](FlagWord word) {
    for (int q = 0; q < P; ++q) {
      if (q != me) out.push_back({q, word, me});
    }
  };
  // The copy worker's part (copy_engine_worker.cc, EnqueueCopies): an all-reduce's output
  // address first, then per step (round h, step j, logical chunk h * P + j) its flags.
  if (copy_part && a.all_reduce) each_peer(FlagWord::kOutReady);
  if (copy_part) {
    const int last = LastSentChunk(P, a.rounds);
    const bool by_rows = !a.ring && a.sum_split == SumSplit::kByRows;
    for (int h = 0; h < a.rounds; ++h) {
      for (int j = 0; j + 1 < P; ++j) {
        const int to = a.ring ? (me + P - 1) % P : (me + 1 + j) % P;
        const int L = h * P + j;
        if (a.ring) {  // each group's flag, by its group index
          for (int g = a.chunk_first_group[L]; g < a.chunk_first_group[L + 1]; ++g) {
            out.push_back({to, FlagWord::kRingArrived, g});
          }
          continue;
        }
        if (L == last && by_rows) {  // each piece of the last step, then the step's flag
          for (int k = 0; k < a.chunk_first_group[L + 1] - a.chunk_first_group[L]; ++k) {
            out.push_back({to, FlagWord::kLastPieces, k});
          }
        }
        out.push_back({to, FlagWord::kArrived, Slot(P, h, j)});
      }
    }
  }
  // XLA's stream after the band sums (copy_engine.cc, EnqueueCopyEngineCall): an all-reduce's
  // summed band is in every peer's output.
  if (xla_part && a.all_reduce) each_peer(FlagWord::kStored);
  // The copy worker, once the sums have read the receive slots: they are free again.
  if (copy_part) each_peer(FlagWord::kRecvAcked);
  return out;
}

uint32_t* FlagWordAddress(CopyEngineFlags* flags, const FlagRelease& r) {
  switch (r.word) {
    case FlagWord::kOutReady: return OutReady(flags) + r.index;
    case FlagWord::kArrived: return Arrived(flags) + r.index;
    case FlagWord::kLastPieces: return LastPieces(flags) + r.index;
    case FlagWord::kRingArrived: return RingArrived(flags) + r.index;
    case FlagWord::kStored: return Stored(flags) + r.index;
    case FlagWord::kRecvAcked: return RecvAcked(flags) + r.index;
  }
  return nullptr;
}

namespace {

void Keep(Status& first, const Status& s) {
  if (first.ok() && !s.ok()) first = s;
}

}  // namespace

Status EnqueueReleases(cudaStream_t stream, CopyEngineFlags* const* peer_flags, int P, int me,
                       const std::vector<FlagRelease>& releases, uint32_t epoch,
                       const uint64_t* out_at_peer, cudaEvent_t before_acks) {
  Status first = Status::Ok();
  bool waited = before_acks == nullptr;
  for (const FlagRelease& r : releases) {
    CopyEngineFlags* flags = peer_flags[r.peer];
    if (r.word == FlagWord::kOutReady) {
      // Out table slot j of rank q holds the address of rank (q + 1 + j) % P, as the healthy
      // path writes it (copy_engine_worker.cc, SendOutputAddress).
      const uint64_t address = out_at_peer[r.peer];
      auto* words = reinterpret_cast<uint32_t*>(OutTable(flags) + (me - r.peer - 1 + P) % P);
      Keep(first, EnqueueWriteValue(stream, words, uint32_t(address)));
      Keep(first, EnqueueWriteValue(stream, words + 1, uint32_t(address >> 32)));
    }
    if (r.word == FlagWord::kRecvAcked && !waited) {
      Keep(first, CudaStatus(cudaStreamWaitEvent(stream, before_acks, 0),
                             "waiting for the band sums before the acknowledgements"));
      waited = true;
    }
    Keep(first, EnqueueWriteValue(stream, FlagWordAddress(flags, r), epoch));
  }
  return first;
}

Status EnqueueMarkAbandoned(cudaStream_t stream, CopyEngineFlags* const* peer_flags,
                            CopyEngineFlags* own_flags, const std::vector<FlagRelease>& releases,
                            uint32_t epoch) {
  Status first = Status::Ok();
  if (own_flags != nullptr) Keep(first, EnqueueWriteValue(stream, Abandoned(own_flags), epoch));
  bool marked[kMaxCopyEngineRanks] = {};
  for (const FlagRelease& r : releases) {
    if (marked[r.peer]) continue;
    marked[r.peer] = true;
    Keep(first, EnqueueWriteValue(stream, Abandoned(peer_flags[r.peer]), epoch));
  }
  return first;
}

Status EnqueueFailedCallWrites(cudaStream_t stream, CopyEngineFlags* const* peer_flags,
                               CopyEngineFlags* own_flags, int P, int me,
                               const std::vector<FlagRelease>& releases, uint32_t epoch,
                               const uint64_t* out_at_peer, cudaEvent_t before_acks) {
  std::vector<FlagRelease> awaited, acks;
  for (const FlagRelease& r : releases) {
    (r.word == FlagWord::kRecvAcked ? acks : awaited).push_back(r);
  }
  Status first = EnqueueMarkAbandoned(stream, peer_flags, own_flags, releases, epoch);
  Keep(first, EnqueueReleases(stream, peer_flags, P, me, awaited, epoch, out_at_peer));
  if (own_flags != nullptr) Keep(first, EnqueueWriteValue(stream, OwnCopies(own_flags), epoch));
  Keep(first, EnqueueReleases(stream, peer_flags, P, me, acks, epoch, out_at_peer, before_acks));
  return first;
}

void ReleaseOnCopyStream(CommState& s, const CopyJob& job, FailedPart part) {
  CopyWorker& w = s.copy_engine->worker;
  const cudaStream_t cs = w.copy_stream;
  // After this call's start on XLA's stream, and after the flag stream's writes of earlier
  // calls (and of this one's, before the failure): the copy stream's own are before it anyway.
  (void)cudaStreamWaitEvent(cs, job.inputs_ready, 0);
  (void)cudaEventRecord(w.flag_event, w.flag_stream);
  (void)cudaStreamWaitEvent(cs, w.flag_event, 0);
  (void)EnqueueFailedCallWrites(cs, job.peer_flags, s.copy_engine->buffers.flags, s.nranks,
                                s.rank, FailedCallReleases(job.a, s.nranks, s.rank, part),
                                job.epoch, job.out_at_peer, job.sums_ended);
  (void)cudaGetLastError();
}

Status ReleaseFailedCopyEngineCall(CommState& s, cudaStream_t xla_stream, const CopyEngineArgs& a,
                                   FailedPart part, const Status& cause) {
  CopyEngineState& ce = *s.copy_engine;
  const int P = s.nranks, me = s.rank;
  Status released = Status::Ok();
  uint32_t e = ce.epoch;  // kXlaStream: EnqueueCopyEngineCall took it
  if (part == FailedPart::kWholeCall) {
    // The epoch this call would have had; the peers' call of that epoch waits for its words.
    const cudaEvent_t ready = NextInputsEvent(s);
    e = ++ce.epoch;
    released = CudaStatus(cudaEventRecord(ready, xla_stream), "recording the failed call's start");
    CopyJob job = CopyJobFor(ce.buffers, a);
    job.epoch = e;
    job.inputs_ready = ready;
    ce.worker.thread->Push([&s, job] { ReleaseOnCopyStream(s, job, FailedPart::kWholeCall); });
  } else {
    const std::vector<FlagRelease> releases = FailedCallReleases(a, P, me, part);
    released = EnqueueMarkAbandoned(xla_stream, ce.buffers.peer_flags, nullptr, releases, e);
    uint64_t out_at_peer[kMaxCopyEngineRanks] = {};
    OutputAddressesForPeers(ce.buffers, P, a.out, out_at_peer);
    Keep(released,
         EnqueueReleases(xla_stream, ce.buffers.peer_flags, P, me, releases, e, out_at_peer));
  }
  if (a.all_reduce) {
    // The peers store their summed bands into a.out (this call's output, whose address the
    // release gave them) until they write `stored`: the call ends after that.
    for (int q = 0; q < P; ++q) {
      if (q != me) Keep(released, EnqueueWaitGeq(xla_stream, Stored(ce.buffers.flags) + q, e));
    }
  }
  const std::string what = cause.message() + " (rank " + std::to_string(me) + " of " +
                           std::to_string(P) + ", copy-engine call " + std::to_string(e) + ")";
  FailCommGroup(s, "copy-engine transport: " + what);
  std::string message = "copy-engine transport: " + what +
                        "; this call released the flags the group's other ranks wait for "
                        "(every rank's output of this call is undefined) and failed the group: "
                        "restart the process";
  if (!released.ok()) {
    message += "; releasing them also failed (" + released.message() +
               "): the other ranks may wait";
  }
  return Status::Internal(message);
}

}  // namespace fo_jax
