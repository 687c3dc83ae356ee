// See overlap_call.h.
#include "comm/overlap_call.h"

#include "comm/all_gather_copy_engine.h"
#include "comm/all_gather_nccl.h"
#include "comm/call_timeline.h"
#include "comm/copy_engine.h"
#include "comm/failed_call.h"
#include "comm/failed_nccl_call.h"
#include "comm/gated_collectives.h"
#include "comm/gemm_plan.h"
#include "comm/test_failures.h"

namespace fo_jax {
namespace {

// An all-gather's buffers: the workspace is the gathered x, the counters its band flags.
AllGatherBuffers AllGatherBuffersOf(const OverlapBuffers& b) {
  AllGatherBuffers ag;
  ag.x = b.x;
  ag.gathered = b.workspace;
  ag.flags = b.counters;
  return ag;
}

}  // namespace

OverlapCall::OverlapCall(const OverlapPlan& plan, const OverlapShape& shape,
                         const OverlapBuffers& buffers, const OverlapPlace& place,
                         int64_t host_enter_ns)
    : plan_(plan), shape_(shape), buffers_(buffers), place_(place),
      host_enter_ns_(host_enter_ns) {}

Status OverlapCall::CheckBuffers() const {
  const bool rs = plan_.collective == Collective::kReduceScatter;
  const bool ag = plan_.collective == Collective::kAllGather;
  if (buffers_.out_elems != static_cast<size_t>(OutputRows(plan_, shape_) * shape_.n) ||
      (rs && buffers_.workspace_elems != static_cast<size_t>(shape_.m * shape_.n)) ||
      (ag && buffers_.workspace_elems != static_cast<size_t>(shape_.m * shape_.k)) ||
      buffers_.counters_elems != static_cast<size_t>(plan_.gemm.num_groups)) {
    return Status::InvalidArgument("result sizes do not match the plan");
  }
  if (place_.rank < 0 || place_.rank >= plan_.axis_size) {
    return Status::InvalidArgument("rank " + std::to_string(place_.rank) + " of " +
                                   std::to_string(plan_.axis_size));
  }
  return Status::Ok();
}

Status OverlapCall::Finish() const {
  if (failure_.empty()) return Status::Ok();
  return Status::Internal(failure_ + " (the call ran so that the group's other ranks do not wait "
                          "for this one; the group stays failed: restart the process)");
}

Status OverlapCall::Prepare() {
  FO_JAX_RETURN_IF_ERROR(ValidateOverlapPlan(plan_, shape_));
  FO_JAX_RETURN_IF_ERROR(CheckBuffers());
  const bool copy_engine = plan_.transport == Transport::kCopyEngine;
  FO_JAX_RETURN_IF_ERROR(LoadGemmKernelsOnce(place_.device));
  // The copy-engine transport runs no NCCL collective but its address exchange, so the NCCL CTA
  // bound stays out of its communicator's key: one communicator and one copy-engine state per
  // group, whatever the shape's NCCL settings (fo_jax/_bootstrap.py keys the unique id alike).
  CommOptions options;
  options.max_ctas = copy_engine ? 0 : plan_.nccl_max_ctas;
  FO_JAX_RETURN_IF_ERROR(GetOrCreateCommState(place_.device, place_.id, plan_.axis_size,
                                              place_.rank, options, &state_));
  if (copy_engine) state_->copy_engine_calls.store(true);

  // A failed group (comm_registry.h): the call still runs, so that no other rank waits for this
  // one, and then reports the failure; unless this rank's communicator cannot run the NCCL
  // transport's collectives, in which case the group's local communicators are aborted.
  lock_ = std::unique_lock<std::timed_mutex>(state_->mu);
  failure_ = CommGroupFailure(*state_);
  if (state_->aborted) {
    return Status::Internal(failure_ + "; this process's communicators of the group were "
                            "aborted after it: restart the process");
  }
  if (!failure_.empty() && !copy_engine && !CommUsable(*state_)) {
    lock_.unlock();
    AbortCommGroup(*state_);
    return Status::Internal(failure_ + "; aborted this process's communicators of the group "
                            "(their pending collectives end): restart the process");
  }

  // NCCL reduce-scatter: batch = P bands written group-major (docs/design.md, "The signaling
  // GEMM"). Copy engine: one batch over all M rows in natural order, visited by destination band
  // (the rotation of OverlapGemmArgs).
  const bool rs = plan_.collective == Collective::kReduceScatter;
  gemm_ = OverlapGemmArgs(plan_, shape_, place_.rank);
  gemm_.a = buffers_.x;
  gemm_.b = buffers_.w;
  gemm_.d = rs ? buffers_.workspace : buffers_.out;
  gemm_.sm_budget = ResolveSmBudget(plan_.gemm.sm_budget);
  gemm_.a_scale = buffers_.x_scale;  // fp8 operands only (nullptr otherwise)
  gemm_.b_scale = buffers_.w_scale;
  if (plan_.collective == Collective::kAllGather) {
    gemm_.a = buffers_.workspace;  // the gathered x; the rest is all_gather_nccl.h's
    gemm_.d = buffers_.out;
    if (!copy_engine) return Status::Ok();
    return PrepareAllGatherCopyEngine(*state_, plan_, shape_, AllGatherBuffersOf(buffers_));
  }
  // The GEMM signals into the communicator's counters, which calls that succeed do not zero
  // (group_counters.h): every wait below expects its group's count past the call's base.
  zero_counters_ = BeginCountedCall(state_->counters);
  gemm_.counters = state_->counters.words;
  if (copy_engine) {
    FO_JAX_RETURN_IF_ERROR(
        PrepareCopyEngineCall(*state_, plan_, shape_, buffers_.out, gemm_, &copy_engine_));
    for (int g = 0; g < copy_engine_.num_groups; ++g) {
      copy_engine_.expected[g] += state_->counters.total[g];  // modulo 2^32, as the counters wrap
    }
    // Past the exchange the peers enqueue work that waits for this rank: Enqueue releases it.
    prepare_failure_ = CheckOutputForPeers(*state_, copy_engine_);
    if (prepare_failure_.ok()) prepare_failure_ = BuildCopyEngineGraphs(*state_, copy_engine_);
  }
  return Status::Ok();
}

Status OverlapCall::Enqueue(cudaStream_t stream) {
  Status status = EnqueueParts(stream);
  if (plan_.collective != Collective::kAllGather) {
    EndCountedCall(state_->counters, gemm_, gemm_launched_ && status.ok());
  }
  if (plan_.transport == Transport::kCopyEngine) {
    // The progress watchdog's mark, after everything the call enqueued, failed or not (the NCCL
    // transport's collectives make their own).
    const Status noted = NoteCallEnd(*state_, stream, /*copy_engine=*/true);
    if (status.ok()) status = noted;
  }
  return status;
}

Status OverlapCall::EnqueueParts(cudaStream_t stream) {
  const bool copy_engine = plan_.transport == Transport::kCopyEngine;
  CommState& state = *state_;
  if (copy_engine && TestFailureAt(FailStage::kStop, place_.rank)) return Status::Ok();
  if (plan_.collective == Collective::kAllGather) {
    const AllGatherBuffers ag = AllGatherBuffersOf(buffers_);
    FO_JAX_RETURN_IF_ERROR(
        copy_engine ? EnqueueAllGatherCopyEngine(state, stream, plan_, shape_, gemm_, ag)
                    : EnqueueAllGatherNccl(state, stream, plan_, shape_, gemm_, ag));
    return Finish();
  }
  if (!prepare_failure_.ok()) {
    return ReleaseFailedCopyEngineCall(state, stream, copy_engine_, FailedPart::kWholeCall,
                                       prepare_failure_);
  }
  // Stream order on XLA's stream: [zero counters ->] inputs_ready -> GEMM. A call that zeroes
  // the counters (group_counters.h) zeroes the words past its groups here and has the launcher
  // zero its own groups' and record inputs_ready right before the kernel, after its host-side
  // setup (zeroing first left the GPU idle ~20 us while the host built the GEMM's parameters).
  // The gated waits are enqueued after the GEMM launch (never before the producer:
  // docs/design.md).
  const cudaEvent_t inputs_ready = copy_engine ? NextInputsEvent(state) : state.inputs_ready;
  gemm_.zero_counters_on_launch = zero_counters_;
  gemm_.after_zero_event = zero_counters_ ? inputs_ready : nullptr;
  if (copy_engine && BeginTimelineCall(state, host_enter_ns_)) {
    RecordTimelineHost(state, kHostPrepared);
    RecordTimelineMark(state, kXlaStart, stream);
  }
  Status launched = Status::Ok();
  if (TestFailureAt(FailStage::kLaunch, place_.rank)) {
    launched = Status::Internal("GEMM launch failed " + InjectedFailureMessage(FailStage::kLaunch));
  } else if (zero_counters_) {
    launched = ZeroCountersPastGroups(state.counters, gemm_.num_groups, stream);
  } else {
    launched = CudaStatus(cudaEventRecord(inputs_ready, stream), "recording inputs_ready");
  }
  if (launched.ok()) {
    std::string msg;
    launched = LaunchStatus(LaunchSignalingGemm(stream, gemm_, &msg), "GEMM launch", msg);
  }
  if (!launched.ok()) {
    // The other ranks' work of this call waits for this rank's: release it.
    if (!copy_engine) {
      return ReleaseFailedNcclCall(state, stream, plan_.collective, gemm_, shape_.out_dtype(),
                                   buffers_.out, launched, state.counters.total);
    }
    EndTimelineCall(state);
    return ReleaseFailedCopyEngineCall(state, stream, copy_engine_, FailedPart::kWholeCall,
                                       launched);
  }
  gemm_launched_ = true;
  if (!copy_engine) {
    FO_JAX_RETURN_IF_ERROR(
        EnqueueNcclTransport(state, stream, plan_.collective, gemm_, shape_.out_dtype(),
                             buffers_.out, state.counters.total));
    return Finish();
  }
  RecordTimelineHost(state, kHostGemmLaunched);
  const Status enqueued = EnqueueCopyEngineCall(state, stream, copy_engine_);
  EndTimelineCall(state);
  if (!enqueued.ok()) {
    // Handed over (the copy worker does its part); XLA's stream part is released here.
    return ReleaseFailedCopyEngineCall(state, stream, copy_engine_, FailedPart::kXlaStream,
                                       enqueued);
  }
  const std::string copy_failure = CopyWorkerFailure(state);
  if (!copy_failure.empty()) {
    return Status::Internal(copy_failure + " (this call ran so that the group's other ranks do "
                            "not wait for this one; its result and every later call's are "
                            "undefined: restart the process)");
  }
  return Finish();
}

}  // namespace fo_jax
