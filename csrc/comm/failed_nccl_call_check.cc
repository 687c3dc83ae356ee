// See failed_nccl_call_check.h.
#include "comm/failed_nccl_call_check.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "comm/comm_registry.h"
#include "comm/failed_nccl_call.h"
#include "comm/gated_collectives.h"
#include "comm/gemm_plan.h"
#include "comm/gpu_check_resources.h"
#include "comm/stream_wait.h"

namespace fo_jax {
namespace {

constexpr int kM = 512, kN = 256, kGroups = 2;
constexpr size_t kGuardBytes = 4096;

}  // namespace

FailedNcclCallCheckResult RunFailedNcclCallCheck(Collective collective, GemmDtype dtype) {
  FailedNcclCallCheckResult r;
  if (collective == Collective::kAllGather || dtype == GemmDtype::kE4M3) {
    r.error = "the check takes a reduce-scatter or an all-reduce with a bf16 or fp16 output";
    return r;
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    r.error = std::string("cudaGetDevice: ") + cudaGetErrorString(err);
    return r;
  }
  Status s = PrepareStreamWait();
  ncclUniqueId id;
  if (s.ok()) s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr);
  CommState* state = nullptr;
  if (s.ok()) s = GetOrCreateCommState(device, id, 1, 0, CommOptions{}, &state);
  if (!s.ok()) {
    r.error = s.message();
    return r;
  }

  // The plan's GEMM as the NCCL transport's call has it: one batch (one rank), two groups of
  // two 128-row tile-rows.
  int config = -1;
  for (int i = 0; i < NumGemmConfigs(); ++i) {
    if (std::strcmp(GetGemmConfig(i).name, "pp_128x128x64_c1") == 0) config = i;
  }
  GemmPlan plan;
  plan.config = config;
  plan.num_groups = kGroups;
  for (int g = 0; g <= kGroups; ++g) plan.group_begin[g] = g * (kM / 128 / kGroups);
  s = config < 0 ? Status::Internal("no config pp_128x128x64_c1")
                 : ValidateGemmPlan(plan, kM, kN, 64);
  if (!s.ok()) {
    r.error = s.message();
    return r;
  }
  SignalingGemmArgs gemm = GemmArgsOf(plan, dtype, kM, kN, 64);

  const size_t out_bytes = size_t(kM) * kN * 2;
  const bool rs = collective == Collective::kReduceScatter;
  GpuCheckResources res;
  char *d = nullptr, *out = nullptr;
  uint32_t* counters = nullptr;
  if ((err = res.Alloc(&d, out_bytes + kGuardBytes)) != cudaSuccess ||
      (rs && (err = res.Alloc(&out, out_bytes)) != cudaSuccess) ||
      (err = res.Alloc(&counters, kGroups * sizeof(uint32_t))) != cudaSuccess ||
      (err = res.CreateStreams()) != cudaSuccess ||
      (err = cudaMemset(d, kStaleByte, out_bytes + kGuardBytes)) != cudaSuccess ||
      (rs && (err = cudaMemset(out, kStaleByte, out_bytes)) != cudaSuccess) ||
      (err = cudaMemset(counters, 0, kGroups * sizeof(uint32_t))) != cudaSuccess) {
    r.error = std::string("setting up: ") + cudaGetErrorString(err);
    return r;
  }
  if (!rs) out = d;  // the all-reduce sums in place, in the call's output
  gemm.d = d;
  gemm.counters = counters;
  {
    std::lock_guard<std::timed_mutex> lock(state->mu);  // as the overlap call holds it
    r.message = ReleaseFailedNcclCall(*state, res.call, collective, gemm, dtype, out,
                                      Status::Internal("GEMM launch failed (the check's)"))
                    .message();
  }
  if ((err = cudaStreamSynchronize(res.call)) != cudaSuccess) {
    r.error = std::string("running the failed call: ") + cudaGetErrorString(err);
    return r;
  }
  std::vector<uint16_t> got(out_bytes / 2);
  std::vector<uint8_t> guard(kGuardBytes);
  std::vector<uint32_t> count(kGroups);
  if ((err = cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
      (err = cudaMemcpy(guard.data(), d + out_bytes, kGuardBytes, cudaMemcpyDeviceToHost)) !=
          cudaSuccess ||
      (err = cudaMemcpy(count.data(), counters, kGroups * sizeof(uint32_t),
                        cudaMemcpyDeviceToHost)) != cudaSuccess) {
    r.error = std::string("reading back: ") + cudaGetErrorString(err);
    return r;
  }
  r.out_all_nan = true;
  for (uint16_t v : got) {
    r.out_all_nan = r.out_all_nan && (dtype == GemmDtype::kF16 ? F16IsNaN(v) : Bf16IsNaN(v));
  }
  r.guard_intact = true;
  for (uint8_t b : guard) r.guard_intact = r.guard_intact && b == kStaleByte;
  const std::vector<GroupSpan> spans = CollectiveSpans(gemm, collective);
  r.counters_set = true;
  for (int g = 0; g < kGroups; ++g) {
    r.counters_set = r.counters_set && count[g] == spans[g].expected;
  }
  return r;
}

}  // namespace fo_jax
