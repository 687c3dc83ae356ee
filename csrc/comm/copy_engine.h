// The copy-engine transport (docs/design.md, "The copy-engine transport"): instead of NCCL's
// collective kernels, the bytes move as copy-engine writes straight into the other GPUs' memory,
// so the GEMM keeps every SM. Rank r's GEMM visits its output by destination band: r+1, r+2,
// ..., r+P-1, then its own band last (a tile-row rotation). Step j copies the band for rank
// (r+1+j) % P into that rank's receive slot j, group by group as the groups' counters fill (a
// band is one or more groups); all ranks together form a permutation per step (each GPU sends to
// one peer and receives from one). The own band needs no communication; band-sum kernels on
// XLA's stream add the P - 1 received bands to it (in one pass; or those already there while the
// last one is in flight, then the last; or one pass of all of them per piece of the last band,
// as each piece lands: SumSplit). That is the reduce-scatter.
//
// The ring reduce-scatter (CopyEngineArgs::ring) needs no sums after the GEMM: band b is
// computed by rank b + 1 at step 0, by rank b + 2 at step 1 (which adds what rank b + 1
// computed, in the GEMM's epilogue: SignalingGemmArgs' addend), ..., and by rank b itself last,
// whose epilogue adds the partial sum of the other P - 1 ranks and stores the band straight into
// the output (SignalingGemmArgs::tail_out). So every rank sends each of its first P - 1 steps to
// rank r - 1, group by group (receive slot j, flag ring_arrived[g] after each group's copy), and
// the GEMM's epilogue waits for each group's flag before it loads those rows. The bytes sent are
// the same as the direct form's (P - 1 bands); what goes is the ~60 us of band sums after the
// GEMM.
//
// All-reduce = that reduce-scatter with the GEMM writing straight into the output, then an
// all-gather by the SMs (idle once the GEMM is done): the last band-sum pass stores the summed
// band into the same rows of every peer's output over NVLink, then flags it. An output is this
// call's XLA buffer, whose address only its rank knows: each rank writes it into every peer's
// out table on the GPU (stream memory operations) at the start of the call, and the sum kernel
// reads it there. (Copy-engine pulls from a published copy ran at 145-190 GB/s, SM loads at
// ~280, these stores at ~355: docs/performance.md.) To overlap that all-gather with the GEMM, an
// all-reduce may visit its output in rounds of P chunks (CopyEngineArgs::rounds): the sums and
// stores of every round but the last run on a second stream during the GEMM.
//
// Synchronization uses stream memory operations (no SM), never spin kernels (a spin kernel on the
// copy stream needs an SM while the band sums that wait for its copies hold them: that hung at
// TP=4): cuStreamWaitValue32 on the GEMM's counters and on arrival flags, cuStreamWriteValue32 to
// a peer's flag after the copy (the write fences the copy: stream_wait.h); the band sums that
// follow the GEMM wait for their arrival flags inside the kernel instead (band_sum.h), the last of
// them also for this rank's own copies (a local flag the copy stream writes after them: they read
// XLA's workspace). Flags carry a per-call epoch, so they are never reset (copy_engine_flags.h).
// An acknowledgement word per sender (written after the band sum) keeps a sender from
// overwriting a receive slot that its owner still reads from the previous call. An all-reduce
// call ends only when every peer's band has landed in its output, so an output address in a
// peer's table stays valid for as long as that peer may write to it.
//
// The state is split by role: its memory and the peers' addresses (copy_engine_buffers.h), the
// copy graphs (copy_engine_graphs.h), the copy worker that enqueues the copy stream's part of a
// call (copy_engine_worker.h), diagnostics (copy_engine_debug.h); this file holds them together
// and enqueues a call's XLA-stream part (the band sums).
//
// Scope: all ranks of the group in one process (JAX's one-process-per-host mode), or for the
// reduce-scatter processes of one host whose memory is shared through CUDA IPC
// (peer_memory_ipc.h), with peer access between every pair of GPUs (NVLink/NVSwitch machines);
// otherwise the NCCL transport is used.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "comm/comm_registry.h"
#include "comm/copy_engine_args.h"
#include "comm/copy_engine_buffers.h"
#include "comm/copy_engine_debug.h"
#include "comm/copy_engine_graphs.h"
#include "comm/copy_engine_worker.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// Per communicator (CommState::copy_engine), created on its first copy-engine call.
struct CopyEngineState {
  CopyEngineBuffers buffers;
  CopyGraphs graphs;
  CopyWorker worker;
  CopyEngineDebug debug;
  cudaStream_t sum_stream = nullptr;  // all-reduce rounds before the last (highest priority)
  cudaEvent_t sums_done = nullptr;    // recorded on the sum stream after those rounds
  // The progress watchdog's writes into this rank's flags (copy_engine_watchdog.h): a stream of
  // its own, since every stream of the call may be waiting.
  cudaStream_t release_stream = nullptr;
  // Calls enqueued (changed under the state's lock; atomic because the watchdog reads it
  // without taking the lock that a stuck call's thread may hold).
  std::atomic<uint32_t> epoch{0};
};

// Before the call's GEMM launch, on XLA's thread, under state.mu: creates the state on first
// use, derives the call's arguments into *args (its GEMM's arguments `gemm` have their buffers
// and counters; `out` is the call's output), grows the receive buffers and exchanges addresses
// (collective: every rank of the group makes the same calls) and points the ring's GEMM at its
// addends. A failure here leaves no peer waiting: the exchange fails on every rank together,
// and what precedes it (the state's creation) runs on the group's first call only.
Status PrepareCopyEngineCall(CommState& state, const OverlapPlan& plan, const OverlapShape& shape,
                             void* out, SignalingGemmArgs& gemm, CopyEngineArgs* args);

// After PrepareCopyEngineCall: an all-reduce with peers in other processes needs its output
// inside the XLA memory they mapped (copy_engine_output_pools.h). This rank's own finding,
// after the exchange: a failure must release the peers (failed_call.h).
Status CheckOutputForPeers(CommState& state, const CopyEngineArgs& args);

// After PrepareCopyEngineCall, before the GEMM launch: builds every copy graph the call needs.
// The graphs are built before the GEMM is launched: building one may wait for this GPU to
// drain, and before the launch the GPU holds only earlier calls, whose copies every rank has
// already handed over; after it, the ring's GEMM would wait for the peers' copies of this same
// call, handed over only once the peers are past their own builds, which may wait for their
// GPUs in the same way: a cycle around the ring. The peers are past the exchange by now, so a
// failure must release them (failed_call.h).
Status BuildCopyEngineGraphs(CommState& state, const CopyEngineArgs& args);

// After PrepareCopyEngineCall, before the GEMM launch: the event the call records on XLA's
// stream once its counters are zeroed and its inputs ready (the GEMM launcher's
// after_zero_event). Blocks while the copy worker is too far behind to reuse the event's slot.
cudaEvent_t NextInputsEvent(CommState& state);

// After the GEMM launch on `xla_stream` (with the rotation and groups of the plan and
// NextInputsEvent's event): hands the copy stream's part to the copy worker, enqueues the band
// sums (with the stores of an all-reduce) on `xla_stream` (the rounds before the last on the sum
// stream; none for the ring); the last sum (the ring: XLA's stream) also waits for this rank's
// own copies (they read the workspace), and an all-reduce's end for the peers' stores. The
// call takes its epoch and is handed over first: a failure leaves the XLA-stream part
// (failed_call.h, FailedPart::kXlaStream) to release.
Status EnqueueCopyEngineCall(CommState& state, cudaStream_t xla_stream,
                             const CopyEngineArgs& args);

// Waits until the copy worker has enqueued every call handed to it. Under state.mu (so that no
// call hands it more).
void DrainCopyWorker(CommState& state);

// The copy worker's first failure, "" while none. After one, the worker still releases the
// flags that the call's partners and its own band sum wait for (its data is then undefined), and
// fails the group: every later call of every rank reports the failure.
std::string CopyWorkerFailure(CommState& state);

}  // namespace fo_jax
