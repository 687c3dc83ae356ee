// See group_counters_check.h.
#include "comm/group_counters_check.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>

#include "comm/call_timeline.h"
#include "comm/comm_registry.h"
#include "comm/gemm_plan.h"
#include "comm/gpu_check_resources.h"
#include "comm/overlap_call.h"
#include "comm/status.h"
#include "comm/stream_wait.h"
#include "comm/test_failures.h"

namespace fo_jax {

GroupCountersCheckResult RunGroupCountersCheck(Collective collective, int config, int64_t m,
                                               int64_t n, int64_t k,
                                               const std::vector<GroupCountersCheckCall>& calls,
                                               uint32_t garbage, int64_t start_total,
                                               double timeout_s) {
  GroupCountersCheckResult r;
  if (collective != Collective::kReduceScatter && collective != Collective::kAllReduce) {
    r.error = "the check takes a reduce-scatter or an all-reduce";
    return r;
  }
  OverlapPlace place;
  cudaError_t err = cudaGetDevice(&place.device);
  if (err != cudaSuccess) {
    r.error = CudaStatus(err, "cudaGetDevice").message();
    return r;
  }
  place.rank = 0;
  Status s = PrepareStreamWait();
  if (s.ok()) s = NcclStatus(ncclGetUniqueId(&place.id), "ncclGetUniqueId", nullptr);
  CommState* state = nullptr;  // the communicator the calls get (the same id and options)
  if (s.ok()) s = GetOrCreateCommState(place.device, place.id, 1, 0, CommOptions{}, &state);
  if (!s.ok()) {
    r.error = s.message();
    return r;
  }

  OverlapShape shape;
  shape.m = m;
  shape.n = n;
  shape.k = k;
  const bool rs = collective == Collective::kReduceScatter;
  const size_t out_bytes = size_t(m) * n * 2;
  GpuCheckResources res;
  void *x = nullptr, *w = nullptr, *out = nullptr, *workspace = nullptr, *ref = nullptr;
  uint32_t* flags = nullptr;  // the custom call's third result, which these calls leave unwritten
  if ((err = res.Alloc(&x, size_t(m) * k * 2)) != cudaSuccess ||
      (err = res.Alloc(&w, size_t(k) * n * 2)) != cudaSuccess ||
      (err = res.Alloc(&out, out_bytes)) != cudaSuccess ||
      (rs && (err = res.Alloc(&workspace, out_bytes)) != cudaSuccess) ||
      (err = res.Alloc(&ref, out_bytes)) != cudaSuccess ||
      (err = res.Alloc(&flags, kGroupCounterBytes)) != cudaSuccess ||
      (err = res.CreateStreams()) != cudaSuccess) {
    r.error = CudaStatus(err, "setting up").message();
    return r;
  }
  std::mt19937_64 rng(1);
  const std::vector<uint8_t> hx = RandomElements(size_t(m) * k, GemmDtype::kBF16, rng);
  const std::vector<uint8_t> hw = RandomElements(size_t(k) * n, GemmDtype::kBF16, rng);
  if ((err = cudaMemcpy(x, hx.data(), hx.size(), cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaMemcpy(w, hw.data(), hw.size(), cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaDeviceSynchronize()) != cudaSuccess) {  // the calls' stream does not wait
    r.error = CudaStatus(err, "copying the operands").message();
    return r;
  }

  // The reference: the same configuration's GEMM with one group and no signals (deterministic:
  // each tile's sums run in one order whatever the groups).
  GemmPlan whole;
  whole.config = config;
  whole.num_groups = 1;
  const int tile_m = GetGemmConfig(config).tile_m;
  whole.group_begin[1] = static_cast<int>((m + tile_m - 1) / tile_m);
  s = ValidateGemmPlan(whole, m, n, k);
  if (s.ok()) {
    SignalingGemmArgs plain = GemmArgsOf(whole, GemmDtype::kBF16, m, n, k);
    plain.a = x;
    plain.b = w;
    plain.d = ref;
    std::string msg;
    s = LaunchStatus(LaunchSignalingGemm(res.call, plain, &msg), "reference GEMM", msg);
  }
  if (!s.ok()) {
    r.error = s.message();
    return r;
  }
  std::vector<uint16_t> expected(out_bytes / 2), got(out_bytes / 2);
  if ((err = cudaStreamSynchronize(res.call)) != cudaSuccess ||
      (err = cudaMemcpy(expected.data(), ref, out_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    r.error = CudaStatus(err, "running the reference GEMM").message();
    return r;
  }

  // Writes the counter words on `stream` (the calls' own, in order with them, or the release's)
  // and waits for it.
  auto write_words = [&](const std::vector<uint32_t>& values, cudaStream_t stream) {
    const cudaError_t e = cudaMemcpyAsync(state->counters.words, values.data(),
                                          kGroupCounterBytes, cudaMemcpyHostToDevice, stream);
    return e == cudaSuccess ? cudaStreamSynchronize(stream) : e;
  };
  const std::vector<uint32_t> garbage_words(kMaxGemmGroups, garbage);
  if (start_total >= 0) {
    std::lock_guard<std::timed_mutex> lock(state->mu);
    std::fill(state->counters.total, state->counters.total + kMaxGemmGroups,
              static_cast<uint32_t>(start_total));
    state->counters.zero_next = false;
    err = write_words(std::vector<uint32_t>(kMaxGemmGroups, static_cast<uint32_t>(start_total)),
                      res.call);
  } else {
    err = write_words(garbage_words, res.call);  // a new communicator's words are undefined
  }
  if (err != cudaSuccess) {
    r.error = CudaStatus(err, "setting the counters").message();
    return r;
  }

  for (size_t i = 0; i < calls.size(); ++i) {
    const GroupCountersCheckCall& c = calls[i];
    OverlapPlan plan;
    plan.collective = collective;
    plan.transport = Transport::kNccl;
    plan.axis_size = 1;
    plan.gemm.config = config;
    plan.gemm.num_groups = static_cast<int>(c.group_begin.size()) - 1;
    if (plan.gemm.num_groups < 1 || plan.gemm.num_groups > kMaxGemmGroups) {
      r.error = "call " + std::to_string(i) + ": 2 to kMaxGemmGroups + 1 group boundaries";
      return r;
    }
    std::copy(c.group_begin.begin(), c.group_begin.end(), plan.gemm.group_begin);
    OverlapBuffers buffers;
    buffers.x = x;
    buffers.w = w;
    buffers.out = out;
    buffers.out_elems = out_bytes / 2;
    buffers.workspace = workspace;
    buffers.workspace_elems = rs ? out_bytes / 2 : 0;
    buffers.counters = flags;
    buffers.counters_elems = static_cast<size_t>(plan.gemm.num_groups);
    if ((err = cudaMemsetAsync(out, kStaleByte, out_bytes, res.call)) != cudaSuccess ||
        (rs && (err = cudaMemsetAsync(workspace, kStaleByte, out_bytes, res.call)) !=
                   cudaSuccess)) {
      r.error = CudaStatus(err, "filling the outputs").message();
      return r;
    }

    GroupCountersCheckStep step;
    std::vector<uint32_t> totals_before(kMaxGemmGroups);
    {
      std::lock_guard<std::timed_mutex> lock(state->mu);
      step.zeroed = state->counters.zero_next;
      std::copy(state->counters.total, state->counters.total + kMaxGemmGroups,
                totals_before.begin());
    }
    {
      OverlapCall call(plan, shape, buffers, place, TimelineNowNs());  // holds the lock
      s = call.Prepare();
      if (!s.ok()) {
        r.error = "call " + std::to_string(i) + " did not prepare: " + s.message();
        return r;
      }
      if (c.fail_launch) SetTestFailureForTests(FailStage::kLaunch, 0);
      s = call.Enqueue(res.call);
      if (c.fail_launch) SetTestFailureForTests(FailStage::kNone, -1);
    }
    step.ok = s.ok();
    step.message = s.message();
    double ms = 0;
    if ((err = cudaEventRecord(res.done, res.call)) != cudaSuccess) {
      r.error = CudaStatus(err, "recording call " + std::to_string(i) + "'s end").message();
      return r;
    }
    if (res.AwaitDone(std::chrono::steady_clock::now(), timeout_s, &ms) == cudaErrorNotReady) {
      // Release every wait that could still hold the call, then report it.
      std::vector<uint32_t> release(kMaxGemmGroups);
      for (int g = 0; g < kMaxGemmGroups; ++g) release[g] = totals_before[g] + (1u << 30);
      (void)write_words(release, res.release);
      (void)cudaStreamSynchronize(res.call);
      r.error = "call " + std::to_string(i) + " did not finish within " +
                std::to_string(timeout_s) + " s (its waits were released)";
      return r;
    }
    step.words.resize(kMaxGemmGroups);
    if ((err = cudaStreamSynchronize(res.call)) != cudaSuccess ||
        (err = cudaMemcpy(step.words.data(), state->counters.words, kGroupCounterBytes,
                          cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (err = cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
      r.error = CudaStatus(err, "running call " + std::to_string(i)).message();
      return r;
    }
    step.out_equal = std::memcmp(got.data(), expected.data(), out_bytes) == 0;
    {
      std::lock_guard<std::timed_mutex> lock(state->mu);
      step.totals.assign(state->counters.total, state->counters.total + kMaxGemmGroups);
    }
    r.steps.push_back(std::move(step));
    if (!s.ok()) {
      // What a failed group may leave in the words; the group made healthy again, as a restart
      // would, so that the next calls count.
      ClearCommGroupFailureForTests(*state);
      if ((err = write_words(garbage_words, res.call)) != cudaSuccess) {
        r.error = CudaStatus(err, "filling the counters").message();
        return r;
      }
    }
  }
  return r;
}

}  // namespace fo_jax
