// See gemm_plan.h.
#include "comm/gemm_plan.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <mutex>

namespace fo_jax {

Status ValidateGemmPlan(const GemmPlan& plan, int64_t rows, int64_t n, int64_t k) {
  if (plan.config < 0 || plan.config >= NumGemmConfigs()) {
    return Status::InvalidArgument("GEMM config index " + std::to_string(plan.config) +
                                   " out of range (" + std::to_string(NumGemmConfigs()) +
                                   " compiled)");
  }
  if (plan.batch < 1 || rows % plan.batch) {
    return Status::InvalidArgument("batch " + std::to_string(plan.batch) + " does not divide " +
                                   std::to_string(rows) + " rows");
  }
  if (rows <= 0 || n <= 0 || k <= 0) return Status::InvalidArgument("empty GEMM");
  const int tile_m = GetGemmConfig(plan.config).tile_m;
  const int64_t m = rows / plan.batch;
  const int64_t tile_rows = (m + tile_m - 1) / tile_m;
  const int g = plan.num_groups;
  if (g < 1 || g > kMaxGemmGroups) {
    return Status::InvalidArgument("group table must have 2.." +
                                   std::to_string(kMaxGemmGroups + 1) + " entries");
  }
  if (plan.group_begin[0] != 0 || plan.group_begin[g] != tile_rows) {
    return Status::InvalidArgument(
        "group table must start at 0 and end at the tile-row count " +
        std::to_string(tile_rows) + " (tile_m " + std::to_string(tile_m) + ")");
  }
  for (int i = 1; i <= g; ++i) {
    if (plan.group_begin[i] <= plan.group_begin[i - 1]) {
      return Status::InvalidArgument("group table must be strictly increasing");
    }
  }
  return Status::Ok();
}

Status ValidateGemmPlanDtype(const GemmPlan& plan, GemmDtype dtype, int64_t k) {
  if (plan.config < 0 || plan.config >= NumGemmConfigs()) {
    return Status::InvalidArgument("GEMM config index " + std::to_string(plan.config) +
                                   " out of range");
  }
  const bool fp8 = dtype == GemmDtype::kE4M3;
  if (!GemmConfigSupportsDtype(plan.config, dtype)) {
    return Status::InvalidArgument(
        std::string("GEMM config ") + GetGemmConfig(plan.config).name + " has no " +
        (fp8 ? "fp8 kernel (fp8 operands need an fp8_* config)"
             : "bf16/f16 kernel (fp8_* configs take fp8 operands only)"));
  }
  if (fp8 && k % 16 != 0) {
    return Status::InvalidArgument("fp8 operands need k a multiple of 16, got " +
                                   std::to_string(k));
  }
  return Status::Ok();
}

SignalingGemmArgs GemmArgsOf(const GemmPlan& plan, GemmDtype dtype, int64_t rows, int64_t n,
                             int64_t k) {
  SignalingGemmArgs args;
  args.dtype = dtype;
  args.batch = plan.batch;
  args.m = static_cast<int>(rows / plan.batch);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  args.sm_budget = plan.sm_budget;
  args.config = plan.config;
  args.num_groups = plan.num_groups;
  std::copy(plan.group_begin, plan.group_begin + plan.num_groups + 1, args.group_begin);
  return args;
}

int64_t GroupRow(const SignalingGemmArgs& args, int g) {
  const int64_t tile_m = GetGemmConfig(args.config).tile_m;
  return std::min<int64_t>(args.group_begin[g] * tile_m, args.m);
}

Status LoadGemmKernelsOnce(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<std::string, kMaxDevices> errors;
  if (device < 0 || device >= kMaxDevices) {
    return Status::Internal("device ordinal " + std::to_string(device) + " out of range");
  }
  std::call_once(once[device], [&] {
    std::string msg;
    if (LoadAllGemmKernels(&msg) != cudaSuccess) errors[device] = "loading GEMM kernels: " + msg;
  });
  return errors[device].empty() ? Status::Ok() : Status::Internal(errors[device]);
}

int ResolveSmBudget(int budget) {
  if (budget >= 0) return budget;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;  // all SMs; the launch reports any real CUDA failure
  }
  return std::max(1, sms + budget);
}

}  // namespace fo_jax
