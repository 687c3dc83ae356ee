// The signaling GEMM's part of a call's plan (fo_jax/_plan.py, GemmPlan) and the host-side
// arithmetic on it, shared by the GEMM handler and the overlap call: validation against the
// operands, the kernel arguments it gives, the SM budget on this device, kernel loading.
#pragma once

#include <cstdint>
#include <string>

#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct GemmPlan {
  int config = -1;  // index into the compiled configurations (GetGemmConfig)
  int batch = 1;    // > 1: the group-major layout of `batch` bands (signaling_gemm.h)
  int num_groups = 0;
  int group_begin[kMaxGemmGroups + 1] = {};  // tile-row boundaries, within one batch
  int sm_budget = 0;  // > 0: SMs; 0: all; < 0: all but that many (ResolveSmBudget)
};

// Checks `plan` for a GEMM of x[rows, k] @ w[k, n] (rows = batch * m): a compiled config, a
// batch that divides rows, and a group table of 1 to kMaxGemmGroups groups, strictly
// increasing from 0 to the tile-row count ceil(m / tile_m).
Status ValidateGemmPlan(const GemmPlan& plan, int64_t rows, int64_t n, int64_t k);

// Checks that the plan's config has kernels for `dtype` (fp8 rows for fp8 operands, the others
// for bf16 and f16) and, for fp8, k a multiple of 16 (the operands' rows are 16-byte TMA rows).
Status ValidateGemmPlanDtype(const GemmPlan& plan, GemmDtype dtype, int64_t k);

// The kernel arguments of a validated plan, without buffers or counters; sm_budget as planned
// (ResolveSmBudget turns a negative one into SMs on the calling thread's device).
SignalingGemmArgs GemmArgsOf(const GemmPlan& plan, GemmDtype dtype, int64_t rows, int64_t n,
                             int64_t k);

// First row of group g within one batch: min(group_begin[g] * tile_m, m).
int64_t GroupRow(const SignalingGemmArgs& args, int g);

// A planned SM budget -> the kernel argument: > 0 SMs, 0 all, < 0 "all but -budget" on the
// current device (the GEMM leaves those SMs to NCCL or to the round sums). At least 1.
int ResolveSmBudget(int budget);

// Loads every GEMM kernel on `device` once per process (LoadAllGemmKernels), so that no first
// launch is serialized by CUDA lazy loading (docs/troubleshooting.md, "Lazy module loading"). Ok or
// the (remembered) failure.
Status LoadGemmKernelsOnce(int device);

}  // namespace fo_jax
