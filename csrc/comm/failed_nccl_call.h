// The NCCL transport's counterpart of failed_call.h: a reduce-scatter or all-reduce whose GEMM
// launch failed on this rank. The peers' collectives of this call wait inside NCCL for this
// rank's, which wait for the GEMM's counters; so the counters are set to "group done" on XLA's
// stream, and the call's collectives run as a healthy call's do: every rank stays in step. What
// they send is the GEMM's output, filled with NaNs first, so every rank's sums of this call read
// as failed in the same call: in other processes too, which learn of the failure only later
// (fo_jax/_failure_watch.py) and whose call of this epoch returns. The group then fails, so every
// later call raises.
#pragma once

#include <cuda_runtime.h>

#include "comm/comm_registry.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// On XLA's thread, under state.mu, instead of the GEMM that `gemm` describes (its counters
// zeroed or not) and before the call's collectives: its output gemm.d filled with NaNs and the
// counters set on `xla_stream`,
// state.inputs_ready recorded after them, the gated collectives into `out` (of `out_dtype`)
// (gated_collectives.h); then the group fails with `cause`. Returns the call's error.
// counter_base: as for CollectiveSpans (the values written are the ones the waits expect).
Status ReleaseFailedNcclCall(CommState& state, cudaStream_t xla_stream, Collective kind,
                             const SignalingGemmArgs& gemm, GemmDtype out_dtype, void* out,
                             const Status& cause, const uint32_t* counter_base = nullptr);

}  // namespace fo_jax
