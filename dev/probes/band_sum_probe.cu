// Throughput of the band-sum kernel (csrc/kernels/band_sum.h) on one GPU: the copy-engine
// reduce-scatter's passes after the GEMM at 8192x8192x2048 on 4 GPUs (32 MiB bands): one pass of
// the own band and 3 received ones, the split form's first pass (own + 2) and second pass
// (out += last, in place). Prints us and GB/s of traffic (parts read + out written), median of
// 50 event-timed launches, each after a 256 MiB write that evicts L2 (as a GEMM would).
// Build: dev/README.md (target band_sum_probe); run on a 1-GPU machine. What it showed:
// docs/performance.md, 'What bounds the numbers'.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/band_sum.h"
#include "tool_common.cuh"

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("band_sum_probe  device: %s\n", prop.name);
  const size_t count = size_t(2048) * 8192, bytes = count * 2, flush_bytes = size_t(256) << 20;
  std::vector<uint16_t*> buf(5);
  for (auto& b : buf) {
    CK(cudaMalloc(&b, bytes));
    FillRandom<<<512, 256>>>(b, count, reinterpret_cast<uintptr_t>(b), 1);
  }
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  std::string err;
  CK(fo_jax::LoadBandSumKernels(&err));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  struct Case { const char* name; std::vector<int> parts; int out; };
  const std::vector<Case> cases = {{"one pass: own + 3 received", {0, 1, 2, 3}, 4},
                                   {"split, first: own + 2 received", {0, 1, 2}, 4},
                                   {"split, second: out += last (in place)", {4, 3}, 4}};
  for (const Case& c : cases) {
    std::vector<float> ms;
    for (int r = 0; r < 55; ++r) {
      CK(cudaMemsetAsync(flush, r, flush_bytes, s));
      const void* parts[8];
      for (size_t p = 0; p < c.parts.size(); ++p) parts[p] = buf[c.parts[p]];
      CK(cudaEventRecord(e0, s));
      CK(fo_jax::LaunchBandSum(s, fo_jax::GemmDtype::kBF16, parts, int(c.parts.size()),
                               buf[c.out], count, &err));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 5) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const float med = ms[ms.size() / 2];
    const double traffic = double(bytes) * (c.parts.size() + 1);
    std::printf("  %-40s %7.1f us  %6.0f GB/s  (min %.1f us)\n", c.name, med * 1e3,
                traffic / (med * 1e-3) / 1e9, ms[0] * 1e3);
  }
  return 0;
}
