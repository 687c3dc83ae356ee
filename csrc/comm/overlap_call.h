// One overlapped call (GEMM + collective), JAX-free: the FFI handler decodes its plan and buffers,
// builds an OverlapCall, calls Prepare then Enqueue, and maps the status. Prepare validates the
// plan against the operands, gets the group's communicator (created on first use), applies the
// failure policy (comm_registry.h) and prepares the transport (the copy engine's buffers, ring
// and graphs); Enqueue launches the signaling GEMM on XLA's stream, its group counters the
// communicator's (group_counters.h), and the transport's work after it (gated_collectives.h for NCCL, copy_engine.h for the copy engine); an all-gather's
// consumer GEMM and transports are all_gather_nccl.h's and all_gather_copy_engine.h's. The
// communicator's lock is held from Prepare to the object's end, so a call's work is enqueued in
// one piece.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "comm/comm_registry.h"
#include "comm/copy_engine_args.h"
#include "comm/group_counters.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// The call's device memory, from XLA, with element counts.
// fp8 operands (OverlapShape::dtype kE4M3): x and w float8_e4m3fn, w given K-major ([n, k]: the
// fp8 kernel reads both operands K-major), the two float32 scales device scalars, and out and
// workspace of the output dtype (bf16).
struct OverlapBuffers {
  const void* x = nullptr;  // [m, k] (the all-gather: [m / P, k])
  const void* w = nullptr;  // [k, n] (fp8: [n, k])
  const float* x_scale = nullptr;  // fp8 only: dequantization scales, read by the GEMM
  const float* w_scale = nullptr;
  void* out = nullptr;      // [m / P, n] (reduce-scatter) or [m, n] (all-reduce, all-gather)
  size_t out_elems = 0;
  // [m, n] (reduce-scatter: the GEMM's output); the all-gather: the gathered x [m, k]
  void* workspace = nullptr;
  size_t workspace_elems = 0;
  // One per group: the all-gather's band flags. The reduce-scatter and all-reduce leave it
  // unwritten: their GEMM signals into the communicator's counters (group_counters.h).
  uint32_t* counters = nullptr;
  size_t counters_elems = 0;
};

// Where this device is: its ordinal, its rank in its tensor-parallel group and that group's NCCL
// unique id.
struct OverlapPlace {
  int device = -1;
  int rank = -1;
  ncclUniqueId id{};
};

class OverlapCall {
 public:
  // host_enter_ns: when the handler started (TimelineNowNs), for the call's timeline.
  OverlapCall(const OverlapPlan& plan, const OverlapShape& shape, const OverlapBuffers& buffers,
              const OverlapPlace& place, int64_t host_enter_ns);
  OverlapCall(const OverlapCall&) = delete;
  OverlapCall& operator=(const OverlapCall&) = delete;

  // An error from Prepare leaves no other rank waiting for this call (nothing is enqueued; a
  // collective step fails on every rank together). A failure after which the other ranks may
  // wait (a copy graph build: they are past the address exchange) is kept instead, and Enqueue
  // releases them and returns it.
  Status Prepare();
  // After a successful Prepare: enqueues the call on `stream` (XLA's). Ok, or the group's
  // failure after the call ran anyway (so that no other rank waits for this one), or this
  // call's own failure after it released what the other ranks wait for (failed_call.h,
  // failed_nccl_call.h).
  Status Enqueue(cudaStream_t stream);

 private:
  Status EnqueueParts(cudaStream_t stream);  // Enqueue but the progress watchdog's mark
  Status CheckBuffers() const;
  Status Finish() const;  // the group's failure as this call's status, if the group failed

  const OverlapPlan plan_;
  const OverlapShape shape_;
  const OverlapBuffers buffers_;
  const OverlapPlace place_;
  const int64_t host_enter_ns_;
  CommState* state_ = nullptr;
  std::unique_lock<std::timed_mutex> lock_;
  std::string failure_;  // the group's failure when the call began ("" while healthy)
  Status prepare_failure_;  // a Prepare failure that Enqueue must release (see Prepare)
  SignalingGemmArgs gemm_;
  CopyEngineArgs copy_engine_;
  // Reduce-scatter and all-reduce: whether the call zeroes the communicator's counters first
  // (group_counters.h; its waits' bases are state_->counters.total), and whether its GEMM ran.
  bool zero_counters_ = false;
  bool gemm_launched_ = false;
};

}  // namespace fo_jax
