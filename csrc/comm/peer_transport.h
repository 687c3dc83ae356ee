// The copy-engine transport (benchmarks/NOTES.md §6-9): instead of NCCL's collective kernels,
// the bytes move as copy-engine writes straight into the other GPUs' memory, so the GEMM keeps
// every SM. Rank r's GEMM visits its output by destination band: r+1, r+2, ..., r+P-1, then its
// own band last (a tile-row rotation). Step j copies the band for rank (r+1+j) % P into that
// rank's receive slot j, group by group as the groups' counters fill (a band is one or more
// groups); all ranks together form a permutation per step (each GPU sends to one peer and
// receives from one). The own band needs no communication; band-sum kernels on XLA's stream add
// the P - 1 received bands to it (in one pass; or those already there while the last one is in
// flight, then the last; or one pass of all of them per piece of the last band, as each piece
// lands: PeerCollectiveArgs::sum_split). That is the reduce-scatter.
//
// The ring reduce-scatter (PeerCollectiveArgs::ring) needs no sums after the GEMM: band b is
// computed by rank b + 1 at step 0, by rank b + 2 at step 1 (which adds what rank b + 1 computed,
// in the GEMM's epilogue: SignalingGemmArgs' addend), ..., and by rank b itself last, whose
// epilogue adds the partial sum of the other P - 1 ranks and stores the band straight into the
// output (SignalingGemmArgs::tail_out). So every rank sends each of its first P - 1 steps to
// rank r - 1, group by group (receive slot j, flag kRingArrived[g] after each group's copy),
// and the GEMM's epilogue waits for each group's flag before it loads those rows. The bytes sent
// are the same as the direct form's (P - 1 bands); what goes is the ~60 us of band sums after
// the GEMM (benchmarks/NOTES.md §22).
//
// All-reduce = that reduce-scatter with the GEMM writing straight into the output, then an
// all-gather by the SMs (idle once the GEMM is done): the last band-sum pass stores the summed
// band into the same rows of every peer's output over NVLink, then flags it. An output is this
// call's XLA buffer, whose address only its rank knows: each rank writes it into every peer's
// out table on the GPU (stream memory operations) at the start of the call, and the sum kernel
// reads it there. (Copy-engine pulls from a published copy ran at 145-190 GB/s, SM loads at
// ~280, these stores at ~355: benchmarks/NOTES.md §8.) To overlap that all-gather with the
// GEMM, an all-reduce may visit its output in rounds of P chunks (PeerCollectiveArgs::rounds):
// the sums and stores of every round but the last run on a second stream during the GEMM.
//
// Synchronization uses stream memory operations (no SM), never spin kernels (a spin kernel on the
// copy stream needs an SM while the band sums that wait for its copies hold them: that hung at
// TP=4, docs/design.md, "Flags and epochs"): cuStreamWaitValue32 on the GEMM's
// counters and on arrival flags, cuStreamWriteValue32 to a peer's flag after the copy (the write
// fences the copy: stream_wait.h); the band sums that follow the GEMM wait for their arrival flags
// inside the kernel instead (band_sum.h), the last of them also for this rank's own copies (a
// local flag the copy stream writes after them: they read XLA's workspace). Flags carry a
// per-call epoch, so they are never reset.
//
// The copy stream's work of a call is enqueued by a host thread of fo_jax's (PeerState::
// copy_thread), not by XLA's: the handler's host time halves (NOTES §19). XLA's stream then
// holds work (the last band sum) that waits for work another thread enqueues later, so that
// thread makes only calls that never wait for the GPU to drain (graph launches and updates,
// stream memory operations, events: csrc/tools/ctx_lock_probe.cu); graphs are built by XLA's
// thread before it hands the call over.
// An acknowledgement word per sender (written after the band sum) keeps a sender from overwriting a
// receive slot that its owner still reads from the previous call. An all-reduce call ends only
// when every peer's band has landed in its output, so an output address in a peer's table stays
// valid for as long as that peer may write to it.
//
// Scope: all ranks of the group in one process (JAX's one-process-per-host mode) with peer access
// between every pair of GPUs (NVLink/NVSwitch machines); otherwise the NCCL transport is used.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/comm_registry.h"
#include "comm/host_worker.h"
#include "comm/overlap_plan.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

constexpr int kMaxPeerRanks = kMaxCopyEngineRanks;

// Layout of PeerState::sync, in units of kMaxPeerRanks words.
enum PeerSyncRegion {
  kArrived = 0,    // 4 regions: [slot]: epoch of the chunk that arrived in receive slot `slot`
  kRecvAcked = 4,  // [q]: last epoch in which rank q finished reading its receive slots
  kStored = 5,     // [q]: epoch in which rank q stored its summed band here (all-reduce)
  kOutReady = 6,   // [q]: epoch of the output address rank q wrote into the out table
  kOutTable = 7,   // 2 regions: [j] (64-bit): output address of rank (this + 1 + j) % P
  kOwnCopies = 9,  // [0]: epoch of this rank's latest call whose pushes have all completed
  kLastPieces = 10,  // [k]: epoch in which piece k of the last received chunk arrived
                     // (SumSplit::kByRows: the sender flags each group of its last step)
  kRingArrived = 11,  // 4 regions: [g]: epoch in which the ring's sender's group g arrived
  kSyncRegions = 15,
};
static_assert(4 * kMaxPeerRanks >= kMaxGemmGroups, "kRingArrived holds a flag per group");
static_assert(4 * kMaxPeerRanks >= kMaxReceiveSlots, "kArrived holds a flag per receive slot");

// Per communicator (CommState::peer): buffers, flags, the peers' addresses, copy streams.
struct PeerState {
  cudaStream_t copy_stream = nullptr;  // highest priority
  cudaStream_t sum_stream = nullptr;  // all-reduce rounds before the last (highest priority)
  // The copy thread writes the arrival flags here (but the last step's), each after flag_event
  // (recorded on the copy stream after the copies it covers), so that the copy stream goes
  // straight on to its next copy (its step boundary took ~14 us against ~6 between copies of
  // one step with the flags inline). One event serves every flag: a stream wait follows the
  // record it was enqueued after, whatever is recorded later.
  cudaStream_t flag_stream = nullptr;
  cudaEvent_t flag_event = nullptr;
  cudaEvent_t sums_done = nullptr;
  // The copy stream's part of a call (copies, flags, acknowledgements: ~20 stream operations)
  // is enqueued by this thread, so that XLA's thread leaves the handler sooner (about half its
  // host time). XLA's stream never waits on the copy stream's events (the thread records them later); the last band sum waits for the
  // kOwnCopies flag instead. Events that XLA's stream records for the copy stream are a ring
  // per call (slot epoch % kCallEvents): a slot is re-recorded only once the thread has
  // enqueued the waits on it of the call kCallEvents earlier (the handler waits for that).
  std::unique_ptr<HostWorker> copy_thread;
  static constexpr int kCallEvents = 8;
  cudaEvent_t inputs_ready[kCallEvents] = {};  // XLA stream: counters zeroed, inputs ready
  cudaEvent_t sums_ended[kCallEvents] = {};    // XLA stream: receive slots read (acks follow)
  std::mutex failure_mu;
  std::string copy_failure;  // the copy thread's first failure ("" while none; failure_mu)
  uint32_t* sync = nullptr;  // kSyncRegions * kMaxPeerRanks words, see PeerSyncRegion
  void* recv = nullptr;      // P - 1 receive slots of one band each
  size_t recv_bytes = 0;
  void* exchange = nullptr;  // device scratch for the address all-gather
  void* peer_recv[kMaxPeerRanks] = {};
  uint32_t* peer_sync[kMaxPeerRanks] = {};
  // The copies into peer q's memory are launches of a one-node graph whose memcpy node is
  // re-pointed before each launch: unlike cudaMemcpyAsync (and every other memcpy call), an
  // update + launch never waits for a driver lock that another thread holds while it waits for
  // that peer GPU to drain (freeing memory, loading or unloading a module with globals, as XLA
  // does when it runs a new executable or drops an old one). That wait can deadlock: the peer's
  // GPU may itself be waiting for this copy (benchmarks/NOTES.md §13-14,
  // csrc/tools/ctx_lock_probe.cu). The graph stays alive as long as its exec: an update names
  // the node of the graph the exec was instantiated from (with that graph destroyed every update
  // failed, and each copy built a new graph: NOTES §14). An update must name memory of the
  // node's original contexts (CUDA's documentation), so a few graphs are kept per peer: one per
  // copy of a call to that peer (each group keeps its operands, and a launch with unchanged
  // operands skips the update), which also serve other kinds of memory (GatedCopy).
  static constexpr int kCopyGraphs = 16;  // the ring sends every group to one peer
  std::mutex graph_mu;  // the slots below: XLA's thread fills empty ones, the copy thread updates
  cudaGraph_t copy_graph[kMaxPeerRanks][kCopyGraphs] = {};
  cudaGraphExec_t copy_exec[kMaxPeerRanks][kCopyGraphs] = {};
  cudaGraphNode_t copy_node[kMaxPeerRanks][kCopyGraphs] = {};
  // What each exec's node copies now: a launch with the same operands skips the update (XLA
  // hands the same workspace to call after call, and the update costs host time per copy).
  struct CopyOperands {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  CopyOperands copy_set[kMaxPeerRanks][kCopyGraphs] = {};
  // Copies enqueued, copy graphs built for them and graph updates made (the rest launched as
  // set): PeerCopyCounts.
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> graphs_built{0};
  std::atomic<uint64_t> updates{0};
  // Diagnostics only (DescribePeerStateForDebug): the latest call's GEMM counters (XLA's
  // memory: valid while that call runs), what they count to, and a pinned buffer and stream to
  // read flags and counters on a hung machine without any call that waits for a GPU to drain.
  const uint32_t* last_counters = nullptr;
  uint32_t last_expected[kMaxGemmGroups] = {};
  int last_num_groups = 0;
  uint32_t* debug_host = nullptr;
  cudaStream_t debug_stream = nullptr;
  uint32_t epoch = 0;
};

// "" when every ordered pair of these local device ordinals has peer access, else why not.
std::string PeerAccessProblem(const std::vector<int>& ordinals);

struct PeerCollectiveArgs {
  GemmDtype dtype = GemmDtype::kBF16;
  // Reduce-scatter: workspace = the GEMM's output [P * band rows, N] in natural row order, out =
  // [band rows, N]. All-reduce: the GEMM writes straight into the output, workspace = out =
  // [P * band rows, N]; the own band is summed in place, the others overwritten by the peers.
  bool all_reduce = false;
  const void* workspace = nullptr;
  void* out = nullptr;
  size_t band_elems = 0;            // band rows * N
  // Rounds (all-reduce): each band is `rounds` chunks; the GEMM visits round h's chunks (rows
  // of chunk (h, b) = [(h * P + b) * chunk rows, ...), owner b) in destination order, round by
  // round, and round h's sum and stores run on the sum stream while the GEMM computes the next
  // rounds, on the SMs the GEMM leaves free (sm_budget) and on every SM once it ends (the sum's
  // blocks beyond the free SMs wait for them): the all-gather overlaps the GEMM instead of
  // following it. Reduce-scatter: rounds = 1.
  int rounds = 1;
  // The GEMM's groups (logical tile rows in visit order; SignalingGemmArgs::group_begin) refine
  // the chunks (round h, step j is logical chunk h * P + j, step P - 1 the own chunk): every chunk
  // boundary k * tiles_chunk is a group boundary, and a chunk may be several groups, each copied
  // as soon as its counter is full (the chain of copies then starts, and ends, sooner; each copy
  // costs the copy engine ~9 us of turnaround: docs/performance.md). Set by SetPeerGroups.
  const uint32_t* counters = nullptr;
  uint32_t expected[kMaxGemmGroups] = {};
  int num_groups = 0;
  int group_begin[kMaxGemmGroups + 1] = {};
  int chunk_first_group[kMaxGemmGroups + 1] = {};  // first group of each chunk; [chunks] = groups
  int tiles_chunk = 0;
  size_t tile_row_elems = 0;  // tile_m * N
  // How the last round is summed after the GEMM (overlap_plan.h; the plan's choice, from a
  // timing model: fo_jax/_ce_model.py); kByRows is one pass when that chunk is one group.
  SumSplit sum_split = SumSplit::kOnePass;
  // The ring reduce-scatter (see the top of this file; rounds 1): steps 0 .. P - 2 go to rank
  // r - 1, each group flagged on landing, and the GEMM's epilogue adds the partial sums
  // (SetGemmRing gives it their address, flags and the output); nothing is summed after the
  // GEMM. sum_split is then unused.
  bool ring = false;
};

// For args.ring: sets the GEMM's addend to the receive slots (the partial sums of rank r + 1's
// steps 0 .. P - 2, added from logical tile-row tiles_chunk on), its flags to kRingArrived for
// the call that EnqueuePeerCollective enqueues next (the next epoch: call it right before that
// GEMM, under the state's lock), and its tail output (the own chunk, the last) to args.out.
// Needs a validated ring plan (overlap_plan.h) and PreparePeerTransport done.
void SetGemmRing(CommState& state, const PeerCollectiveArgs& args, int tiles_chunk,
                 SignalingGemmArgs& gemm);

// Sets args' program and groups from a validated copy-engine plan (its rounds, ring, sum split
// and group table, and each chunk's first group); tile_row_elems = tile_m * N.
void SetPeerGroups(PeerCollectiveArgs& args, const OverlapPlan& plan, size_t tile_row_elems);

// Before the call's GEMM: on first use (and when a larger call arrives) allocates the receive
// buffer for `recv_bytes` (never freed: cudaFree would synchronize the device) and exchanges
// addresses with the other ranks over the communicator: collective, blocks until every rank
// arrives (all ranks make the same calls in the same order, so they grow their buffers in the
// same calls). "" or why it failed.
std::string PreparePeerTransport(CommState& state, size_t recv_bytes);

// After PreparePeerTransport (and SetPeerGroups), before the call's GEMM launch, on XLA's
// thread: builds the copy graphs this call's copies prefer that do not exist yet (the copy
// thread never builds one: PeerState::copy_exec). Building one may wait for this GPU to drain.
// Before the launch the GPU holds only earlier calls, whose copies every rank has already handed
// over; after it, the ring's GEMM would wait for the peers' copies of this same call, enqueued
// only once the peers' handlers are past their own builds, which may wait for their GPUs in the
// same way: a cycle around the ring (likely the hang of the first 8192x8192x2048 ring call on
// 4x H200, benchmarks/NOTES.md §22). "" or why not.
std::string EnsurePeerCopyGraphs(CommState& state, const PeerCollectiveArgs& args);

// After PreparePeerTransport, before the call's GEMM launch: the event the call must record on
// XLA's stream once its counters are zeroed and its inputs ready (the GEMM launcher's
// after_zero_event). Blocks while the copy thread is too far behind to reuse the event's slot.
cudaEvent_t NextPeerInputsEvent(CommState& state);

// Precondition (caller, on `xla_stream`): PreparePeerTransport for (P - 1) * band bytes,
// EnsurePeerCopyGraphs for these args, counters zeroed, NextPeerInputsEvent's event recorded,
// then the GEMM launched with
// rotate_tile_rows = ((rank + 1) % P) * chunk tile-rows and the groups given to SetPeerGroups.
// Has the copy thread enqueue the copies and the acknowledgements on the copy stream, the band sums (with the stores of an all-reduce) on `xla_stream` (the rounds before
// the last on the sum stream; none for the ring); the last sum (the ring: XLA's stream) also
// waits for this rank's own copies (they read the workspace), and an all-reduce's end for the
// peers' stores.
cudaError_t EnqueuePeerCollective(CommState& state, cudaStream_t xla_stream,
                                  const PeerCollectiveArgs& args, std::string* error);

// Waits until the copy thread has enqueued every call handed to it. Under state.mu (so that no
// call hands it more).
void DrainPeerCopyThread(CommState& state);

// The copy thread's first failure, "" while none. After one, the thread still releases the flags
// that the call's partners and its own band sum wait for (its data is then undefined), and every
// later call reports the failure.
std::string PeerCopyFailure(CommState& state);

// Diagnostics for a hang (fo_jax/_diagnostics.py), as one line of text: the rank, whether a call
// holds state.mu now (a host thread stuck inside the handler), the number of calls enqueued
// (epoch), copies and copy graphs built, and the flags and the latest call's GEMM counters as
// the GPU holds them, read by a copy on a stream of this function's own (given up after a
// second: a stuck GPU may not serve it).
std::string DescribePeerStateForDebug(CommState& state);

// Copies enqueued, copy graphs built and graph updates made so far by this communicator's
// copy-engine transport (all 0 before its first call). Once every kind of memory has its graph,
// graphs_built stops growing; updates grow only while a copy's operands change between calls.
struct PeerCopyCounts {
  uint64_t copies = 0;
  uint64_t graphs_built = 0;
  uint64_t updates = 0;
};
PeerCopyCounts CountPeerCopies(CommState& state);

}  // namespace fo_jax
