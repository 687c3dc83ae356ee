// One-GPU check and timing of the signaling GEMM as the copy-engine reduce-scatter's ring runs
// it (SignalingGemmArgs' addend with per-group flags, abandoned word, NaN tile and tail output),
// without peers: rank 0 of 4 at 8192x8192x2048, its visit order rotated by one band, the
// partial sums "received" in a [3 bands, N] addend, the own band stored into a [band, N] output.
//  1. correctness, against the plain kernel's output (same rotation and groups): the first band
//     visited equal bit for bit (it adds TMA's zero fill), the next two = plain + their addend
//     rows, the own band = plain + the last addend rows, written to the tail output only (its
//     rows of D keep their poison); "+" within 3 bf16 ulps (two roundings against one);
//  2. the wait: with every flag 0 and the addend poisoned the kernel must not read it; 5 ms
//     after the launch a second stream writes the addend group by group, each followed by its
//     flag (from pinned memory: the copy engine, as a peer's copy): the kernel still runs at
//     5 ms, then ends with the right result;
//  3. timing: plain vs ring kernel, back to back on one stream (CUDA events), us per call,
//     in A B B A order.
// Build: dev/README.md (target gemm_ring_probe; links the library's kernels).
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

#include "comm/stream_wait.h"
#include "kernels/signaling_gemm.h"
#include "probe_status.cuh"
#include "tool_common.cuh"

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
  CK(ProbeStatus(fo_jax::PrepareStreamWait(), &err));
  const size_t band = size_t(M / P) * N;
  const size_t all = size_t(M) * N;
  uint16_t *a, *b, *d0, *d1, *c, *c_src, *out;
  uint32_t *counters, *flags, *abandoned;
  CK(cudaMalloc(&a, size_t(M) * K * 2));
  CK(cudaMalloc(&b, size_t(K) * N * 2));
  CK(cudaMalloc(&d0, all * 2));
  CK(cudaMalloc(&d1, all * 2));
  CK(cudaMalloc(&c, 3 * band * 2));
  CK(cudaMalloc(&c_src, 3 * band * 2));
  CK(cudaMalloc(&out, band * 2));
  CK(cudaMalloc(&counters, 64 * 4));
  CK(cudaMalloc(&flags, 64 * 4));
  CK(cudaMalloc(&abandoned, 4));
  CK(cudaMemset(abandoned, 0, 4));  // no call released: the tiles that add the addend sum it
  void* nan_tile;
  CK(cudaMalloc(&nan_tile, 256 * 256 * 2));
  CK(cudaMemset(nan_tile, 0xFF, 256 * 256 * 2));
  FillRandom<<<1024, 256>>>(a, size_t(M) * K, 1, 1);
  FillRandom<<<1024, 256>>>(b, size_t(K) * N, 2, 1);
  FillRandom<<<1024, 256>>>(c_src, 3 * band, 3, 1);
  CK(cudaMemcpy(c, c_src, 3 * band * 2, cudaMemcpyDeviceToDevice));
  std::vector<uint32_t> ones(64, 1), zeros(64, 0);
  CK(cudaMemcpy(flags, ones.data(), 64 * 4, cudaMemcpyHostToDevice));

  SignalingGemmArgs args;
  args.m = M;
  args.n = N;
  args.k = K;
  args.a = a;
  args.b = b;
  args.config = cfg;
  const int bounds[] = {0, 4, 8, 16, 24, 32, 40, 48, 64};
  args.num_groups = 8;
  for (int g = 0; g <= 8; ++g) args.group_begin[g] = bounds[g];
  args.counters = counters;
  args.zero_counters_on_launch = true;
  args.rotate_tile_rows = tiles_chunk;  // rank 0: the band for rank 1 first, its own last
  SignalingGemmArgs plain = args, ring = args;
  plain.d = d0;
  ring.d = d1;
  ring.addend_first_tile_row = tiles_chunk;
  ring.addend = c;
  ring.addend_flags = flags;
  ring.addend_flag_value = 1;
  ring.addend_abandoned = abandoned;  // as the ring call passes them: their cost is timed
  ring.addend_nan = nan_tile;
  ring.tail_out = out;
  ring.tail_first_tile_row = (P - 1) * tiles_chunk;
  cudaStream_t s, s2;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());

  const size_t band_rows = M / P;
  auto check = [&](const char* what) {
    std::vector<uint16_t> h0(all), h1(all), hc(3 * band), ho(band);
    CK(cudaMemcpy(h0.data(), d0, all * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1.data(), d1, all * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hc.data(), c_src, hc.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ho.data(), out, ho.size() * 2, cudaMemcpyDeviceToHost));
    size_t first_diff = 0, bad_sum = 0, own_d_written = 0, bad_by_band[4] = {}, own_zero = 0;
    int shown = 0;
    double worst = 0;
    for (size_t l = 0; l < size_t(M); ++l) {  // logical row (visit order)
      const size_t phys = (l + band_rows) % M;
      for (size_t j = 0; j < size_t(N); ++j) {
        const size_t i = phys * N + j;
        if (l < band_rows) {
          first_diff += h0[i] != h1[i];
          continue;
        }
        const bool own = l >= 3 * band_rows;
        if (own) own_d_written += h1[i] != 0xffff;
        const double want =
            double(Bf16ToFloat(h0[i])) + Bf16ToFloat(hc[(l - band_rows) * N + j]);
        const double got = Bf16ToFloat(own ? ho[(l - 3 * band_rows) * N + j] : h1[i]);
        const double e = std::fabs(got - want) / (std::fabs(want) + 1.0);
        worst = e > worst || std::isnan(e) ? e : worst;
        const bool bad = !(e <= 3 * 0.0078125);  // three bf16 ulps of 1 (NaN counts)
        if (bad && shown < 4) {
          ++shown;
          std::printf("  bad at logical row %zu col %zu: got %g, plain %g, addend %g\n", l, j, got,
                      double(Bf16ToFloat(h0[i])), double(Bf16ToFloat(hc[(l - band_rows) * N + j])));
        }
        if (own && ho[(l - 3 * band_rows) * N + j] == 0) ++own_zero;
        bad_sum += bad;
        bad_by_band[l / band_rows] += bad;
      }
    }
    const bool ok = first_diff == 0 && bad_sum == 0 && own_d_written == 0;
    std::printf("%s: first band differing from plain %zu (want 0); plain + addend: worst rel err "
                "%.4g, beyond 3 ulps %zu (want 0); own band's rows of D written %zu (want 0) "
                "-> %s\n", what, first_diff, worst, bad_sum, own_d_written, ok ? "PASS" : "FAIL");
    if (bad_sum) {
      std::printf("  beyond 3 ulps by band of the visit order: step 1 %zu, step 2 %zu, own %zu; "
                  "own band outputs still 0 (never stored?) %zu\n",
                  bad_by_band[1], bad_by_band[2], bad_by_band[3], own_zero);
      // Which tiles of the own band are wrong (tile-rows x column tiles of 128 x 192).
      std::printf("  own band bad tiles (tile-row: count of 43 column tiles):");
      for (size_t tr = 0; tr < band_rows / 128; ++tr) {
        int bad_tiles = 0;
        for (size_t tc = 0; tc * 192 < size_t(N); ++tc) {
          bool any = false;
          for (size_t r = tr * 128; r < tr * 128 + 128 && !any; r += 7) {
            for (size_t c2 = tc * 192; c2 < std::min(size_t(N), tc * 192 + 192) && !any; c2 += 5) {
              const size_t l2 = 3 * band_rows + r, ph = (l2 + band_rows) % M;
              const double w2 = double(Bf16ToFloat(h0[ph * N + c2])) +
                                Bf16ToFloat(hc[(l2 - band_rows) * N + c2]);
              const double g2 = Bf16ToFloat(ho[r * N + c2]);
              any = !(std::fabs(g2 - w2) / (std::fabs(w2) + 1.0) <= 3 * 0.0078125);
            }
          }
          bad_tiles += any;
        }
        std::printf(" %zu:%d", tr, bad_tiles);
      }
      std::printf("\n");
    }
    return ok;
  };

  CK(fo_jax::LaunchSignalingGemm(s, plain, &err));
  Finish(s, "plain kernel");
  CK(cudaMemset(d1, 0xff, all * 2));  // NaN in bf16: the own band's rows of D must keep it
  CK(cudaDeviceSynchronize());
  CK(fo_jax::LaunchSignalingGemm(s, ring, &err));
  Finish(s, "ring kernel, flags set");
  bool ok = check("flags set");

  // The wait: flags 0 and the addend poisoned; 5 ms later a second stream writes the addend
  // group by group, each followed by its flag, as the transport does: the copy from pinned host
  // memory (the copy engine, as a peer's copy; a device-to-device copy on the same GPU runs as a
  // kernel, which waits for SMs that the GEMM holds), the flag by cuStreamWriteValue32, which
  // fences the stream's earlier writes (comm/stream_wait.h).
  uint16_t* h_c;
  CK(cudaMallocHost(&h_c, 3 * band * 2));
  CK(cudaMemcpy(h_c, c_src, 3 * band * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(flags, zeros.data(), 64 * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(c, 0xff, 3 * band * 2));
  CK(cudaMemset(d1, 0xff, all * 2));
  CK(cudaMemset(out, 0, band * 2));
  // cudaMemset of device memory does not wait on the host, and these streams do not wait for the
  // legacy stream's memsets: without this, a memset could run after the kernel (once it frees
  // its SMs) and overwrite its output.
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  CK(fo_jax::LaunchSignalingGemm(s, ring, &err));
  CK(cudaEventRecord(e1, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool still_running = cudaEventQuery(e1) == cudaErrorNotReady;
  const size_t row_elems = size_t(128) * N;  // one tile-row
  for (int g = 0; g + 1 < args.num_groups; ++g) {  // the sender's groups of its first 3 steps
    if (bounds[g] >= 3 * tiles_chunk) break;
    const size_t at = bounds[g] * row_elems, count = (bounds[g + 1] - bounds[g]) * row_elems;
    CK(cudaMemcpyAsync(c + at, h_c + at, count * 2, cudaMemcpyHostToDevice, s2));
    CK(ProbeStatus(fo_jax::EnqueueWriteValue(s2, flags + g, 1), &err));
  }
  Finish(s2, "addend and flags written");
  Finish(s, "ring kernel waiting for the flags");
  float waited_ms = 0;
  CK(cudaEventElapsedTime(&waited_ms, e0, e1));
  std::printf("wait: kernel still running 5 ms after launch with the flags unset: %s; it took "
              "%.2f ms\n", still_running ? "yes" : "NO", waited_ms);
  ok = check("flags set 5 ms late") && still_running && ok;

  // Timing, back to back, in A B B A order (the GPU's clock drifts as it warms: a fixed order
  // would bias the later kernel), 30 calls per sample; the median sample of each.
  std::vector<float> samples[2];
  for (int rep = 0; rep < 12; ++rep) {
    for (int q = 0; q < 2; ++q) {
      const int which = (rep % 2 == 0) ? q : 1 - q;  // 0 plain, 1 ring
      const SignalingGemmArgs& run = which == 0 ? plain : ring;
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
                which == 0 ? "plain" : "ring", v[v.size() / 2], v.front(), v.back(), v.size());
  }
  std::printf("pairs (plain, ring) in order:");
  for (size_t i = 0; i < samples[0].size(); ++i) {
    std::printf(" (%.0f, %.0f)", samples[0][i], samples[1][i]);
  }
  std::printf("\n");
  std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
  return ok ? 0 : 1;
}
