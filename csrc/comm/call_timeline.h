// Diagnostics: an untraced per-call timeline of the copy-engine transport
// (docs/troubleshooting.md, "Diagnosing a stall"). While armed (StartCallTimelines, from Python
// between batches), each call records CUDA events at fixed points on XLA's stream and on the copy
// stream, plus host times at fixed points of the FFI handler; ReadCallTimelines turns them into
// times on the host's steady clock. Off by default, and then a call pays one clock read and one
// branch per mark. Unlike a profiler this keeps the harness as it is (no CUPTI callbacks on the
// host threads).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/status.h"

namespace fo_jax {

struct CommState;  // comm/comm_registry.h

// Copy steps, and copies, of a call whose marks are recorded (later ones are not).
constexpr int kTimelineCopySlots = 8;

// Where a call records its events.
enum TimelineMark {
  kXlaStart = 0,   // XLA's stream reached the call (before the counters' zeroing and the GEMM)
  kGemmEnd,        // the GEMM ended (XLA's stream, before the band sums)
  kFirstSumEnd,    // the first band-sum pass ended (the only one without split sums)
  kSecondSumEnd,   // the second pass ended (split sums only)
  kCallEnd,        // XLA's stream passed the call's last wait (its own copies done)
  kCopyInputs,     // copy stream: XLA's inputs ready
  kCopyAcked,      // copy stream: the first step's receiver acknowledged the previous call
  kCopySent0,      // copy stream: step j's chunk sent and flagged is kCopySent0 + j
  kCopyGo0 = kCopySent0 + kTimelineCopySlots,  // copy stream: the call's copy i may start (its
                                               // group is done): kCopyGo0 + i, ...
  kCopyDone0 = kCopyGo0 + kTimelineCopySlots,  // ... and has ended: kCopyDone0 + i
  kTimelineMarks = kCopyDone0 + kTimelineCopySlots,
};

// Host times of a call (steady clock), where its handler spends its time.
enum TimelineHostMark {
  kHostEnter = 0,        // the FFI handler starts
  kHostPrepared,         // communicator, checks and plan done (before the GEMM's launch)
  kHostGemmLaunched,     // the GEMM enqueued
  kHostCopiesEnqueued,   // the copy stream's work enqueued or handed to the copy thread
  kHostExit,             // the handler returns
  kHostCopiesIssued,     // the copy thread finished enqueueing the call's copies (else missing)
  kTimelineHostMarks,
};

struct CallTimeline {
  int capacity = 0;  // calls to record (0: off)
  int count = 0;     // calls recorded since the last start
  bool recording = false;  // the current call records (set by BeginTimelineCall)
  std::vector<cudaEvent_t> events;  // capacity * kTimelineMarks, created by StartCallTimelines
  std::vector<int64_t> host_ns;     // capacity * kTimelineHostMarks (steady clock)
  cudaEvent_t base = nullptr;       // recorded on an idle stream at start ...
  int64_t base_host_ns = 0;         // ... at this host time
};

// Steady-clock nanoseconds (the clock of every host time here).
int64_t TimelineNowNs();

// The names of a row's columns (ReadCallTimelines): the host marks, then the GPU marks.
std::vector<std::string> TimelineColumnNames();

// Under state.mu, at the start of a call: whether this call records (armed and not yet full).
// Clears every mark of the call's slot so that marks a call does not reach read as missing.
bool BeginTimelineCall(CommState& state, int64_t host_enter_ns);
// Records mark `m` of the current call on `stream` when it records; else does nothing.
void RecordTimelineMark(CommState& state, TimelineMark m, cudaStream_t stream);
// Notes the host time of `m` for the current call when it records.
void RecordTimelineHost(CommState& state, TimelineHostMark m);
// At the end of a call (after its last enqueue).
void EndTimelineCall(CommState& state);
// The current call's row (between BeginTimelineCall and EndTimelineCall), -1 when it does not
// record; work of the call done later by another thread records into that row (under no lock:
// StartCallTimelines and ReadCallTimelines first wait for that thread's work to finish).
int TimelineRowOfCall(CommState& state);
void RecordTimelineMarkAt(CommState& state, int row, TimelineMark m, cudaStream_t stream);
void RecordTimelineHostAt(CommState& state, int row, TimelineHostMark m);

// Arms every copy-engine communicator of the process for `calls` calls (0 disarms). Call it with
// the GPUs idle (after jax.block_until_ready): the base event then runs at once, so its GPU time
// matches its host time within a few microseconds.
Status StartCallTimelines(int calls);

// One row per recorded call of every armed communicator: device, rank, call index, then the
// host marks (TimelineHostMark order) and each GPU mark's time, in microseconds on the steady
// clock relative to `origin_ns` (NaN for a mark the call did not record). The GPUs must be idle.
struct TimelineRow {
  int device = 0;
  int rank = 0;
  int call = 0;
  std::vector<double> us;  // kTimelineHostMarks + kTimelineMarks
};
Status ReadCallTimelines(int64_t origin_ns, std::vector<TimelineRow>* rows);

}  // namespace fo_jax
