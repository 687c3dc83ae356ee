// See call_timeline.h.
#include "comm/call_timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <mutex>

#include "comm/comm_registry.h"
#include "comm/copy_engine.h"

namespace fo_jax {

int64_t TimelineNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<std::string> TimelineColumnNames() {
  // In enum order: every TimelineHostMark, then the TimelineMarks before the copy steps'.
  static constexpr const char* kHostNames[] = {"host_enter",           "host_prepared",
                                               "host_gemm_launched",   "host_copies_enqueued",
                                               "host_exit",            "host_copies_issued"};
  static constexpr const char* kMarkNames[] = {"xla_start",   "gemm_end",    "first_sum_end",
                                               "second_sum_end", "call_end", "copy_inputs",
                                               "copy_acked"};
  static_assert(std::size(kHostNames) == kTimelineHostMarks && std::size(kMarkNames) == kCopySent0);
  std::vector<std::string> names(std::begin(kHostNames), std::end(kHostNames));
  names.insert(names.end(), std::begin(kMarkNames), std::end(kMarkNames));
  for (const char* kind : {"copy_sent", "copy_go", "copy_done"}) {  // the enum's order
    for (int i = 0; i < kTimelineCopySlots; ++i) names.push_back(kind + std::to_string(i));
  }
  return names;
}

bool BeginTimelineCall(CommState& s, int64_t host_enter_ns) {
  CallTimeline& t = s.timeline;
  t.recording = t.capacity > 0 && t.count < t.capacity;
  if (t.recording) {
    int64_t* h = &t.host_ns[size_t(t.count) * kTimelineHostMarks];
    std::fill(h, h + kTimelineHostMarks, 0);
    h[kHostEnter] = host_enter_ns;
  }
  return t.recording;
}

void RecordTimelineMark(CommState& s, TimelineMark m, cudaStream_t stream) {
  RecordTimelineMarkAt(s, TimelineRowOfCall(s), m, stream);
}

void RecordTimelineHost(CommState& s, TimelineHostMark m) {
  RecordTimelineHostAt(s, TimelineRowOfCall(s), m);
}

int TimelineRowOfCall(CommState& s) { return s.timeline.recording ? s.timeline.count : -1; }

void RecordTimelineMarkAt(CommState& s, int row, TimelineMark m, cudaStream_t stream) {
  CallTimeline& t = s.timeline;
  if (row < 0 || row >= t.capacity) return;
  // A failed record leaves the mark missing (NaN when read); diagnostics never fail a call.
  if (cudaEventRecord(t.events[size_t(row) * kTimelineMarks + m], stream) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void RecordTimelineHostAt(CommState& s, int row, TimelineHostMark m) {
  CallTimeline& t = s.timeline;
  if (row < 0 || row >= t.capacity) return;
  t.host_ns[size_t(row) * kTimelineHostMarks + m] = TimelineNowNs();
}

void EndTimelineCall(CommState& s) {
  CallTimeline& t = s.timeline;
  if (!t.recording) return;
  t.host_ns[size_t(t.count) * kTimelineHostMarks + kHostExit] = TimelineNowNs();
  ++t.count;
  t.recording = false;
}

Status StartCallTimelines(int calls) {
  for (CommState* s : AllCommStatesForDebug()) {
    std::lock_guard<std::timed_mutex> lock(s->mu);
    if (!s->copy_engine) continue;  // copy-engine communicators only
    DrainCopyWorker(*s);  // it may still record into the rows replaced here
    FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(s->device), "cudaSetDevice"));
    CallTimeline& t = s->timeline;
    // Every event a call may record was recorded before, or never (then reading it fails and it
    // reads as missing): recreate them so that no mark of an earlier run reads as this one's.
    for (cudaEvent_t e : t.events) (void)cudaEventDestroy(e);
    t.events.assign(size_t(calls) * kTimelineMarks, nullptr);
    for (cudaEvent_t& e : t.events) {
      FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "creating timeline events"));
    }
    t.host_ns.assign(size_t(calls) * kTimelineHostMarks, 0);
    if (!t.base) {
      FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&t.base), "creating the base event"));
    }
    t.capacity = calls;
    t.count = 0;
    t.recording = false;
    t.base_host_ns = TimelineNowNs();
    FO_JAX_RETURN_IF_ERROR(CudaStatus(
        cudaEventRecord(t.base, s->copy_engine->worker.copy_stream), "recording the base"));
  }
  return Status::Ok();
}

Status ReadCallTimelines(int64_t origin_ns, std::vector<TimelineRow>* rows_out) {
  std::vector<TimelineRow>& rows = *rows_out;
  rows.clear();
  for (CommState* s : AllCommStatesForDebug()) {
    std::lock_guard<std::timed_mutex> lock(s->mu);
    CallTimeline& t = s->timeline;
    if (t.capacity == 0) continue;
    DrainCopyWorker(*s);  // its marks of the recorded calls are enqueued
    cudaError_t err = cudaSetDevice(s->device);
    if (err == cudaSuccess) err = cudaEventSynchronize(t.base);
    if (err != cudaSuccess) {
      rows.clear();
      return CudaStatus(err, "synchronizing the base event");
    }
    const double base_us = (t.base_host_ns - origin_ns) * 1e-3;
    for (int c = 0; c < t.count; ++c) {
      constexpr int H = kTimelineHostMarks;
      TimelineRow r{s->device, s->rank, c, std::vector<double>(H + kTimelineMarks, NAN)};
      for (int m = 0; m < H; ++m) {
        const int64_t ns = t.host_ns[size_t(c) * H + m];
        if (ns != 0) r.us[m] = (ns - origin_ns) * 1e-3;
      }
      for (int m = 0; m < kTimelineMarks; ++m) {
        cudaEvent_t e = t.events[size_t(c) * kTimelineMarks + m];
        float ms = 0;
        // Never-recorded events fail here (cudaErrorInvalidResourceHandle): a missing mark.
        if (cudaEventSynchronize(e) == cudaSuccess &&
            cudaEventElapsedTime(&ms, t.base, e) == cudaSuccess) {
          r.us[H + m] = base_us + ms * 1e3;
        } else {
          (void)cudaGetLastError();
        }
      }
      rows.push_back(std::move(r));
    }
  }
  return Status::Ok();
}

}  // namespace fo_jax
