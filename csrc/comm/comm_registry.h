// Per-device state for overlapped collectives: a dedicated NCCL communicator per tensor-parallel
// group (never one that XLA's own collectives use), a high-priority comm stream and two events.
// Created on first use for a (device, unique id, options) key (the copy-engine transport asks
// with default options, so it has one per group) and kept for the process lifetime;
// thread-safe, since XLA drives each local device from its own host thread.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/call_timeline.h"
#include "comm/group_counters.h"
#include "comm/status.h"

namespace fo_jax {

struct CommOptions {
  int max_ctas = 0;  // NCCL CTAs per collective at most (0: NCCL's default)
  int min_ctas = 0;  // at least (0: NCCL's default)
  // CTAs per thread-block cluster of NCCL's kernels. NCCL's sm90 default (4) needs 4 free SMs of
  // one GPC at once, which a running persistent GEMM may not leave; 1 lets NCCL use any free SM.
  // A precaution: at TP=2 on H200 it changed overlapped times by under 2%.
  int cga_cluster_size = 1;
};

struct CopyEngineState;  // comm/copy_engine.h
struct CommGroup;  // the local members of one communicator clique (comm_registry.cc)

struct CommState {
  int device = -1;
  int nranks = 0;
  int rank = -1;
  CommOptions options;  // as created (part of the registry's key)
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;       // comm stream, highest priority
  cudaEvent_t inputs_ready = nullptr;  // recorded on XLA's stream, waited on by the comm stream
  cudaEvent_t comm_done = nullptr;     // recorded on the comm stream, waited on by XLA's stream
  std::shared_ptr<CopyEngineState> copy_engine;  // created on the transport's first use
  // A copy-engine call (any collective, the all-gather's included, whose state lives in
  // all_gather_copy_engine.cc) has run on this communicator, set before the call creates any
  // state: a known failure then fails the group without aborting it (AbortGroupForKnownFailure),
  // so that its calls keep running in step.
  std::atomic<bool> copy_engine_calls{false};
  // Why this rank's group could not set up the copy engine ("" while none failed): set on every
  // rank of the group in the same call (copy_engine.cc), so all of them refuse later calls alike.
  std::string copy_engine_failure;
  // Device scratch of kScratchBytesPerRank per rank (the NCCL warm-up's buffer, kept):
  // AllGatherToHost's, so that no setup step's gather depends on an allocation of its own.
  void* scratch = nullptr;
  // The reduce-scatter's and all-reduce's GEMM group counters (under mu; group_counters.h).
  GroupCounters counters;
  std::shared_ptr<CommGroup> group;    // shared with the group's other ranks in this process
  std::timed_mutex mu;   // held while a call enqueues work; AbortCommGroup takes it
  std::atomic<bool> aborted{false};  // ncclCommAbort was called on `comm` (under mu)
  cudaEvent_t progress = nullptr;     // end of the latest call (the progress watchdog)
  std::atomic<int64_t> progress_ns{0};  // steady-clock time `progress` was recorded (0: never)
  // Whether the latest call ran the copy-engine transport (the watchdog releases instead of
  // aborting); when the watchdog last released this rank (0: not since its calls last
  // completed) and the progress_ns of the latest call then.
  std::atomic<bool> copy_engine_call{false};
  std::atomic<int64_t> released_ns{0};
  std::atomic<int64_t> released_stamp{0};
  CallTimeline timeline;  // diagnostics, copy-engine transport only (under mu; call_timeline.h)
};

// Sets *state to the state for this key, creating it (blocking until every rank of the group
// joined) on first use. The calling thread's current device must be `device`. A failure is
// remembered: later calls return it again without hanging.
Status GetOrCreateCommState(int device, const ncclUniqueId& id, int nranks, int rank,
                            const CommOptions& options, CommState** state);

// Failure handling. An asynchronous NCCL error on one rank must not leave the other ranks of its
// group waiting for it (NCCL collectives, or the copy-engine transport's flags): a call's
// exception on one GPU does not stop the others' work, which was enqueued by other host threads
// and may already be waiting for this rank. So every call checks its communicator
// (ncclCommGetAsyncError) and the group: the first error seen by any local rank fails the whole
// group, and from then on each call still runs (keeping every rank's protocol in step, so nobody
// waits for a partner that skipped a call) and then returns the group's failure as its error.
// Where a rank's own communicator cannot run its collectives (the NCCL transport with an error on
// that communicator), every local communicator of the group is aborted instead (ncclCommAbort
// ends their pending collectives). With one process per GPU only this process's ranks are
// covered; the others learn of it from NCCL, or wait (as with NCCL's own collectives).

// The group's failure message ("" while healthy), after checking this rank's communicator: an
// asynchronous error there fails the group (the first failure is kept).
std::string CommGroupFailure(CommState& state);

// Fails the group of `state` with `failure` (the first failure is kept): a failure of this rank
// that its peers may not see (failed_call.h), so that every later call of the group, on every
// local rank, raises with it.
void FailCommGroup(CommState& state, const std::string& failure);

// The scratch each rank of a CommState has for AllGatherToHost.
inline constexpr size_t kScratchBytesPerRank = size_t{4} << 20;

// Gathers `bytes` (at most kScratchBytesPerRank) from every rank of the group, this rank's from
// the host memory `mine`, into the host memory `all` (nranks * bytes, in rank order): through the
// state's scratch on its comm stream, synchronized. Every rank must call it (a collective); `what`
// names the step in errors.
Status AllGatherToHost(CommState& state, const void* mine, size_t bytes, void* all,
                       const std::string& what);

// Whether this rank's own communicator can still run collectives.
bool CommUsable(const CommState& state);

// ncclCommAbort on every communicator of the group in this process (each under its state's mu,
// or without it after 2 s: its holder is then blocked inside NCCL, which the abort ends, as
// NCCL allows from another thread; the caller must not hold any); their later calls fail with
// the group's failure.
void AbortCommGroup(CommState& state);

// Progress watchdog, opt-in, for what the checks above cannot see (a rank that stopped calling,
// in this process or another, leaves its partners waiting): with a limit set, records
// state.progress on `stream` at the end of a call (nothing when off), and a background thread
// (started on first use) acts once a recorded call has not completed for SetCommTimeoutSeconds
// seconds. It fails the group, and
// - the NCCL transport: aborts its communicators in this process; the aborted collectives end;
// - the copy-engine transport (`copy_engine`): releases every local rank of the group whose call
//   has not completed (copy_engine_watchdog.h), and ends the process if one is still stuck one
//   more limit later.
// The waiting call returns (its output undefined: JAX cannot fail an operation that already
// returned) and the next one raises. Off by default (0): a rank that merely pauses (a long
// checkpoint on one process) is waited for, as XLA's own collectives wait; a KNOWN failure in
// another process is handled without a timeout (AbortGroupForKnownFailure).
Status NoteCallEnd(CommState& state, cudaStream_t stream, bool copy_engine);

// The watchdog's limit in seconds (0: off, the default), read when it starts (the first
// overlapped call): Python sets it once, from FO_JAX_COMM_TIMEOUT_S, when it loads the
// module (fo_jax/_env.py).
void SetCommTimeoutSeconds(double seconds);
double CommTimeoutSeconds();

// Known failures across processes (fo_jax/_failure_watch.py carries them through JAX's
// key-value store): (unique id, failure) of every group of this process that has failed.
std::vector<std::pair<std::string, std::string>> FailedGroups();

// For a group with several processes (unique id `id`, as FailedGroups names it) that has failed
// here or in another process: fails it here with `failure` (unless it failed already) and, for
// the NCCL transport, aborts its communicators in this process, so that no rank waits in NCCL
// for a partner that will not come: the call waiting now returns (its output undefined) and
// every later call raises at once. Every process of the group does the same, the failing one
// included. A group that runs the copy engine is failed, not aborted: its calls keep running in
// step and raise. Unknown ids are ignored.
void AbortGroupForKnownFailure(const std::string& id, const std::string& failure);

// Fault injection for the tests (NCCL's own detection cannot be provoked on one healthy
// machine): while `code` (an ncclResult_t) is not ncclSuccess, the communicator of rank `rank`
// (every rank if < 0) reports it as an asynchronous NCCL error; with `broken` that communicator
// also counts as unusable (the abort path). Setting 0 stops it and clears the groups' failures
// (not the aborts).
void InjectAsyncErrorForTests(int code, int rank, bool broken);

// Tests only: clears the failure of state's group (not an abort), as a restart would give the
// next calls a healthy group (group_counters_check.h runs calls after a failed one).
void ClearCommGroupFailureForTests(CommState& state);

// Every communicator state this process created (never destroyed), for diagnostics.
std::vector<CommState*> AllCommStatesForDebug();

// The index of state's group (its unique id) among the groups this process created, in creation
// order: two states of one group have the same index. Diagnostics (one communicator per group
// and options: docs/troubleshooting.md, "Memory outside XLA's pool").
int CommGroupIndex(const CommState& state);

}  // namespace fo_jax
