// One-GPU check and timing of the signaling GEMM's addends (SignalingGemmArgs: the copy-engine
// reduce-scatter's own band adds the chunk received first in the epilogue), without peers:
//  1. correctness: the source kernel's output equals the plain kernel's on every row outside the
//     addend's tile-rows (bit for bit: they add TMA's zero fill) and plain + addend (two
//     roundings against one: a few bf16 ulps) on its rows, with the copy-engine call's rotation
//     and groups (8192x8192x2048, rank 0 of 4: own band = physical rows 0-2047);
//  2. the wait: with the flag still 0 the kernel must not read the addend (a second stream
//     copies the addend in and then sets the flag, 5 ms after the launch): the result is still
//     right and the kernel ends after the flag;
//  3. timing: plain vs source kernel, back to back on one stream (CUDA events), us per call,
//     in A B B A order.
// Build (links the library's kernels; no NCCL/XLA code is pulled in):
//   nvcc -std=c++17 -arch=sm_90a -O2 -Icsrc csrc/tools/gemm_addend_probe.cu \
//        .devbuild/libfo_jax_cuda.a -o .devbuild/gemm_addend_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/signaling_gemm.h"
#include "tools/tool_common.cuh"

using fo_jax::SignalingGemmArgs;

// Waits for the stream with a deadline; a stuck kernel ends the tool (exit 3) with a message.
static void Finish(cudaStream_t s, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      std::printf("%s: %s\n", what, cudaGetErrorString(e));
      std::_Exit(2);
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      std::printf("HANG: %s did not finish within 10 s\n", what);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf("done: %s\n", what);
}

static float Bf16ToFloat(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const int M = 8192, N = 8192, K = 2048, P = 4, tiles_chunk = 16;
  int cfg = -1;
  for (int i = 0; i < fo_jax::NumGemmConfigs(); ++i) {
    if (std::string(fo_jax::GetGemmConfig(i).name) == "pp_128x192x64_c2") cfg = i;
  }
  if (cfg < 0 || !fo_jax::GemmConfigTakesAddends(cfg)) {
    std::printf("FAIL: no pp_128x192x64_c2 addend kernel\n");
    return 1;
  }
  std::string err;
  CK(fo_jax::LoadAllGemmKernels(&err));
  uint16_t *a, *b, *d0, *d1, *c, *c_src;
  uint32_t *counters, *flag;
  const size_t band = size_t(M / P) * N;
  CK(cudaMalloc(&a, size_t(M) * K * 2));
  CK(cudaMalloc(&b, size_t(K) * N * 2));
  CK(cudaMalloc(&d0, size_t(M) * N * 2));
  CK(cudaMalloc(&d1, size_t(M) * N * 2));
  CK(cudaMalloc(&c, band * 2));
  CK(cudaMalloc(&c_src, band * 2));
  CK(cudaMalloc(&counters, 64 * 4));
  CK(cudaMalloc(&flag, 4));
  FillRandom<<<1024, 256>>>(a, size_t(M) * K, 1, 1);
  FillRandom<<<1024, 256>>>(b, size_t(K) * N, 2, 1);
  FillRandom<<<1024, 256>>>(c_src, band, 3, 1);
  CK(cudaMemcpy(c, c_src, band * 2, cudaMemcpyDeviceToDevice));
  const uint32_t one = 1;
  CK(cudaMemcpy(flag, &one, 4, cudaMemcpyHostToDevice));

  SignalingGemmArgs args;
  args.m = M;
  args.n = N;
  args.k = K;
  args.a = a;
  args.b = b;
  args.config = cfg;
  const int bounds[] = {0, 8, 16, 24, 32, 40, 48, 64};
  args.num_groups = 7;
  for (int g = 0; g <= 7; ++g) args.group_begin[g] = bounds[g];
  args.counters = counters;
  args.zero_counters_on_launch = true;
  args.rotate_tile_rows = tiles_chunk;  // rank 0: the band for rank 1 first, its own last
  SignalingGemmArgs plain = args, source = args;
  plain.d = d0;
  source.d = d1;
  source.addend_first_tile_row = (P - 1) * tiles_chunk;
  source.addend = c;
  source.addend_flag = flag;
  source.addend_flag_value = 1;
  cudaStream_t s, s2;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());

  auto check = [&](const char* what) {
    std::vector<uint16_t> h0(size_t(M) * N), h1(size_t(M) * N), hc(band);
    CK(cudaMemcpy(h0.data(), d0, h0.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1.data(), d1, h1.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hc.data(), c_src, hc.size() * 2, cudaMemcpyDeviceToHost));
    size_t diff_outside = 0, bad_inside = 0;
    double worst = 0;
    for (size_t r = 0; r < size_t(M); ++r) {
      for (size_t j = 0; j < size_t(N); ++j) {
        const size_t i = r * N + j;
        if (r >= size_t(M / P)) {
          diff_outside += h0[i] != h1[i];
        } else {
          const double want = double(Bf16ToFloat(h0[i])) + Bf16ToFloat(hc[i]);
          const double got = Bf16ToFloat(h1[i]);
          const double e = std::fabs(got - want) / (std::fabs(want) + 1.0);
          worst = e > worst ? e : worst;
          bad_inside += e > 3 * 0.0078125;  // three bf16 ulps of 1
        }
      }
    }
    std::printf("%s: rows outside the addend differing %zu (want 0); inside: worst rel err "
                "%.4g, beyond 3 ulps %zu (want 0) -> %s\n",
                what, diff_outside, worst, bad_inside,
                diff_outside == 0 && bad_inside == 0 ? "PASS" : "FAIL");
    return diff_outside == 0 && bad_inside == 0;
  };

  CK(fo_jax::LaunchSignalingGemm(s, plain, &err));
  Finish(s, "plain kernel");
  {
    // Every tile adds (no tile's source is outside the addend): isolates TMA's zero fill.
    uint16_t* c_all;
    CK(cudaMalloc(&c_all, size_t(M) * N * 2));
    CK(cudaMemset(c_all, 0, size_t(M) * N * 2));
    SignalingGemmArgs all = source;
    all.addend_first_tile_row = 0;
    all.addend = c_all;
    CK(fo_jax::LaunchSignalingGemm(s, all, &err));
    Finish(s, "source kernel, every tile adding (zeros)");
  }
  CK(fo_jax::LaunchSignalingGemm(s, source, &err));
  Finish(s, "source kernel, own band adding");
  bool ok = check("flag set");

  // The wait: flag 0 and the addend poisoned; 5 ms later a second stream writes the addend and
  // then the flag (stream order: the copy completes first), both from pinned host memory, i.e.
  // by the copy engine as a peer's copy would be (a device-to-device copy on the same GPU runs
  // as a kernel, which waits for SMs that the GEMM holds while it waits for the flag).
  uint16_t* h_c;
  uint32_t* h_one;
  CK(cudaMallocHost(&h_c, band * 2));
  CK(cudaMallocHost(&h_one, 4));
  *h_one = 1;
  CK(cudaMemcpy(h_c, c_src, band * 2, cudaMemcpyDeviceToHost));
  const uint32_t zero = 0;
  CK(cudaMemcpy(flag, &zero, 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(c, 0xff, band * 2));  // NaN in bf16
  CK(cudaMemset(d1, 0, size_t(M) * N * 2));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  CK(fo_jax::LaunchSignalingGemm(s, source, &err));
  CK(cudaEventRecord(e1, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool still_running = cudaEventQuery(e1) == cudaErrorNotReady;
  CK(cudaMemcpyAsync(c, h_c, band * 2, cudaMemcpyHostToDevice, s2));
  CK(cudaMemcpyAsync(flag, h_one, 4, cudaMemcpyHostToDevice, s2));
  Finish(s2, "addend and flag written");
  Finish(s, "source kernel waiting for the flag");
  float waited_ms = 0;
  CK(cudaEventElapsedTime(&waited_ms, e0, e1));
  std::printf("wait: kernel still running 5 ms after launch with the flag unset: %s; it took "
              "%.2f ms\n", still_running ? "yes" : "NO", waited_ms);
  ok = check("flag set 5 ms late") && still_running && ok;

  // Timing, back to back, in A B B A order (the GPU's clock drifts as it warms: a fixed order
  // would bias the later kernel), 30 calls per sample; the median sample of each.
  std::vector<float> samples[2];
  for (int rep = 0; rep < 12; ++rep) {
    for (int q = 0; q < 2; ++q) {
      const int which = (rep % 2 == 0) ? q : 1 - q;  // 0 plain, 1 source
      const SignalingGemmArgs& run = which == 0 ? plain : source;
      const int calls = 30;
      for (int i = 0; i < 3; ++i) CK(fo_jax::LaunchSignalingGemm(s, run, &err));
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < calls; ++i) CK(fo_jax::LaunchSignalingGemm(s, run, &err));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      samples[which].push_back(1000.f * ms / calls);
    }
  }
  for (int which = 0; which < 2; ++which) {
    std::vector<float> v = samples[which];
    std::sort(v.begin(), v.end());
    std::printf("timing %-6s median %.1f us per call (min %.1f, max %.1f, %zu samples of 30)\n",
                which == 0 ? "plain" : "source", v[v.size() / 2], v.front(), v.back(), v.size());
  }
  std::printf("pairs (plain, source) in order:");
  for (size_t i = 0; i < samples[0].size(); ++i) {
    std::printf(" (%.0f, %.0f)", samples[0][i], samples[1][i]);
  }
  std::printf("\n");
  std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
  return ok ? 0 : 1;
}
