// Shared by the reduce-scatter transport probes (ce_rs_probe.cu, p2p_rs_probe.cu; not part of the
// library): NCCL error check, per-GPU preparation (kernels loaded, random operands), fo_jax's
// communicator settings, host wall-clock timing over all GPUs of one process, the signaling GEMM
// in the reduce-scatter layout, the library's band sum, result check, device-0 timelines.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/stream_wait.h"
#include "kernels/band_sum.h"
#include "kernels/signaling_gemm.h"
#include "probe_status.cuh"
#include "tool_common.cuh"

#define NK(x)                                                                           \
  do {                                                                                  \
    ncclResult_t r_ = (x);                                                              \
    if (r_ != ncclSuccess) {                                                            \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_));    \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

using Bf16 = __nv_bfloat16;

inline void SyncAll(int gpus) {
  for (int d = 0; d < gpus; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceSynchronize());
  }
}

// Host wall clock of `op` (enqueues one call on every GPU), all GPUs synchronized before and
// after: median over 5 trials of 20 back-to-back calls, ms per call (the anchors' method).
inline double TimeMs(int gpus, const std::function<void()>& op) {
  op();
  SyncAll(gpus);
  std::vector<double> t;
  for (int trial = 0; trial < 5; ++trial) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 20; ++r) op();
    SyncAll(gpus);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count() / 20);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

// bf16 GEMM arguments in the reduce-scatter layout: batch = P bands of m rows, group-major rows,
// `groups` uniform groups; with counters, zeroed on launch and `ready` recorded after the zeroing.
inline fo_jax::SignalingGemmArgs RsGemmArgs(int m, int n, int k, int P, const void* a,
                                            const void* b, void* d, int groups, int sm_budget,
                                            uint32_t* counters, cudaEvent_t ready) {
  fo_jax::SignalingGemmArgs g;
  g.dtype = fo_jax::GemmDtype::kBF16;
  g.m = m; g.n = n; g.k = k; g.batch = P;
  g.a = a; g.b = b; g.d = d;
  g.sm_budget = sm_budget;
  g.config = fo_jax::SelectGemmConfig(g.dtype, m, n, k, P, sm_budget);
  const int tm = fo_jax::GetGemmConfig(g.config).tile_m;
  const int tiles_m = (m + tm - 1) / tm;
  g.num_groups = groups;
  for (int i = 0; i <= groups; ++i) g.group_begin[i] = int(int64_t(tiles_m) * i / groups);
  if (counters != nullptr) {
    g.counters = counters;
    g.zero_counters_on_launch = true;
    g.after_zero_event = ready;
  }
  return g;
}

inline void LaunchGemmOrExit(cudaStream_t s, const fo_jax::SignalingGemmArgs& g) {
  std::string err;
  if (fo_jax::LaunchSignalingGemm(s, g, &err) != cudaSuccess) {
    std::printf("gemm: %s\n", err.c_str());
    std::exit(2);
  }
}

// The signaling GEMM in the reduce-scatter layout on every GPU of a probe (its Dev has the
// operands a, b, the output send, the counters ctr, the `ready` event and the stream gemm_s).
template <class Dev>
struct RsGemm {
  std::vector<Dev>& dev;
  int m, n, k, P;
  fo_jax::SignalingGemmArgs Args(int d, int groups, int sm_budget, bool signal) const {
    return RsGemmArgs(m, n, k, P, dev[d].a, dev[d].b, dev[d].send, groups, sm_budget,
                      signal ? dev[d].ctr : nullptr, dev[d].ready);
  }
  void Launch(int d, const fo_jax::SignalingGemmArgs& g) const {
    LaunchGemmOrExit(dev[d].gemm_s, g);
  }
  // One unsignaled GEMM per GPU on `sm_budget` SMs (0: all).
  std::function<void()> Alone(int sm_budget) const {
    return [this, sm_budget] {
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        Launch(d, Args(d, 1, sm_budget, false));
      }
    };
  }
};

// The library's band sum (csrc/kernels/band_sum.cu): out = sum of the parts, bf16.
inline void BandSumOrExit(cudaStream_t s, const std::vector<const void*>& parts, void* out,
                          size_t count, int max_blocks = 0) {
  std::string err;
  if (fo_jax::LaunchBandSum(s, fo_jax::GemmDtype::kBF16, parts.data(), int(parts.size()), out,
                            count, &err, max_blocks) != cudaSuccess) {
    std::printf("band sum: %s\n", err.c_str());
    std::exit(2);
  }
}

// On GPU d (current device): loads every kernel the probes launch (lazy loading would serialize
// first launches behind a running GEMM), allocates and fills the operands a [M, K] and b [K, N].
inline void PrepareGpuOrExit(int d, int M, int N, int K, Bf16** a, Bf16** b) {
  std::string err;
  if (fo_jax::LoadAllGemmKernels(&err) != cudaSuccess ||
      ProbeStatus(fo_jax::PrepareStreamWait(), &err) != cudaSuccess ||
      fo_jax::LoadBandSumKernels(&err) != cudaSuccess) {
    std::printf("load: %s\n", err.c_str());
    std::exit(2);
  }
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, FillRandom));
  CK(cudaMalloc(a, size_t(M) * K * 2));
  CK(cudaMalloc(b, size_t(K) * N * 2));
  FillRandom<<<1024, 256>>>(reinterpret_cast<uint16_t*>(*a), size_t(M) * K, 11 + d, 1);
  FillRandom<<<1024, 256>>>(reinterpret_cast<uint16_t*>(*b), size_t(K) * N, 101 + d, 1);
}

// The communicator settings fo_jax uses (32 CTAs, CGA cluster 1: csrc/comm/comm_registry.cc).
inline ncclConfig_t FoJaxCommConfig() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.maxCTAs = 32;
  c.cgaClusterSize = 1;
  return c;
}

// One communicator per GPU of this process (ranks = device ordinals 0..gpus-1), created together;
// comm_of(d) says where GPU d's goes.
template <class CommOf>
void InitCommsOrExit(int gpus, const ncclUniqueId& id, ncclConfig_t config, CommOf comm_of) {
  NK(ncclGroupStart());
  for (int d = 0; d < gpus; ++d) {
    CK(cudaSetDevice(d));
    ncclConfig_t c = config;
    NK(ncclCommInitRankConfig(comm_of(d), gpus, id, d, &c));
  }
  NK(ncclGroupEnd());
}

// max |a - b| / max |b| over n bf16 values (host copies).
inline double RelErr(const Bf16* a, const Bf16* b, size_t n) {
  std::vector<Bf16> ha(n), hb(n);
  CK(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    double x = __bfloat162float(ha[i]), y = __bfloat162float(hb[i]);
    diff = std::max(diff, std::fabs(x - y));
    ref = std::max(ref, std::fabs(y));
  }
  return diff / std::max(ref, 1e-30);
}

// Compares every GPU's out with its out_ref (count bf16 values each) and prints one check line;
// true when the worst relative error is within bf16 tolerance.
template <class Dev>
bool CheckAll(const std::vector<Dev>& dev, size_t count, const std::string& what) {
  double worst = 0;
  for (size_t d = 0; d < dev.size(); ++d) {
    CK(cudaSetDevice(int(d)));
    worst = std::max(worst, RelErr(dev[d].out, dev[d].out_ref, count));
  }
  std::printf("  check %-52s max|err|/max|ref| = %.2e %s\n", what.c_str(), worst,
              worst < 2e-2 ? "ok" : "MISMATCH");
  return worst < 2e-2;
}

// Device-0 timeline of one call: event name -> us after the call's first event.
struct Timeline {
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  void Mark(const std::string& name, cudaStream_t s) {
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    CK(cudaEventRecord(e, s));
    marks.push_back({name, e});
  }
  void Print() {
    std::printf("      timeline GPU0 (us):");
    for (size_t i = 1; i < marks.size(); ++i) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, marks[0].second, marks[i].second));
      std::printf(" %s %.0f", marks[i].first.c_str(), ms * 1000);
    }
    std::printf("\n");
    for (auto& m : marks) CK(cudaEventDestroy(m.second));
    marks.clear();
  }
};
