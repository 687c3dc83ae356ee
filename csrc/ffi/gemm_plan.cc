// See gemm_plan.h.
#include "ffi/gemm_plan.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <mutex>

namespace fo_jax {

std::string SetGroups(SignalingGemmArgs& args, const int32_t* group_begin, size_t size) {
  if (args.config < 0 || args.config >= NumGemmConfigs()) return "GEMM config index out of range";
  const int tile_m = GetGemmConfig(args.config).tile_m;
  const int tile_rows = (args.m + tile_m - 1) / tile_m;
  if (size < 2 || size > static_cast<size_t>(kMaxGemmGroups) + 1) {
    return "group table must have 2.." + std::to_string(kMaxGemmGroups + 1) + " entries";
  }
  if (group_begin[0] != 0 || group_begin[size - 1] != tile_rows) {
    return "group table must start at 0 and end at the tile-row count " +
           std::to_string(tile_rows) + " (tile_m " + std::to_string(tile_m) + ")";
  }
  for (size_t i = 1; i < size; ++i) {
    if (group_begin[i] <= group_begin[i - 1]) return "group table must be strictly increasing";
  }
  args.num_groups = static_cast<int>(size - 1);
  std::copy(group_begin, group_begin + size, args.group_begin);
  return "";
}

int64_t GroupRow(const SignalingGemmArgs& args, int g) {
  const int64_t tile_m = GetGemmConfig(args.config).tile_m;
  return std::min<int64_t>(args.group_begin[g] * tile_m, args.m);
}

std::string LoadGemmKernelsOnce(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<std::string, kMaxDevices> errors;
  if (device < 0 || device >= kMaxDevices) return "device ordinal out of range";
  std::call_once(once[device], [&] {
    std::string msg;
    if (LoadAllGemmKernels(&msg) != cudaSuccess) errors[device] = "loading GEMM kernels: " + msg;
  });
  return errors[device];
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

std::vector<GroupSpan> CollectiveSpans(const SignalingGemmArgs& args, Collective kind) {
  std::vector<GroupSpan> spans(args.num_groups);
  const int64_t n = args.n;
  for (int g = 0; g < args.num_groups; ++g) {
    const int64_t r0 = GroupRow(args, g), r1 = GroupRow(args, g + 1);
    GroupSpan& s = spans[g];
    s.expected = static_cast<uint32_t>(ExpectedGroupCount(args, g));
    s.recv_offset = static_cast<size_t>(r0 * n);
    s.count = static_cast<size_t>((r1 - r0) * n);
    // Reduce-scatter: group g is rows [batch*r0, batch*r1) of the workspace (batch == nranks).
    s.send_offset = kind == Collective::kReduceScatter ? static_cast<size_t>(args.batch * r0 * n)
                                                       : s.recv_offset;
  }
  return spans;
}

}  // namespace fo_jax
