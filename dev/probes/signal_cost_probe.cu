// Diagnostic: what do a signaling GEMM's signals cost, and where? Times fo_jax's GEMM of one tile
// configuration with and without counters at 1, 2, 4, ... groups (up to one per tile-row), the
// same kernel and tile order in each pair, round-robin on the same inputs. The counters are
// zeroed before the first event, so a pair's difference is the kernel's alone (the Python
// benchmark, bench_signal_overhead.py, also counts the zeroing launch). Read against the groups:
// a difference that stays put is a fixed cost per CTA (the last signal, which waits for the CTA's
// last stores); one that grows with the groups is a cost per signal (a cooperative CTA signals
// once per group it works in, a ping-pong one once per tile). Every output is checked first:
// bit-identical across a configuration's cases, its counters each tile counted once.
// Build: dev/lease/build_gemm_selftest.sh (or the CMake target). Run:
//   signal_cost_probe [--dtype bf16|fp8] [--config NAME ...] [--rounds N] [--no-counter-check]
//                     [--chain N] [MxNxK ...]
// --rounds: timed launches per case (default 30). --no-counter-check: for the diagnostic builds
// of dev/lease/build_signal_variants.sh that drop signals on purpose (the outputs are still
// checked).
// Default: fp8 on the configurations its choice takes at the design shapes (cooperative
// 128x192, fast-accumulation ping-pong 128x192), 4096x8192x2048 and 8192x8192x2048.
// --chain N: then, per configuration at 8 groups, chains of N back-to-back launches between two
// events (no sleep between them, as a stream of calls runs), per launch: the kernel without
// counters; with counters zeroed once before the chain; and with counters zeroed before every
// launch by a memset, by a one-warp kernel that stores the zeroes, and by one batch of 32-bit
// stream writes (cuStreamBatchMemOp; the probe says if the driver refuses it). The zeroings'
// columns less the zeroed-once column are what zeroing between two kernels costs in stream
// time, which the Python benchmark's kernel time does not show and its wall-clock time does
// (bench_signal_overhead.py, "with zeroing, wall").
#include <cuda.h>  // types and enums only; the entry point comes from cudaGetDriverEntryPoint
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/signaling_gemm.h"
#include "tool_common.cuh"

namespace {

// Uniform in [-1, -1/8] U [1/8, 1], as e4m3 bytes.
__global__ void FillRandomE4M3(uint8_t* p, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = Hash(seed * 0x9E3779B97F4A7C15ULL + i);
    float v = 0.125f + 0.875f * float(h >> 8) / float(1u << 24);
    if (h & 1) v = -v;
    __nv_fp8_e4m3 q(v);
    p[i] = *reinterpret_cast<uint8_t*>(&q);
  }
}

// Counts the 16-bit words where got and want differ.
__global__ void CountDiffering(const uint16_t* got, const uint16_t* want, size_t count,
                               unsigned* differing) {
  unsigned local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    local += got[i] != want[i];
  }
  if (local) atomicAdd(differing, local);
}

// Counts the 16-bit words equal to `word` (0xffff: the NaN poison left where nothing was stored).
__global__ void CountEqual(const uint16_t* got, size_t count, uint16_t word, unsigned* equal) {
  unsigned local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    local += got[i] == word;
  }
  if (local) atomicAdd(equal, local);
}

struct Case {
  std::string name;
  fo_jax::SignalingGemmArgs args;
  std::vector<float> ms;
};

using BatchMemOpFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);

BatchMemOpFn ResolveBatchMemOp() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", &fn, 12000, cudaEnableDefault,
                                       &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<BatchMemOpFn>(fn);
}

// The zeroing as a kernel of its own: one warp stores `count` zero words.
__global__ void ZeroWords(uint32_t* p, int count) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) p[i] = 0;
}

enum class Zeroing { kNoCounters, kOnce, kMemset, kKernel, kWrites };
constexpr int kZeroings = int(Zeroing::kWrites) + 1;

// One chain: `launches` back-to-back launches of `g` between two events, the counters zeroed as
// `z` says. Microseconds per launch, or -1 if a launch or a batch of writes was refused (the
// reason in *why).
float ChainUsPerLaunch(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1,
                       fo_jax::SignalingGemmArgs g, uint32_t* counters, Zeroing z, int launches,
                       BatchMemOpFn batch, std::string* why) {
  g.counters = z == Zeroing::kNoCounters ? nullptr : counters;
  CK(cudaMemsetAsync(counters, 0, fo_jax::kMaxGemmGroups * sizeof(uint32_t), s));
  CUstreamBatchMemOpParams ops[fo_jax::kMaxGemmGroups];
  std::memset(ops, 0, sizeof(ops));
  for (int q = 0; q < g.num_groups; ++q) {
    ops[q].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[q].writeValue.address = reinterpret_cast<CUdeviceptr>(counters + q);
    ops[q].writeValue.value = 0;
    // The default (a stream-scoped fence before the write): the v2 API, the one a CUDA 12+
    // entry point resolves to, refuses CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER as an invalid value.
    ops[q].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  }
  SleepNs<<<1, 1, 0, s>>>(50000);  // the chain is enqueued before the GPU reaches it
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < launches; ++i) {
    if (z == Zeroing::kMemset) {
      CK(cudaMemsetAsync(counters, 0, size_t(g.num_groups) * sizeof(uint32_t), s));
    } else if (z == Zeroing::kKernel) {
      ZeroWords<<<1, 32, 0, s>>>(counters, g.num_groups);
      CK(cudaGetLastError());
    } else if (z == Zeroing::kWrites) {
      const CUresult r = batch(reinterpret_cast<CUstream>(s), unsigned(g.num_groups), ops, 0);
      if (r != CUDA_SUCCESS) {
        *why = "cuStreamBatchMemOp refused: CUresult " + std::to_string(int(r));
        CK(cudaStreamSynchronize(s));
        return -1.f;
      }
    }
    if (fo_jax::LaunchSignalingGemm(s, g, why) != cudaSuccess) {
      CK(cudaStreamSynchronize(s));
      return -1.f;
    }
  }
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return 1e3f * ms / launches;
}

}  // namespace

int main(int argc, char** argv) {
  fo_jax::GemmDtype dtype = fo_jax::GemmDtype::kE4M3;
  std::vector<std::string> configs, shapes;
  int rounds = 30;
  int chain = 0;
  bool check_counters = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc) {
      const std::string d = argv[++i];
      dtype = d == "bf16" ? fo_jax::GemmDtype::kBF16 : fo_jax::GemmDtype::kE4M3;
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--chain" && i + 1 < argc) {
      chain = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--no-counter-check") {
      check_counters = false;
    } else if (a == "--config") {
      while (i + 1 < argc && argv[i + 1][0] != '-' && fo_jax::FindGemmConfig(argv[i + 1]) >= 0) {
        configs.push_back(argv[++i]);
      }
    } else {
      shapes.push_back(a);
    }
  }
  const bool fp8 = dtype == fo_jax::GemmDtype::kE4M3;
  if (configs.empty()) {
    configs = fp8 ? std::vector<std::string>{"fp8_coop_128x192x128_c2", "fp8fast_pp_128x192x128_c2"}
                  : std::vector<std::string>{"pp_128x192x64_c2", "coop_128x256x64_c1"};
  }
  if (shapes.empty()) shapes = {"4096x8192x2048", "8192x8192x2048"};

  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("signal_cost_probe  device: %s (%d SMs); %s; median of %d round-robin event-timed "
              "launches (a 50 us sleep kernel ahead of each; counters zeroed before the first "
              "event)%s\n", prop.name, prop.multiProcessorCount, fp8 ? "fp8 e4m3 -> bf16" : "bf16",
              rounds, check_counters ? "" : "; counters not checked");
  std::string err;
  if (fo_jax::LoadAllGemmKernels(&err) != cudaSuccess) {
    std::printf("%s\n", err.c_str());
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t* counters;
  CK(cudaMalloc(&counters, fo_jax::kMaxGemmGroups * sizeof(uint32_t)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const size_t in_bytes = fo_jax::GemmInputBytes(dtype);

  for (const std::string& sh : shapes) {
    int m, n, k;
    if (std::sscanf(sh.c_str(), "%dx%dx%d", &m, &n, &k) != 3) continue;
    void *a, *b, *d;
    CK(cudaMalloc(&a, size_t(m) * k * in_bytes));
    CK(cudaMalloc(&b, size_t(k) * n * in_bytes));
    CK(cudaMalloc(&d, size_t(m) * n * 2));
    if (fp8) {
      FillRandomE4M3<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(a), size_t(m) * k, 1);
      FillRandomE4M3<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(b), size_t(k) * n, 2);
    } else {
      FillRandom<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(a), size_t(m) * k, 1, 1);
      FillRandom<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(b), size_t(k) * n, 2, 1);
    }
    std::vector<Case> cases;
    for (const std::string& name : configs) {
      const int cfg = fo_jax::FindGemmConfig(name.c_str());
      if (cfg < 0 || !fo_jax::GemmConfigSupportsDtype(cfg, dtype)) {
        std::printf("%s: no %s kernel\n", name.c_str(), fp8 ? "fp8" : "bf16");
        continue;
      }
      const fo_jax::GemmTileConfig& c = fo_jax::GetGemmConfig(cfg);
      const int tiles_m = (m + c.tile_m - 1) / c.tile_m;
      for (int groups = 1; groups <= std::min(tiles_m, fo_jax::kMaxGemmGroups); groups *= 2) {
        for (bool sig : {false, true}) {
          fo_jax::SignalingGemmArgs g;
          g.dtype = dtype;
          g.m = m; g.n = n; g.k = k; g.a = a; g.b = b; g.d = d;
          g.config = cfg;
          g.num_groups = groups;
          for (int i = 0; i <= groups; ++i) g.group_begin[i] = int(int64_t(tiles_m) * i / groups);
          g.counters = sig ? counters : nullptr;
          char label[96];
          std::snprintf(label, sizeof(label), "%s %2dg%s", c.name, groups, sig ? "+sig" : "");
          cases.push_back({label, g, {}});
        }
      }
    }
    // A launch the launcher refuses (e.g. groups that split a cluster's rows) drops its pair.
    // Every case of a configuration computes the same tiles in the same order: its output must
    // be bit-identical to the configuration's first case's (D poisoned with NaNs before each).
    void* want;
    unsigned* differing;
    CK(cudaMalloc(&want, size_t(m) * n * 2));
    CK(cudaMalloc(&differing, sizeof(unsigned)));
    int want_config = -1;
    for (size_t i = 0; i + 1 < cases.size();) {
      bool ok = true;
      for (int j = 0; j < 2 && ok; ++j) {
        const fo_jax::SignalingGemmArgs& g = cases[i + j].args;
        CK(cudaMemsetAsync(counters, 0, fo_jax::kMaxGemmGroups * sizeof(uint32_t), s));
        CK(cudaMemsetAsync(d, 0xff, size_t(m) * n * 2, s));
        if (fo_jax::LaunchSignalingGemm(s, g, &err) != cudaSuccess) {
          std::printf("  %s: not run: %s\n", cases[i + j].name.c_str(), err.c_str());
          ok = false;
          continue;
        }
        const bool first = g.config != want_config;
        CK(cudaMemsetAsync(differing, 0, sizeof(unsigned), s));
        if (first) {  // its reference: every element stored
          CountEqual<<<264, 256, 0, s>>>(static_cast<const uint16_t*>(d), size_t(m) * n, 0xffff,
                                         differing);
          CK(cudaMemcpyAsync(want, d, size_t(m) * n * 2, cudaMemcpyDeviceToDevice, s));
          want_config = g.config;
        } else {
          CountDiffering<<<264, 256, 0, s>>>(static_cast<const uint16_t*>(d),
                                             static_cast<const uint16_t*>(want), size_t(m) * n,
                                             differing);
        }
        unsigned host = 0;
        CK(cudaMemcpyAsync(&host, differing, sizeof(host), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        if (host != 0) {
          std::printf("%s: %u of %zu outputs %s\n", cases[i + j].name.c_str(), host,
                      size_t(m) * n, first ? "never stored" : "differ from its first case's");
          return 1;
        }
        if (g.counters != nullptr && check_counters) {  // every tile counted once
          const int tile_n = fo_jax::GetGemmConfig(g.config).tile_n;
          std::vector<uint32_t> got(g.num_groups);
          CK(cudaMemcpy(got.data(), counters, got.size() * sizeof(uint32_t),
                        cudaMemcpyDeviceToHost));
          for (int q = 0; q < g.num_groups; ++q) {
            const uint32_t want_count =
                uint32_t(g.group_begin[q + 1] - g.group_begin[q]) * ((n + tile_n - 1) / tile_n);
            if (got[q] != want_count) {
              std::printf("%s: counter %d is %u, want %u\n", cases[i + j].name.c_str(), q,
                          got[q], want_count);
              return 1;
            }
          }
        }
      }
      CK(cudaStreamSynchronize(s));
      if (ok) {
        i += 2;
      } else {
        cases.erase(cases.begin() + i, cases.begin() + i + 2);
      }
    }
    for (int round = 0; round < rounds + 5; ++round) {
      for (Case& c : cases) {
        if (c.args.counters != nullptr) {
          CK(cudaMemsetAsync(counters, 0, fo_jax::kMaxGemmGroups * sizeof(uint32_t), s));
        }
        SleepNs<<<1, 1, 0, s>>>(50000);
        const float ms = EventTimedMs(s, e0, e1, [&] {
          return fo_jax::LaunchSignalingGemm(s, c.args, &err) == cudaSuccess;
        });
        if (ms < 0) {
          std::printf("%s: %s\n", c.name.c_str(), err.c_str());
          return 2;
        }
        if (round >= 5) c.ms.push_back(ms);
      }
    }
    std::printf("\n%s\n  %-40s %9s %9s %9s\n", sh.c_str(), "config, groups", "ms", "+sig ms",
                "sig us");
    for (size_t i = 0; i + 1 < cases.size(); i += 2) {
      const float med[2] = {Median(cases[i].ms), Median(cases[i + 1].ms)};
      std::printf("  %-40s %9.4f %9.4f %+9.2f\n", cases[i].name.c_str(), med[0], med[1],
                  1e3f * (med[1] - med[0]));
    }
    if (chain > 0) {
      const BatchMemOpFn batch = ResolveBatchMemOp();
      const char* names[kZeroings] = {"no counters", "zeroed once", "memset each", "kernel each",
                                      "writes each"};
      std::printf("\n%s, chains of %d launches (median of %d), us per launch\n  %-28s", sh.c_str(),
                  chain, rounds, "config");
      for (const char* z : names) std::printf(" %12s", z);
      std::printf("\n");
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        // Per configuration, its signalled case with the most groups up to 8 (the overlap's).
        const Case& c = cases[ci];
        const bool more = ci + 2 < cases.size() &&
                          cases[ci + 2].args.config == c.args.config &&
                          cases[ci + 2].args.num_groups <= 8;
        if (c.args.counters == nullptr || c.args.num_groups > 8 || more) continue;
        std::vector<float> us[kZeroings];
        std::string why[kZeroings];
        for (int round = 0; round < rounds + 2; ++round) {
          for (int z = 0; z < kZeroings; ++z) {
            if (Zeroing(z) == Zeroing::kWrites && batch == nullptr) {
              why[z] = "no cuStreamBatchMemOp entry point";
              continue;
            }
            const float v = ChainUsPerLaunch(s, e0, e1, c.args, counters, Zeroing(z), chain,
                                             batch, &why[z]);
            if (v >= 0 && round >= 2) us[z].push_back(v);
          }
        }
        std::printf("  %-28s", fo_jax::GetGemmConfig(c.args.config).name);
        for (int z = 0; z < kZeroings; ++z) {
          if (us[z].empty()) {
            std::printf(" %12s", "-");
          } else {
            std::printf(" %12.2f", Median(us[z]));
          }
        }
        std::printf("\n");
        for (int z = 0; z < kZeroings; ++z) {
          if (us[z].empty() && !why[z].empty()) std::printf("    %s: %s\n", names[z], why[z].c_str());
        }
      }
    }
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(d)); CK(cudaFree(want)); CK(cudaFree(differing));
  }
  return 0;
}
