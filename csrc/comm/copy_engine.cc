// See copy_engine.h.
#include "comm/copy_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/abandoned_poison.h"
#include "comm/call_timeline.h"
#include "comm/copy_engine_output_pools.h"
#include "comm/stream_wait.h"
#include "comm/test_failures.h"
#include "kernels/band_sum.h"

namespace fo_jax {
namespace {

Status CreateCopyEngineState(CommState& s) {
  auto ce = std::make_shared<CopyEngineState>();
  CopyWorker& w = ce->worker;
  int least = 0, greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&w.copy_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&ce->sum_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&w.flag_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ce->sums_done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&w.flag_event, cudaEventDisableTiming);
  for (int i = 0; i < CopyWorker::kCallEvents && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&w.inputs_ready[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&w.sums_ended[i], cudaEventDisableTiming);
  }
  FO_JAX_RETURN_IF_ERROR(
      CudaStatus(e, "creating the copy, flag and sum streams and their events"));
  FO_JAX_RETURN_IF_ERROR(CreateCopyEngineBuffers(s, ce->buffers));
  ce->epoch = ce->buffers.epoch_start;  // the flags' "no call yet" (epoch_compare.h)
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&ce->release_stream, cudaStreamNonBlocking, greatest);
  }
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "creating the progress watchdog's release stream"));
  std::string err;
  FO_JAX_RETURN_IF_ERROR(LaunchStatus(LoadBandSumKernels(&err), "loading the band sums", err));
  FO_JAX_RETURN_IF_ERROR(LoadPoisonIfAbandoned());
  // At exit, before the CUDA runtime's own teardown (registered earlier, so run later): let the
  // copy workers finish enqueueing (they may still be sending a last call's acks).
  static std::once_flag at_exit_once;
  std::call_once(at_exit_once, [] {
    std::atexit([] {
      for (CommState* state : AllCommStatesForDebug()) {
        if (state->copy_engine && state->copy_engine->worker.thread) {
          (void)state->copy_engine->worker.thread->DrainFor(std::chrono::seconds(1));
        }
      }
    });
  });
  w.thread = std::make_unique<HostWorker>(s.device, ce->epoch.load());  // signals: epochs
  s.copy_engine = std::move(ce);
  return Status::Ok();
}

// For a ring call: sets the GEMM's addend to the receive slots (the partial sums of rank
// r + 1's steps 0 .. P - 2, added from logical tile-row tiles_chunk on), its flags to
// ring_arrived for the call that EnqueueCopyEngineCall enqueues next (the next epoch: this runs
// right before that GEMM, under the state's lock), its abandoned word to the rank's, and its
// tail output (the own chunk, the last) to args.out.
void SetGemmRing(CommState& s, const CopyEngineArgs& a, SignalingGemmArgs& gemm) {
  if (!a.ring) return;
  CopyEngineState& ce = *s.copy_engine;
  // Receive slot j holds rank r + 1's step j, whose logical rows are this rank's step j + 1
  // rows minus one chunk; its groups are flagged by the sender's group index, which is the
  // group of the source rows in the shared group table (SignalingGemmArgs::addend_flags).
  gemm.addend = ce.buffers.recv;
  gemm.addend_first_tile_row = a.tiles_chunk;
  gemm.addend_flags = RingArrived(ce.buffers.flags);
  gemm.addend_flag_value = ce.epoch + 1;  // EnqueueCopyEngineCall's ++epoch
  // A release of the call (the watchdog's, a failed sender's) marks it here before the flags:
  // the tiles that add a slot then add the NaN tile (SignalingGemmArgs::addend_abandoned).
  gemm.addend_abandoned = Abandoned(ce.buffers.flags);
  gemm.addend_nan = ce.buffers.nan_tile;
  gemm.tail_out = a.out;
  gemm.tail_first_tile_row = (s.nranks - 1) * a.tiles_chunk;
}

// Enqueues on `stream`: wait until every peer q has field(this rank's flags)[q] >= e.
// An all-reduce's output: P bands of two-byte elements (bf16 or fp16, fp8 calls included).
uint64_t OutputBytes(const CommState& s, const CopyEngineArgs& a) {
  return uint64_t(s.nranks) * a.band_elems * 2;
}

Status WaitForPeers(CopyEngineState& ce, cudaStream_t stream, RankFlags field, int P, int me,
                    uint32_t e) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(stream, field(ce.buffers.flags) + q, e));
  }
  return Status::Ok();
}

Status BandSum(cudaStream_t stream, GemmDtype dtype, const void* const* parts, int nparts,
               void* out, size_t count, RemoteOutputs remote = {}, ArrivalWait wait = {},
               bool from_end = false) {
  std::string err;
  return LaunchStatus(LaunchBandSum(stream, dtype, parts, nparts, out, count, &err, 0, remote,
                                    wait, from_end),
                      "band sum", err);
}

// The last round's band sums on XLA's stream, after the GEMM (whose last chunk is this rank's
// own): out = own chunk + the P - 1 received ones (slots, consecutive from `slots`), in the
// passes a.sum_split asks for. Each pass waits for its arrival flags inside the kernel, the last
// one also for this rank's own copies (they read XLA's workspace: band_sum.h); an all-reduce's
// passes also store their rows at the peers (`remote`).
Status EnqueueLastRoundSums(CommState& s, cudaStream_t stream, const CopyEngineArgs& a,
                            uint32_t e, const char* own, char* out, const char* slots,
                            RemoteOutputs remote) {
  CopyEngineState& ce = *s.copy_engine;
  const int P = s.nranks, h = a.rounds - 1;
  const size_t chunk_elems = a.band_elems / a.rounds;
  const size_t chunk_bytes = chunk_elems * 2;
  const uint32_t* arrived = Arrived(ce.buffers.flags) + Slot(P, h, 0);
  const uint32_t* own_copies = OwnCopies(ce.buffers.flags);
  const int L = LastSentChunk(P, a.rounds);
  const int pieces = a.chunk_first_group[L + 1] - a.chunk_first_group[L];
  SumSplit split = a.sum_split;
  if ((split == SumSplit::kByBands && P == 2) || (split == SumSplit::kByRows && pieces == 1)) {
    split = SumSplit::kOnePass;  // the same passes
  }
  const void* parts[kMaxCopyEngineRanks];
  if (split == SumSplit::kByRows) {
    // One pass of every part per piece of the last chunk (its groups), each once that piece
    // has landed; the first also waits for the other slots, the last for the own copies.
    const uint32_t* piece_flags = LastPieces(ce.buffers.flags);
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
      FO_JAX_RETURN_IF_ERROR(BandSum(stream, a.dtype, parts, P, out + off * 2, count, rows, wait,
                                     /*from_end=*/true));
      if (k == 0 || k + 1 == pieces) {
        RecordTimelineMark(s, k == 0 ? kFirstSumEnd : kSecondSumEnd, stream);
      }
    }
    return Status::Ok();
  }
  // kOnePass: every part once all have landed. kByBands: the chunks already there while the
  // last one is in flight, then out += last chunk (at 8192x8192x2048 the last copy ended ~30 us
  // after the GEMM; when the copies end with the GEMM one pass moves fewer bytes).
  const bool bands = split == SumSplit::kByBands;
  const int early = bands ? P - 2 : P - 1;  // received chunks summed in the first pass
  parts[0] = own;
  for (int j = 0; j < early; ++j) parts[j + 1] = slots + j * chunk_bytes;
  // The first pass sweeps from the band's end: the GEMM wrote the own chunk's last rows last, so
  // they are the likeliest still in L2; the second pass then starts where the first ended.
  FO_JAX_RETURN_IF_ERROR(BandSum(stream, a.dtype, parts, early + 1, out, chunk_elems,
                                 bands ? RemoteOutputs{} : remote,
                                 ArrivalWait{arrived, early, e, bands ? nullptr : own_copies},
                                 /*from_end=*/true));
  RecordTimelineMark(s, kFirstSumEnd, stream);
  if (!bands) return Status::Ok();
  // out = out + last chunk, elementwise in place (each element read before it is written, by
  // the same thread).
  const void* last[2] = {out, slots + (P - 2) * chunk_bytes};
  FO_JAX_RETURN_IF_ERROR(BandSum(stream, a.dtype, last, 2, out, chunk_elems, remote,
                                 ArrivalWait{arrived + P - 2, 1, e, own_copies}));
  RecordTimelineMark(s, kSecondSumEnd, stream);
  return Status::Ok();
}

}  // namespace

// Creating the copy-engine state is each rank's own work, but the address exchange that follows
// is the group's: a rank that failed here and returned would leave its partners waiting in that
// exchange. So every rank first learns every rank's outcome (AllGatherToHost of one word, which
// needs no allocation of its own), and on any failure all of
// them fail this call and keep failing later ones (copy_engine_failure: a rank that created its
// state cannot undo it, so none retries out of step with the others). A failing rank records its
// cause in the group before the gather, so that its partners in this process name it after the
// gather: a JAX call over several local GPUs raises one GPU's error, not necessarily the failing
// one's. Across processes only the failing rank's own error says why.
Status AgreeOnCopyEngineSetup(CommState& s, const Status& created) {
  auto could_not = [](int rank) {
    return "rank " + std::to_string(rank) + " of the group could not create its copy-engine state";
  };
  if (!created.ok()) FailCommGroup(s, could_not(s.rank) + ": " + created.message());
  const int32_t mine = created.ok() ? 0 : 1;
  std::vector<int32_t> all(s.nranks, 0);
  FO_JAX_RETURN_IF_ERROR(
      AllGatherToHost(s, &mine, sizeof(mine), all.data(), "copy-engine setup verdicts"));
  int failed = -1;
  for (int q = 0; q < s.nranks && failed < 0; ++q) {
    if (all[q] != 0) failed = q;
  }
  if (failed < 0) return Status::Ok();
  Status problem = created;
  if (failed != s.rank) {
    const std::string recorded = CommGroupFailure(s);
    const std::string cause = recorded.rfind(could_not(failed), 0) == 0
                                  ? recorded
                                  : could_not(failed) + " (its own error says why)";
    problem = Status::Internal(cause + "; every rank fails this call");
  }
  s.copy_engine_failure = problem.message();
  FailCommGroup(s, problem.message());
  return problem;
}

Status PrepareCopyEngineCall(CommState& s, const OverlapPlan& plan, const OverlapShape& shape,
                             void* out, SignalingGemmArgs& gemm, CopyEngineArgs* args) {
  *args = CopyEngineArgsOf(plan, shape, gemm, out);
  if (!s.copy_engine_failure.empty()) {
    return Status::Internal("the group's copy-engine setup failed earlier: " +
                            s.copy_engine_failure + "; restart the process");
  }
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(s.device), "cudaSetDevice"));
  if (!s.copy_engine) {
    const Status created =
        TestFailureAt(FailStage::kSetup, s.rank)
            ? Status::Internal("creating the copy-engine state failed " +
                               InjectedFailureMessage(FailStage::kSetup))
            : CreateCopyEngineState(s);
    FO_JAX_RETURN_IF_ERROR(AgreeOnCopyEngineSetup(s, created));
  }
  CopyEngineState& ce = *s.copy_engine;
  const size_t band_bytes = args->band_elems * 2;
  FO_JAX_RETURN_IF_ERROR(GrowCopyEngineBuffers(s, ce.buffers, (s.nranks - 1) * band_bytes));
  // An all-reduce with peers in other processes stores into their XLA outputs: their memory is
  // mapped at the group's first one.
  if (args->all_reduce && HasPeersInOtherProcesses(s, ce.buffers)) {
    FO_JAX_RETURN_IF_ERROR(MapOutputPools(s, ce.buffers, out, OutputBytes(s, *args)));
  }
  // The ring's partial sums, added by the GEMM's epilogue (their address is known only now: the
  // receive buffer may just have grown), and its own band, stored into the output.
  SetGemmRing(s, *args, gemm);
  return Status::Ok();
}

Status CheckOutputForPeers(CommState& s, const CopyEngineArgs& args) {
  if (!args.all_reduce) return Status::Ok();
  return OutputInPeersMapping(s, s.copy_engine->buffers, args.out, OutputBytes(s, args));
}

Status BuildCopyEngineGraphs(CommState& s, const CopyEngineArgs& args) {
  if (TestFailureAt(FailStage::kGraph, s.rank)) {
    return Status::Internal("building the copy graphs failed " +
                            InjectedFailureMessage(FailStage::kGraph));
  }
  return EnsureCopyGraphs(s, CopyJobFor(s.copy_engine->buffers, args))
      .Within("copy-engine transport");
}

cudaEvent_t NextInputsEvent(CommState& s) {
  CopyEngineState& ce = *s.copy_engine;
  ce.worker.thread->WaitPending(CopyWorker::kCallEvents - 1);
  return ce.worker.inputs_ready[(ce.epoch + 1) % CopyWorker::kCallEvents];
}

void DrainCopyWorker(CommState& s) {
  if (s.copy_engine) s.copy_engine->worker.thread->Drain();
}

std::string CopyWorkerFailure(CommState& s) {
  if (!s.copy_engine) return "";
  std::lock_guard<std::mutex> lock(s.copy_engine->worker.failure_mu);
  return s.copy_engine->worker.failure;
}

Status EnqueueCopyEngineCall(CommState& s, cudaStream_t xla_stream, const CopyEngineArgs& a) {
  // The plan was validated (overlap_plan.h) and prepared (PrepareCopyEngineCall).
  const int P = s.nranks, me = s.rank, H = a.rounds;
  CopyEngineState& ce = *s.copy_engine;
  CopyWorker& w = ce.worker;
  const uint32_t e = ++ce.epoch;
  ce.debug.last_counters = a.counters;
  ce.debug.last_num_groups = a.num_groups;
  std::copy(a.expected, a.expected + a.num_groups, ce.debug.last_expected);
  const uint32_t* arrived = Arrived(ce.buffers.flags);
  const size_t chunk_elems = a.band_elems / H;
  const size_t chunk_bytes = chunk_elems * 2;
  const char* ws = static_cast<const char*>(a.workspace);
  char* recv = static_cast<char*>(ce.buffers.recv);
  auto chunk = [&](int h, int b) { return ChunkOffset(P, h, b, chunk_bytes); };

  CopyJob job = CopyJobFor(ce.buffers, a);
  job.epoch = e;
  job.row = TimelineRowOfCall(s);
  job.inputs_ready = w.inputs_ready[e % CopyWorker::kCallEvents];
  job.sums_ended = w.sums_ended[e % CopyWorker::kCallEvents];
  // The copy worker waits for this call's signal before its acknowledgements (after the
  // sums_ended record below); every way out of this function gives it.
  struct SignalOnExit {
    HostWorker* worker;
    uint32_t epoch;
    ~SignalOnExit() { worker->Signal(epoch); }
  } signal_on_exit{w.thread.get(), e};
  w.thread->Push([&s, job] { RunCopyJob(s, job); });
  RecordTimelineHost(s, kHostCopiesEnqueued);

  // An all-reduce's sums also store the summed chunk into the same rows of every peer's output.
  // Every call's sums read `abandoned`: a call released by the watchdog or by a peer's failure
  // writes NaNs (band_sum.h).
  RemoteOutputs remote;
  remote.abandoned = Abandoned(ce.buffers.flags);
  remote.epoch = e;
  if (a.all_reduce) {
    remote.table = OutTable(ce.buffers.flags);
    remote.count = P - 1;
  }
  auto own_out = [&](int h) {
    return a.all_reduce ? static_cast<char*>(a.out) + chunk(h, me) : a.out;
  };

  // Rounds before the last, on the sum stream (all-reduce): once the own chunk and the P - 1
  // received ones are there, one pass sums them and stores the result here and at the peers.
  if (H > 1) {
    const cudaStream_t ss = ce.sum_stream;
    FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(ss, job.inputs_ready, 0),
                                      "sum stream waiting for XLA's inputs"));
    FO_JAX_RETURN_IF_ERROR(WaitForPeers(ce, ss, OutReady, P, me, e));
    for (int h = 0; h + 1 < H; ++h) {
      const int own = h * P + P - 1;  // logical chunk (h, step P - 1)
      for (int g = a.chunk_first_group[own]; g < a.chunk_first_group[own + 1]; ++g) {
        FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(ss, a.counters + g, a.expected[g]));
      }
      const void* parts[kMaxCopyEngineRanks];
      parts[0] = ws + chunk(h, me);
      for (int j = 0; j + 1 < P; ++j) {
        FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(ss, arrived + Slot(P, h, j), e));
        parts[j + 1] = recv + Slot(P, h, j) * chunk_bytes;
      }
      remote.offset_bytes = chunk(h, me);
      // A full grid, not one sized to the free SMs: blocks wait for SMs, so the sum speeds up
      // as soon as the GEMM ends (capped at the 8 free SMs, round 0 of 8192x8192x2048 ran
      // until after the last round's sum).
      FO_JAX_RETURN_IF_ERROR(BandSum(ss, a.dtype, parts, P, own_out(h), chunk_elems, remote));
    }
    FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ce.sums_done, ss),
                                      "recording the round sums' completion"));
  }

  // The last round on XLA's stream, after the GEMM.
  const int h = H - 1;
  RecordTimelineMark(s, kGemmEnd, xla_stream);
  if (a.ring) {
    // The GEMM summed and stored the own band; the call ends once this rank's copies, which
    // read the workspace, are done (their last group lands about when the GEMM ends).
    FO_JAX_RETURN_IF_ERROR(EnqueueWaitGeq(xla_stream, OwnCopies(ce.buffers.flags), e));
  } else {
    if (a.all_reduce) {
      FO_JAX_RETURN_IF_ERROR(WaitForPeers(ce, xla_stream, OutReady, P, me, e));
      remote.offset_bytes = chunk(h, me);
    }
    FO_JAX_RETURN_IF_ERROR(EnqueueLastRoundSums(s, xla_stream, a, e, ws + chunk(h, me),
                                                static_cast<char*>(own_out(h)),
                                                recv + Slot(P, h, 0) * chunk_bytes, remote));
    if (H > 1) {
      FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(xla_stream, ce.sums_done, 0),
                                        "joining the sum stream into XLA's stream"));
    }
  }
  // The receive slots are free again once this is reached (the band sums, or the ring's GEMM,
  // have read them): the copy stream acknowledges.
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(job.sums_ended, xla_stream),
                                    "recording the band sums' end for the acknowledgements"));
  if (a.all_reduce) {
    FO_JAX_RETURN_IF_ERROR(TellPeers(job.peer_flags, xla_stream, Stored, P, me, e));
    // An all-reduce is done when every peer's summed band has landed in this rank's output.
    FO_JAX_RETURN_IF_ERROR(WaitForPeers(ce, xla_stream, Stored, P, me, e));
    if (HasPeersInOtherProcesses(s, ce.buffers)) {
      FO_JAX_RETURN_IF_ERROR(EnqueuePoisonIfAbandoned(xla_stream, Abandoned(ce.buffers.flags), e,
                                                      a.out, OutputBytes(s, a)));
    }
  }
  RecordTimelineMark(s, kCallEnd, xla_stream);
  return Status::Ok();
}

}  // namespace fo_jax
