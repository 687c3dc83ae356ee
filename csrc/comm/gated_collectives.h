// The NCCL transport: the consumer half of the overlap. On the comm stream, for each output group
// in order, wait until the GEMM's counter for it is full, then run NCCL on that group's
// contiguous bytes.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/comm_registry.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// One group: reduce-scatter sends `count * nranks` elements from send + send_offset and receives
// `count` at recv + recv_offset; all-reduce reduces `count` elements in place at recv_offset.
struct GroupSpan {
  size_t send_offset = 0;  // elements
  size_t recv_offset = 0;  // elements
  size_t count = 0;        // elements (per rank for reduce-scatter)
  uint32_t expected = 0;   // counter value meaning "group done"
};

// The collective span of every group (docs/design.md, "The signaling GEMM"): the
// reduce-scatter reads the GEMM's group-major workspace and writes the final rows; the
// all-reduce works in place on the output. A group's expected counter value is its tile count
// plus counter_base[g] (the communicator's counters: group_counters.h; nullptr: counters that
// start at zero).
std::vector<GroupSpan> CollectiveSpans(const SignalingGemmArgs& args, Collective kind,
                                       const uint32_t* counter_base = nullptr);

// Enqueues the gated collectives. Precondition (caller, on `xla_stream`): state->inputs_ready
// recorded (after the counters' zeroing, where the call zeroes them), then the producer GEMM
// launched. Afterwards `xla_stream` waits
// for the comm stream, so XLA never reuses a buffer NCCL still touches.
Status EnqueueGatedCollectives(CommState& state, cudaStream_t xla_stream, Collective kind,
                               ncclDataType_t dtype, const void* send, void* recv,
                               size_t elem_bytes, const uint32_t* counters,
                               const std::vector<GroupSpan>& groups);

// The NCCL transport's part of an overlapped call whose GEMM (arguments `gemm`, output
// gemm.d) was just launched on `xla_stream` after recording state.inputs_ready: the gated
// collectives into `out`, then the end of the call noted for the progress watchdog
// (comm_registry.h). out_dtype: the GEMM's output's (OverlapShape::out_dtype; gemm.dtype is
// the operands', float8_e4m3fn for an fp8 GEMM that writes bf16), the collectives' data type.
// counter_base: as for CollectiveSpans.
Status EnqueueNcclTransport(CommState& state, cudaStream_t xla_stream, Collective kind,
                            const SignalingGemmArgs& gemm, GemmDtype out_dtype, void* out,
                            const uint32_t* counter_base = nullptr);

}  // namespace fo_jax
