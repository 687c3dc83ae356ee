// Turning a group table (tile-row boundaries) into kernel arguments and collective spans. Shared
// by the GEMM handler and the overlap handler: group arithmetic, SM budget, kernel loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/gated_collectives.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// Fills args.num_groups / group_begin from `group_begin` and checks it against the config's
// tile_m and m. Returns "" or a message.
std::string SetGroups(SignalingGemmArgs& args, const int32_t* group_begin, size_t size);

// First row of group g within one batch: min(group_begin[g] * tile_m, m).
int64_t GroupRow(const SignalingGemmArgs& args, int g);

// sm_budget attribute -> kernel argument: > 0 SMs, 0 all, < 0 "all but -budget" on the current
// device (the GEMM leaves those SMs to NCCL). At least 1.
int ResolveSmBudget(int budget);

// Loads every GEMM kernel on `device` once per process (LoadAllGemmKernels), so that no first
// launch is serialized by CUDA lazy loading (DESIGN.md). "" or the (remembered) failure.
std::string LoadGemmKernelsOnce(int device);

// The collective span of every group (DESIGN.md layouts): reduce-scatter reads the GEMM's
// group-major workspace and writes the final rows; all-reduce works in place on the output.
std::vector<GroupSpan> CollectiveSpans(const SignalingGemmArgs& args, Collective kind);

}  // namespace fo_jax
