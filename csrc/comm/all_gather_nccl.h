// The all-gather's NCCL transport (docs/design.md, "The all-gather"): the GEMM consumes the
// gathered rows band by band while NCCL brings them. On XLA's stream: the band flags zeroed, the
// own rows copied into the gathered output and their flags set, inputs_ready, then the consumer
// GEMM (SignalingGemmArgs::wait_flags) on the SMs it leaves NCCL. On the comm stream, after
// inputs_ready: step s = 1 .. P-1, chunk by chunk, sends this rank's chunk to rank + s and
// receives rank - s's into its rows of the gathered output (ncclSend / ncclRecv in one group),
// then writes that band's flag (a stream memory operation, no SM). XLA's stream then waits for
// the comm stream.
//
// Why it cannot hang on the GEMM: the GEMM waits for NCCL, never the reverse, and NCCL's kernels
// run on the SMs the GEMM's budget leaves free (the planner leaves them: fo_jax/_plan.py); the
// own rows' device copy (a kernel on one GPU) is enqueued before the GEMM on the same stream.
// Every rank runs the same steps in the same order, so the sends and receives pair.
#pragma once

#include <cuda_runtime.h>

#include "comm/comm_registry.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// One all-gather call's device memory (XLA's): x [m / P, k] of this rank, the gathered output
// [m, k] (the GEMM's A), one flag word per band.
struct AllGatherBuffers {
  const void* x = nullptr;
  void* gathered = nullptr;
  uint32_t* flags = nullptr;
};

// Enqueues the whole call on `xla_stream` and the comm stream; InvalidArgument, before
// enqueueing anything, when gemm.sm_budget leaves NCCL no SM. `gemm`: OverlapGemmArgs of the
// validated plan for state.rank, with b, d and sm_budget set; a and wait_flags are set here.
// Afterwards XLA's stream waits for the comm stream, and the call's end is noted for the
// progress watchdog (comm_registry.h).
Status EnqueueAllGatherNccl(CommState& state, cudaStream_t xla_stream, const OverlapPlan& plan,
                            const OverlapShape& shape, SignalingGemmArgs gemm,
                            const AllGatherBuffers& buffers);

}  // namespace fo_jax
