// Public API of the signaling GEMM (signaling_gemm.h): config table, shape heuristic, argument
// validation, dispatch to the generated instantiations, and eager kernel loading. Contains no
// CUTLASS code itself so that it compiles quickly; the kernels live in generated/gemm_*.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "signaling_gemm.h"
#include "signaling_gemm_internal.h"

#include "generated/gemm_config_table.inc"

namespace fo_jax {
namespace {

constexpr int kNumConfigs = int(sizeof(detail::kGemmConfigs) / sizeof(detail::kGemmConfigs[0]));

// The dispatch arrays of a dtype: plain, with a source, consumer (nullptr where a row has none).
struct DtypeKernels {
  const detail::RunGemmFn* run;
  const detail::RunGemmFn* run_source;
  const detail::RunGemmFn* run_consumer;
  const detail::LoadGemmFn* load;
  const detail::LoadGemmFn* load_source;
  const detail::LoadGemmFn* load_consumer;
};

constexpr DtypeKernels kKernels[] = {
    {detail::kRunGemm_bf16, detail::kRunGemmSource_bf16, detail::kRunGemmConsumer_bf16,
     detail::kLoadGemm_bf16, detail::kLoadGemmSource_bf16, detail::kLoadGemmConsumer_bf16},
    {detail::kRunGemm_f16, detail::kRunGemmSource_f16, detail::kRunGemmConsumer_f16,
     detail::kLoadGemm_f16, detail::kLoadGemmSource_f16, detail::kLoadGemmConsumer_f16},
    {detail::kRunGemm_e4m3, detail::kRunGemmSource_e4m3, detail::kRunGemmConsumer_e4m3,
     detail::kLoadGemm_e4m3, detail::kLoadGemmSource_e4m3, detail::kLoadGemmConsumer_e4m3},
};

bool KnownDtype(GemmDtype dtype) {
  return dtype == GemmDtype::kBF16 || dtype == GemmDtype::kF16 || dtype == GemmDtype::kE4M3;
}

const DtypeKernels& KernelsOf(GemmDtype dtype) { return kKernels[static_cast<int>(dtype)]; }

// The library's own configurations by name (always in the table).
int ConfigIndex(const char* name) {
  const int i = FindGemmConfig(name);
  return i < 0 ? 0 : i;
}

cudaError_t Fail(std::string* error, cudaError_t code, const std::string& message) {
  if (error != nullptr) *error = message;
  return code;
}

constexpr int kMaxDevices = 64;
std::atomic<int> g_device_sms[kMaxDevices];

cudaError_t DeviceSms(int device, int* sms) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int cached = g_device_sms[device].load(std::memory_order_relaxed);
  if (cached <= 0) {
    cudaError_t e = cudaDeviceGetAttribute(&cached, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    g_device_sms[device].store(cached, std::memory_order_relaxed);
  }
  *sms = cached;
  return cudaSuccess;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A consumer kernel for every dtype the row serves (the 16-bit rows serve bf16 and f16, the fp8
// rows e4m3).
bool HasConsumer(int config) {
  if (config < 0 || config >= kNumConfigs) return false;
  bool serves_any = false;
  for (GemmDtype dtype : {GemmDtype::kBF16, GemmDtype::kF16, GemmDtype::kE4M3}) {
    if (KernelsOf(dtype).run[config] == nullptr) continue;
    if (KernelsOf(dtype).run_consumer[config] == nullptr) return false;
    serves_any = true;
  }
  return serves_any;
}

bool SupportsDtype(int config, GemmDtype dtype) {
  return config >= 0 && config < kNumConfigs && KnownDtype(dtype) &&
         KernelsOf(dtype).run[config] != nullptr;
}

// The configuration a launch runs: args.config, or the heuristic's pick.
int ResolveConfig(const SignalingGemmArgs& args) {
  if (args.config >= 0) return args.config;
  if (args.wait_flags != nullptr) {
    return SelectConsumerGemmConfig(args.dtype, args.m, args.n, args.k, args.band_rows,
                                    args.sm_budget);
  }
  return SelectGemmConfig(args.dtype, args.m, args.n, args.k, args.batch, args.sm_budget);
}

// "" or why the consumer arguments (wait_flags set) do not fit config cfg.
std::string ConsumerProblem(const SignalingGemmArgs& args, int cfg) {
  const GemmTileConfig& c = detail::kGemmConfigs[cfg];
  const std::string in_config = std::string(" (config ") + c.name + ")";
  if (!HasConsumer(cfg)) {
    return std::string("config ") + c.name + " has no consumer kernel (wait_flags set); use "
           "config -1 or one of csrc/kernels/gemm_configs.py's CONSUMER_CONFIGS";
  }
  if (args.batch != 1 || args.rotate_tile_rows != 0 || args.rotate_period_tile_rows != 0 ||
      args.addend != nullptr) {
    return "a consumer launch (wait_flags set) needs batch 1, no tile-row rotation and no addend "
           "(band_order sets the visit order)";
  }
  const int cluster_rows = c.tile_m * c.cluster_m;
  if (args.band_rows <= 0 || args.band_rows % cluster_rows != 0 || args.m % args.band_rows != 0) {
    return "band_rows must be a positive multiple of tile_m * cluster_m = " +
           std::to_string(cluster_rows) + " dividing m = " + std::to_string(args.m) + " (got " +
           std::to_string(args.band_rows) + ")" + in_config;
  }
  const int num_bands = args.m / args.band_rows;
  if (num_bands > kMaxGemmBands) {
    return "m / band_rows = " + std::to_string(num_bands) + " bands, more than " +
           std::to_string(kMaxGemmBands);
  }
  if ((reinterpret_cast<uintptr_t>(args.wait_flags) & 3u) != 0) {
    return "wait_flags must be 4-byte aligned";
  }
  bool seen[kMaxGemmBands] = {};
  for (int s = 0; s < num_bands; ++s) {
    const int b = args.band_order[s];
    if (b < 0 || b >= num_bands || seen[b]) {
      return "band_order[0.." + std::to_string(num_bands - 1) + "] must be a permutation of "
             "the bands 0.." + std::to_string(num_bands - 1) + " (entry " + std::to_string(s) +
             " is " + std::to_string(b) + ")";
    }
    seen[b] = true;
  }
  const int band_tiles = args.band_rows / c.tile_m;
  for (int g = 0; g < args.num_groups; ++g) {
    const int t0 = args.group_begin[g], t1 = args.group_begin[g + 1];
    if (t1 > t0 && t0 / band_tiles != (t1 - 1) / band_tiles) {
      return "group " + std::to_string(g) + " (tile-rows " + std::to_string(t0) + ".." +
             std::to_string(t1 - 1) + ") spans two bands of " + std::to_string(band_tiles) +
             " tile-rows: every band boundary must be a group boundary" + in_config;
    }
  }
  return "";
}

}  // namespace

int NumGemmConfigs() { return kNumConfigs; }

int FindGemmConfig(const char* name) {
  for (int i = 0; i < kNumConfigs; ++i) {
    if (std::strcmp(detail::kGemmConfigs[i].name, name) == 0) return i;
  }
  return -1;
}

bool GemmConfigTakesAddends(int config) {
  return config >= 0 && config < kNumConfigs && detail::kRunGemmSource_bf16[config] != nullptr &&
         detail::kRunGemmSource_f16[config] != nullptr;
}

bool GemmConfigHasConsumer(int config) { return HasConsumer(config); }

bool GemmConfigSupportsDtype(int config, GemmDtype dtype) { return SupportsDtype(config, dtype); }

const GemmTileConfig& GetGemmConfig(int index) {
  if (index < 0 || index >= kNumConfigs) index = 0;
  return detail::kGemmConfigs[index];
}

// Heuristic (measured on H200: kernel times under the JAX profiler,
// benchmarks/results/gemm_profile_h200_*.log; earlier selftest logs beside them). On the TP
// shapes (4096..16384 x 8192 x 2048..7168) ping-pong 128x192 with a 2x1 cluster runs at
// 0.97-0.99x XLA's cuBLASLt kernel, 2-10% ahead of the cooperative 128x256/256x128 tiles. When it
// would not fill two waves of the SM budget, the ping-pong 128x128 tile keeps more SMs busy.
// The small-M rows (64-row tiles) are left to the measured choice (fo_jax/_gemm_choice.py).
//
// fp8, a wave model (measured on one H100: benchmarks/results/gemm_fp8_h100_2026-11-24_f8ea3c2.md,
// every fp8 configuration on 16 shapes): a persistent kernel's time is its waves (tiles over the
// SMs, rounded up: a last partial wave costs nearly a whole one) times the cost of one wave, and
// a wave of cooperative 128x192 tiles costs 1.32x one of 128x128 tiles (1.29-1.34x at the large
// shapes) for 1.5x the work. The cheaper of the two is the pick; it was the fastest configuration
// on all 16 shapes, where the previous rule (128x192 from two waves on) lost up to 1.38x at small
// ones. Ping-pong 64x192 was never the fastest there (its two 64-row tiles per SM cost 2.1x a
// 128x128 wave); it stays the pick only where a 128-row tile would be more than half empty
// (rows <= 64), which was not measured.
int SelectGemmConfig(GemmDtype dtype, int m, int n, int k, int batch, int sm_budget) {
  (void)k;
  const int sms = sm_budget > 0 ? sm_budget : 132;
  const long long rows = static_cast<long long>(m) * (batch > 0 ? batch : 1);
  const long long tiles_big = ((rows + 127) / 128) * ((n + 191) / 192);
  if (dtype == GemmDtype::kE4M3) {
    if (rows <= 64) return ConfigIndex("fp8_pp_64x192x128_c2");
    const long long tiles_128 = ((rows + 127) / 128) * ((n + 127) / 128);
    const long long waves_128 = (tiles_128 + sms - 1) / sms;
    const long long waves_192 = (tiles_big + sms - 1) / sms;
    return ConfigIndex(100 * waves_128 <= 132 * waves_192 ? "fp8_coop_128x128x128_c1"
                                                          : "fp8_coop_128x192x128_c2");
  }
  if (tiles_big >= 2LL * sms) return ConfigIndex("pp_128x192x64_c2");
  return ConfigIndex("pp_128x128x64_c1");
}

int SelectConsumerGemmConfig(GemmDtype dtype, int m, int n, int k, int band_rows,
                             int sm_budget) {
  const int cfg = SelectGemmConfig(dtype, m, n, k, 1, sm_budget);
  const GemmTileConfig& c = detail::kGemmConfigs[cfg];
  const bool fits = band_rows > 0 && band_rows % (c.tile_m * c.cluster_m) == 0;
  if (HasConsumer(cfg) && fits) return cfg;
  return ConfigIndex(dtype == GemmDtype::kE4M3 ? "fp8_coop_128x128x128_c1" : "pp_128x128x64_c1");
}

namespace {
// Tail tiles (CTA tiles) a split-K launch may have on `sms` SMs: under one cluster per resident
// slot, at most all the problem's cluster tiles.
long long SplitKTailTiles(const SignalingGemmArgs& args, int sms) {
  const GemmTileConfig& c = GetGemmConfig(ResolveConfig(args));
  const long long tiles_m = (args.m + c.tile_m - 1) / c.tile_m;
  const long long units =
      args.batch * ((tiles_m + c.cluster_m - 1) / c.cluster_m) * ((args.n + c.tile_n - 1) / c.tile_n);
  const int budget = args.sm_budget > 0 && args.sm_budget < sms ? args.sm_budget : sms;
  const long long slots = budget / c.cluster_m;
  return std::min(units, std::max(slots - 1, 0LL)) * c.cluster_m;
}
}  // namespace

long long SplitKFlagWords(const SignalingGemmArgs& args, int sms) {
  if (args.k_splits <= 1) return 0;
  return SplitKTailTiles(args, sms);
}

long long SplitKPartialFloats(const SignalingGemmArgs& args, int sms) {
  if (args.k_splits <= 1) return 0;
  const GemmTileConfig& c = GetGemmConfig(ResolveConfig(args));
  return SplitKTailTiles(args, sms) * (args.k_splits - 1) * c.tile_m * c.tile_n;
}

int ExpectedGroupCount(const SignalingGemmArgs& args, int g) {
  const GemmTileConfig& c = GetGemmConfig(ResolveConfig(args));
  if (g < 0 || g >= args.num_groups) return 0;
  return args.batch * (args.group_begin[g + 1] - args.group_begin[g]) *
         ((args.n + c.tile_n - 1) / c.tile_n);
}

namespace {
// A batched launch (batch > 1: no addend, rotation or consumer) whose rows per batch are not whole
// tiles. Its last nonempty group's band of each batch ends in a partial tile, which the epilogue's
// TMA store of D as one matrix would spill into the next band (signaling_gemm_kernel.cuh,
// "Store"), so that group runs as a launch of its own: one group over rows [r0, m) of every
// batch, D at the group's rows, where D is [batch, m - r0, n] and TMA clips each batch. The
// groups before it (whole tiles) run first, as the same launch with m = r0. Counters are zeroed
// once, before both; split K is off (its workspace was sized for the whole launch's tail).
cudaError_t RunBatchedPartial(const detail::GemmRun& run, detail::RunGemmFn fn,
                              cudaStream_t stream, std::string* error) {
  const SignalingGemmArgs& a = run.args;
  const GemmTileConfig& c = detail::kGemmConfigs[a.config];
  int last = a.num_groups - 1;
  while (last > 0 && a.group_begin[last] == a.group_begin[last + 1]) --last;
  cudaError_t e = detail::ZeroGemmCounters(a, stream, error);
  if (e != cudaSuccess) return e;
  const int r0 = a.group_begin[last] * c.tile_m;
  if (last > 0) {
    detail::GemmRun head = run;
    head.args.m = r0;
    head.args.num_groups = last;
    head.args.zero_counters_on_launch = false;
    head.args.k_splits = 1;
    head.a_batch_rows = a.m;
    e = fn(head, stream, error);
    if (e != cudaSuccess) return e;
  }
  detail::GemmRun tail = run;
  tail.args.m = a.m - r0;
  tail.args.num_groups = 1;
  tail.args.group_begin[0] = 0;
  tail.args.group_begin[1] = a.group_begin[last + 1] - a.group_begin[last];
  tail.args.a = static_cast<const char*>(a.a) + size_t(r0) * a.k * GemmInputBytes(a.dtype);
  tail.args.d = static_cast<char*>(a.d) + size_t(a.batch) * r0 * a.n * 2;  // D: 2 bytes always
  tail.args.counters = a.counters != nullptr ? a.counters + last : nullptr;
  tail.args.zero_counters_on_launch = false;
  tail.args.k_splits = 1;
  tail.a_batch_rows = a.m;
  return fn(tail, stream, error);
}
}  // namespace

cudaError_t LaunchSignalingGemm(cudaStream_t stream, const SignalingGemmArgs& args,
                                std::string* error) {
  const cudaError_t kBad = cudaErrorInvalidValue;
  if (!KnownDtype(args.dtype)) return Fail(error, kBad, "dtype must be bf16, f16 or e4m3");
  const bool fp8 = args.dtype == GemmDtype::kE4M3;
  if (fp8 && args.k % 16 != 0) {
    return Fail(error, kBad, "fp8 needs k a multiple of 16 (16-byte rows of A and B; got " +
                                 std::to_string(args.k) + ")");
  }
  if (fp8 && args.addend != nullptr) {
    return Fail(error, kBad, "fp8 kernels take no addend (no source form)");
  }
  if (!fp8 && (args.a_scale != nullptr || args.b_scale != nullptr)) {
    return Fail(error, kBad, "a_scale and b_scale are for fp8 (e4m3) operands only");
  }
  if ((reinterpret_cast<uintptr_t>(args.a_scale) & 3u) != 0 ||
      (reinterpret_cast<uintptr_t>(args.b_scale) & 3u) != 0) {
    return Fail(error, kBad, "a_scale and b_scale must be 4-byte aligned");
  }
  if (args.m <= 0 || args.n <= 0 || args.k <= 0 || args.m % 8 || args.n % 8 || args.k % 8) {
    return Fail(error, kBad,
                "m, n, k must be positive multiples of 8 (got " + std::to_string(args.m) + ", " +
                    std::to_string(args.n) + ", " + std::to_string(args.k) + ")");
  }
  if (args.batch < 1) return Fail(error, kBad, "batch must be >= 1");
  if (static_cast<long long>(args.batch) * args.m >= (1LL << 31)) {
    return Fail(error, kBad, "batch * m too large");
  }
  if (args.a == nullptr || args.b == nullptr || args.d == nullptr) {
    return Fail(error, kBad, "a, b, d must be non-null");
  }
  if (!Aligned16(args.a) || !Aligned16(args.b) || !Aligned16(args.d)) {
    return Fail(error, kBad, "a, b, d must be 16-byte aligned");
  }
  if (args.num_groups < 1 || args.num_groups > kMaxGemmGroups) {
    return Fail(error, kBad, "num_groups must be in [1, " + std::to_string(kMaxGemmGroups) + "]");
  }
  if (args.sm_budget < 0) return Fail(error, kBad, "sm_budget must be >= 0");
  const int cfg = ResolveConfig(args);
  if (cfg >= kNumConfigs) return Fail(error, kBad, "config index out of range");
  const GemmTileConfig& c = detail::kGemmConfigs[cfg];
  if (!SupportsDtype(cfg, args.dtype)) {
    const char* why = fp8 ? "fp8 needs an fp8_* config" : "fp8_* configs are fp8 only";
    return Fail(error, kBad,
                std::string("config ") + c.name + " has no kernel for this dtype (" + why + ")");
  }
  const int tiles_m = (args.m + c.tile_m - 1) / c.tile_m;
  if (args.group_begin[0] != 0 || args.group_begin[args.num_groups] != tiles_m) {
    return Fail(error, kBad,
                "group_begin must start at 0 and end at ceil(m / tile_m) = " +
                    std::to_string(tiles_m) + " for config " + c.name);
  }
  for (int g = 0; g < args.num_groups; ++g) {
    if (args.group_begin[g + 1] < args.group_begin[g]) {
      return Fail(error, kBad, "group_begin must be non-decreasing");
    }
  }
  if (args.rotate_tile_rows != 0 || args.rotate_period_tile_rows != 0) {
    const int period = args.rotate_period_tile_rows > 0 ? args.rotate_period_tile_rows : tiles_m;
    if (args.batch != 1 || args.m % c.tile_m != 0 || args.rotate_tile_rows < 0 ||
        args.rotate_tile_rows >= period || args.rotate_tile_rows % c.cluster_m != 0 ||
        period % c.cluster_m != 0 || tiles_m % period != 0) {
      return Fail(error, kBad,
                  "rotate_tile_rows needs batch 1, m a multiple of tile_m, the rotation and its "
                  "period multiples of cluster_m, the period dividing ceil(m / tile_m) and "
                  "rotation < period (config " + std::string(c.name) + ")");
    }
  }
  if (args.addend != nullptr) {
    const bool ok = args.batch == 1 && args.m % c.tile_m == 0 && tiles_m % c.cluster_m == 0 &&
                    args.addend_first_tile_row >= 0 && args.addend_first_tile_row < tiles_m &&
                    static_cast<long long>(tiles_m - args.addend_first_tile_row) * c.tile_m *
                            args.n < (1LL << 31) &&
                    args.addend_flags != nullptr && Aligned16(args.addend);
    if (!ok) {
      return Fail(error, kBad,
                  "an addend needs batch 1, m a multiple of tile_m * cluster_m (no padding tile "
                  "that would load a source but store nothing), flags, 16-byte alignment, a "
                  "first tile-row inside the output and fewer than 2^31 elements");
    }
    if (!GemmConfigTakesAddends(cfg)) {
      return Fail(error, kBad, std::string("config ") + c.name + " has no kernel with an addend");
    }
  }
  if (args.addend_abandoned != nullptr &&
      (args.addend == nullptr || args.addend_nan == nullptr || !Aligned16(args.addend_nan))) {
    return Fail(error, kBad,
                "addend_abandoned needs an addend and addend_nan (16-byte aligned NaNs)");
  }
  if (args.tail_out != nullptr) {
    // The tail's stores use a second CUTLASS epilogue object per tile, which relies on the
    // ping-pong kernel ending every tile with store_tail (signaling_gemm_kernel.cuh).
    const bool ok = args.addend != nullptr && c.pingpong && args.tail_first_tile_row > 0 &&
                    args.tail_first_tile_row < tiles_m && Aligned16(args.tail_out);
    if (!ok) {
      return Fail(error, kBad,
                  "a tail output needs an addend, a ping-pong config, 16-byte alignment and a "
                  "first tile-row inside the output (not 0)");
    }
  }
  if (args.wait_flags != nullptr) {
    const std::string problem = ConsumerProblem(args, cfg);
    if (!problem.empty()) return Fail(error, kBad, problem);
  }
  const long long units = static_cast<long long>(args.batch) * tiles_m *
                          ((args.n + c.tile_n - 1) / c.tile_n);
  if (units >= (1LL << 30)) return Fail(error, kBad, "problem has too many tiles");
  if (args.k_splits != 1) {
    const int k_tiles = (args.k + c.tile_k - 1) / c.tile_k;
    std::string why;
    if (args.k_splits < 1 || args.k_splits > kMaxKSplits) {
      why = "k_splits must be in [1, " + std::to_string(kMaxKSplits) + "]";
    } else if (c.pingpong) {
      why = std::string("split K needs a cooperative config (") + c.name + " is ping-pong)";
    } else if (args.addend != nullptr || args.wait_flags != nullptr) {
      why = "split K takes no addend and no wait_flags";
    } else if (args.k_splits > k_tiles) {
      why = "k_splits " + std::to_string(args.k_splits) + " exceeds the " +
            std::to_string(k_tiles) + " k-tiles of k = " + std::to_string(args.k) +
            " (config " + c.name + ")";
    } else if (units * args.k_splits >= (1LL << 30)) {
      why = "problem has too many units of work";
    } else if (args.split_partials == nullptr || args.split_flags == nullptr ||
               !Aligned16(args.split_partials) ||
               (reinterpret_cast<uintptr_t>(args.split_flags) & 3u) != 0) {
      why = "split K needs split_partials (16-byte aligned) and split_flags (4-byte aligned)";
    }
    if (!why.empty()) return Fail(error, kBad, why);
  }

  detail::GemmRun run;
  run.args = args;
  run.args.config = cfg;
  cudaError_t e = cudaGetDevice(&run.device);
  if (e == cudaSuccess) e = DeviceSms(run.device, &run.device_sms);
  if (e != cudaSuccess) {
    return Fail(error, e, std::string("device query: ") + cudaGetErrorString(e));
  }
  const DtypeKernels& kernels = KernelsOf(args.dtype);
  const detail::RunGemmFn* table = kernels.run;
  if (args.addend != nullptr) {
    table = kernels.run_source;
  } else if (args.wait_flags != nullptr) {
    table = kernels.run_consumer;
  }
  if (args.batch > 1 && args.m % c.tile_m != 0) {
    return RunBatchedPartial(run, table[cfg], stream, error);
  }
  return table[cfg](run, stream, error);
}

cudaError_t LoadAllGemmKernels(std::string* error) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    return Fail(error, e, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  }
  int sms = 0;
  e = DeviceSms(device, &sms);
  if (e != cudaSuccess) {
    return Fail(error, e, std::string("device query: ") + cudaGetErrorString(e));
  }
  for (int i = 0; i < kNumConfigs; ++i) {
    for (const DtypeKernels& kernels : kKernels) {
      for (const detail::LoadGemmFn load :
           {kernels.load[i], kernels.load_source[i], kernels.load_consumer[i]}) {
        if (load == nullptr) continue;  // the row has no such kernel for this dtype
        e = load(device, error);
        if (e != cudaSuccess) return e;
      }
    }
  }
  return cudaSuccess;
}

}  // namespace fo_jax
