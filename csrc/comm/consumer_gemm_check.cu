// See consumer_gemm_check.h.
// Longer than ~500 lines because it is a self-contained GPU test driver (operand fill, band
// arrival schedules, bitwise comparison and its report) that the product never links.
#include "comm/consumer_gemm_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <random>
#include <thread>

#include "comm/stream_wait.h"

namespace fo_jax {
namespace {

constexpr int kPoisonByte = 0xFF;  // a NaN in bf16, f16 (0xFFFF) and e4m3 (0xFF)

// ---------------------------------------------------------------------------------------------
// Device helpers: operands from a counter-based hash (the same values for a seed on any GPU and
// launch shape), and the bitwise comparison of D with the reference.
// ---------------------------------------------------------------------------------------------
__device__ uint32_t HashIndex(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

__device__ float ToFloat(uint16_t bits, bool bf16) {
  return bf16 ? __bfloat162float(__ushort_as_bfloat16(bits))
              : __half2float(__ushort_as_half(bits));
}

// Uniform in [-1, 1), rounded to the element type (`out` holds count elements of it).
__global__ void FillUniform(void* out, int64_t count, uint64_t seed, GemmDtype dtype) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = float(HashIndex(seed, uint64_t(i)) >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if (dtype == GemmDtype::kE4M3) {
      static_cast<uint8_t*>(out)[i] = __nv_fp8_e4m3(v).__x;
    } else {
      static_cast<uint16_t*>(out)[i] = dtype == GemmDtype::kBF16
                                           ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                                           : __half_as_ushort(__float2half_rn(v));
    }
  }
}

struct CompareStats {
  unsigned long long band_mismatches[kMaxGemmBands];
  unsigned long long first_bad_row;  // ULLONG_MAX: none
  unsigned long long reference_nonfinite;
  unsigned int max_abs_diff_bits;  // a non-negative float's bits order as the float does
};

__global__ void CompareBits(const uint16_t* got, const uint16_t* ref, int64_t count, int n,
                            int band_rows, bool bf16, CompareStats* stats) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const uint16_t g = got[i], r = ref[i];
    const float rf = ToFloat(r, bf16);
    if (!isfinite(rf)) atomicAdd(&stats->reference_nonfinite, 1ull);
    if (g == r) continue;
    const int64_t row = i / n;
    atomicAdd(&stats->band_mismatches[row / band_rows], 1ull);
    atomicMin(&stats->first_bad_row, static_cast<unsigned long long>(row));
    float d = fabsf(ToFloat(g, bf16) - rf);
    if (isnan(d)) d = INFINITY;
    atomicMax(&stats->max_abs_diff_bits, __float_as_uint(d));
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------
void CUDART_CB SleepOnHost(void* us) {
  std::this_thread::sleep_for(std::chrono::microseconds(*static_cast<const int*>(us)));
}

double Median(std::vector<float> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (double(v[h - 1]) + v[h]);
}

// Makes a device current for the scope; the previous one is current again after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Everything the check allocates, released at the end unless the GPU hung (a kernel still
// running would make the frees wait forever). A return while the consumer may still wait (an
// error after its launch) first sets every flag, so that it ends.
struct Resources {
  uint8_t *a = nullptr, *b = nullptr, *staging_dev = nullptr, *staging_host = nullptr;  // bytes
  uint16_t *d = nullptr, *d_ref = nullptr;  // 16-bit D (bf16 for fp8 operands)
  uint32_t *flags = nullptr, *counters = nullptr, *flag_words_host = nullptr;
  CompareStats* stats = nullptr;
  cudaStream_t gemm = nullptr, copy = nullptr, rescue = nullptr;
  std::vector<cudaEvent_t> events;
  bool leak = false;
  const uint32_t* release_words = nullptr;  // set while a consumer launch may be waiting
  int num_flags = 0;

  ~Resources() {
    if (leak) return;
    if (release_words != nullptr) {
      cudaMemcpyAsync(flags, release_words, num_flags * sizeof(uint32_t), cudaMemcpyHostToDevice,
                      rescue);
    }
    for (cudaStream_t s : {gemm, copy, rescue}) {
      if (s != nullptr) cudaStreamSynchronize(s);
    }
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(d),
                    static_cast<void*>(d_ref), static_cast<void*>(staging_dev),
                    static_cast<void*>(flags), static_cast<void*>(counters),
                    static_cast<void*>(stats)}) {
      if (p != nullptr) cudaFree(p);
    }
    if (staging_host != nullptr) cudaFreeHost(staging_host);
    if (flag_words_host != nullptr) cudaFreeHost(flag_words_host);
    for (cudaStream_t s : {gemm, copy, rescue}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }

  cudaError_t NewEvent(cudaEvent_t* e) {
    cudaError_t err = cudaEventCreate(e);
    if (err == cudaSuccess) events.push_back(*e);
    return err;
  }
};

// "" or why the options cannot run; sets the config (resolved) and the band orders.
std::string CheckOptions(const ConsumerGemmCheckOptions& o, int* config, std::vector<int>* visit,
                         std::vector<int>* arrival) {
  if (o.bands < 1 || o.bands > kMaxGemmBands) {
    return "bands must be in [1, " + std::to_string(kMaxGemmBands) + "], got " +
           std::to_string(o.bands);
  }
  if (o.m_local <= 0 || o.n <= 0 || o.k <= 0 || o.n % 8 || o.k % 8) {
    return "m_local, n, k must be positive, n and k multiples of 8";
  }
  if (static_cast<long long>(o.bands) * o.m_local * std::max(o.n, o.k) >= (1LL << 31)) {
    return "bands * m_local * max(n, k) must be below 2^31 elements";
  }
  if (o.rank < 0 || o.rank >= o.bands) return "rank must be a band index";
  if (o.delay_us < 0 || o.timing_iters < 0 || o.timeout_s <= 0) {
    return "delay_us and timing_iters must be >= 0, timeout_s > 0";
  }
  if (o.staging != "host" && o.staging != "device") {
    return "staging must be \"host\" or \"device\", got \"" + o.staging + "\"";
  }
  int device = 0, sms = 0;
  if (o.staging == "device" && cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      (o.sm_budget <= 0 || o.sm_budget >= sms)) {
    return "staging \"device\" copies the bands with a kernel, which needs SMs the waiting GEMM "
           "does not hold: pass 0 < sm_budget < " + std::to_string(sms) + " (got " +
           std::to_string(o.sm_budget) + ")";
  }
  const int m = o.bands * o.m_local;
  *config = o.config >= 0 ? o.config
                          : SelectConsumerGemmConfig(o.dtype, m, o.n, o.k, o.m_local,
                                                     o.sm_budget);
  if (*config >= NumGemmConfigs() || !GemmConfigHasConsumer(*config)) {
    return "config " + std::to_string(*config) + " has no consumer kernel";
  }
  const GemmTileConfig& c = GetGemmConfig(*config);
  if (o.m_local % (c.tile_m * c.cluster_m) != 0) {
    return "m_local = " + std::to_string(o.m_local) + " is not a multiple of tile_m * "
           "cluster_m = " + std::to_string(c.tile_m * c.cluster_m) + " of config " + c.name;
  }
  const int band_tiles = o.m_local / c.tile_m;
  if (o.groups_per_band < 1 || o.groups_per_band > band_tiles ||
      o.groups_per_band * o.bands > kMaxGemmGroups) {
    return "groups_per_band must be in [1, m_local / tile_m = " + std::to_string(band_tiles) +
           "] with bands * groups_per_band <= " + std::to_string(kMaxGemmGroups);
  }
  visit->resize(o.bands);
  for (int s = 0; s < o.bands; ++s) (*visit)[s] = (o.rank + s) % o.bands;
  *arrival = *visit;
  if (o.order == "reversed") {
    std::reverse(arrival->begin(), arrival->end());
  } else if (o.order == "random") {
    std::mt19937_64 rng(o.seed);
    std::shuffle(arrival->begin(), arrival->end(), rng);
  } else if (o.order != "forward") {
    return "order must be \"forward\", \"reversed\" or \"random\", got \"" + o.order + "\"";
  }
  return "";
}

// One check: Setup (operands, staging copy), the reference, the run with waits, the comparison,
// the timing. Each step returns cudaSuccess or the error with *error_ set.
class Check {
 public:
  Check(const ConsumerGemmCheckOptions& o, ConsumerGemmCheckResult* result, std::string* error)
      : o_(o), result_(result), error_(error) {}

  cudaError_t Run() {
    const std::string bad = CheckOptions(o_, &cfg_, &result_->visit_order,
                                         &result_->arrival_order);
    if (!bad.empty()) return Fail(cudaErrorInvalidValue, bad);
    cudaError_t e = Setup();
    if (e == cudaSuccess) e = RunWithWaits();
    if (e == cudaSuccess) e = CompareWithReference();
    if (e == cudaSuccess && o_.timing_iters > 0) e = TimeFlagChecks();
    return e;
  }

 private:
  cudaError_t Fail(cudaError_t code, const std::string& message) {
    if (error_ != nullptr) *error_ = "consumer_gemm_check: " + message;
    return code;
  }
  cudaError_t CudaFail(cudaError_t code, const char* what) {
    return Fail(code, std::string(what) + " failed: " + cudaGetErrorString(code));
  }

  cudaError_t Setup();
  cudaError_t RunWithWaits();
  cudaError_t WaitForGemm(cudaEvent_t gemm_end);
  cudaError_t CompareWithReference();
  cudaError_t TimeFlagChecks();

  const ConsumerGemmCheckOptions& o_;
  ConsumerGemmCheckResult* result_;
  std::string* error_;
  int cfg_ = -1;
  int band_tiles_ = 0;
  int delay_us_ = o_.delay_us;  // read by the copy stream's host functions
  size_t a_elems_ = 0, band_elems_ = 0, d_elems_ = 0;
  uint32_t* stale_words_ = nullptr;  // pinned: the flags before their bands land
  uint32_t* set_words_ = nullptr;    // pinned: every flag at the call's value
  SignalingGemmArgs plain_, consumer_;
  Resources r_;
};

cudaError_t Check::Setup() {
  const GemmTileConfig& c = GetGemmConfig(cfg_);
  const int m = o_.bands * o_.m_local;
  const int num_groups = o_.bands * o_.groups_per_band;
  band_tiles_ = o_.m_local / c.tile_m;
  a_elems_ = size_t(m) * o_.k;
  band_elems_ = size_t(o_.m_local) * o_.k;
  d_elems_ = size_t(m) * o_.n;
  result_->config = c.name;

  std::string msg;
  const Status prepared = PrepareStreamWait();  // resolves cuStreamWriteValue32
  if (!prepared.ok()) return Fail(cudaErrorUnknown, prepared.message());
  cudaError_t e = LoadAllGemmKernels(&msg);  // no lazy loading while a waiting GEMM holds the SMs
  if (e != cudaSuccess) return Fail(e, msg);

  const size_t el = GemmInputBytes(o_.dtype), d_el = sizeof(uint16_t);
  if ((e = cudaMalloc(&r_.a, a_elems_ * el)) != cudaSuccess ||
      (e = cudaMalloc(&r_.b, size_t(o_.k) * o_.n * el)) != cudaSuccess ||
      (e = cudaMalloc(&r_.d, d_elems_ * d_el)) != cudaSuccess ||
      (e = cudaMalloc(&r_.d_ref, d_elems_ * d_el)) != cudaSuccess ||
      (e = cudaMalloc(&r_.flags, o_.bands * sizeof(uint32_t))) != cudaSuccess ||
      (e = cudaMalloc(&r_.counters, num_groups * sizeof(uint32_t))) != cudaSuccess ||
      (e = cudaMalloc(&r_.stats, sizeof(CompareStats))) != cudaSuccess ||
      (e = cudaHostAlloc(&r_.flag_words_host, 2 * o_.bands * sizeof(uint32_t),
                         cudaHostAllocDefault)) != cudaSuccess) {
    return CudaFail(e, "allocating A, B, D, flags and counters");
  }
  if (o_.staging == "host") {
    e = cudaHostAlloc(&r_.staging_host, a_elems_ * el, cudaHostAllocDefault);
  } else {
    e = cudaMalloc(&r_.staging_dev, a_elems_ * el);
  }
  if (e != cudaSuccess) return CudaFail(e, "allocating the staging copy of A");
  if ((e = cudaStreamCreateWithFlags(&r_.gemm, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&r_.copy, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&r_.rescue, cudaStreamNonBlocking)) != cudaSuccess) {
    return CudaFail(e, "creating streams");
  }
  stale_words_ = r_.flag_words_host;
  set_words_ = r_.flag_words_host + o_.bands;
  for (int b = 0; b < o_.bands; ++b) {
    stale_words_[b] = o_.stale_value;
    set_words_[b] = o_.flag_value;
  }

  // Operands, the staging copy of A (the bands' source), then the reference: the plain GEMM on
  // the complete A with the same config and groups.
  FillUniform<<<1024, 256, 0, r_.gemm>>>(r_.a, int64_t(a_elems_), o_.seed * 2 + 1, o_.dtype);
  FillUniform<<<1024, 256, 0, r_.gemm>>>(r_.b, int64_t(o_.k) * o_.n, o_.seed * 2 + 2, o_.dtype);
  if ((e = cudaGetLastError()) != cudaSuccess) return CudaFail(e, "filling A and B");
  uint8_t* staging = o_.staging == "host" ? r_.staging_host : r_.staging_dev;
  if ((e = cudaMemcpyAsync(staging, r_.a, a_elems_ * el, cudaMemcpyDefault, r_.gemm)) !=
          cudaSuccess ||
      (e = cudaMemsetAsync(r_.d_ref, kPoisonByte, d_elems_ * d_el, r_.gemm)) != cudaSuccess) {
    return CudaFail(e, "copying A to its staging copy");
  }

  plain_.dtype = o_.dtype;
  plain_.m = m;
  plain_.n = o_.n;
  plain_.k = o_.k;
  plain_.a = r_.a;
  plain_.b = r_.b;
  plain_.d = r_.d_ref;
  plain_.config = cfg_;
  plain_.sm_budget = o_.sm_budget;
  plain_.num_groups = num_groups;
  for (int b = 0; b < o_.bands; ++b) {
    for (int j = 0; j < o_.groups_per_band; ++j) {
      plain_.group_begin[b * o_.groups_per_band + j] =
          b * band_tiles_ + j * band_tiles_ / o_.groups_per_band;
    }
  }
  plain_.group_begin[num_groups] = m / c.tile_m;
  if ((e = LaunchSignalingGemm(r_.gemm, plain_, &msg)) != cudaSuccess) {
    return Fail(e, "plain GEMM: " + msg);
  }

  consumer_ = plain_;
  consumer_.d = r_.d;
  consumer_.wait_flags = r_.flags;
  consumer_.wait_flag_value = o_.flag_value;
  consumer_.band_rows = o_.m_local;
  for (int s = 0; s < o_.bands; ++s) consumer_.band_order[s] = result_->visit_order[s];
  consumer_.counters = r_.counters;
  consumer_.zero_counters_on_launch = true;
  return cudaSuccess;
}

// On the GEMM stream: stale flags, A and D poisoned, then the consumer. On the copy stream, once
// A is poisoned: per band in arrival order a delay, its copy from the staging copy, its flag.
// With host staging nothing on the copy stream needs an SM (the GEMM may hold all of them). The
// copy stream's work is enqueued before the GEMM: a memcpy call can wait for a driver lock that
// another thread holds while it waits for this GPU to drain (freeing memory, loading a module),
// which would never happen with the GEMM waiting for that very copy.
cudaError_t Check::RunWithWaits() {
  cudaEvent_t poisoned, gemm_end, last_flag;
  cudaError_t e;
  if ((e = r_.NewEvent(&poisoned)) != cudaSuccess ||
      (e = r_.NewEvent(&gemm_end)) != cudaSuccess ||
      (e = r_.NewEvent(&last_flag)) != cudaSuccess) {
    return CudaFail(e, "creating events");
  }
  const size_t el = GemmInputBytes(o_.dtype), d_el = sizeof(uint16_t);
  if ((e = cudaMemcpyAsync(r_.flags, stale_words_, o_.bands * sizeof(uint32_t),
                           cudaMemcpyHostToDevice, r_.gemm)) != cudaSuccess ||
      (e = cudaMemsetAsync(r_.a, kPoisonByte, a_elems_ * el, r_.gemm)) != cudaSuccess ||
      (e = cudaMemsetAsync(r_.d, kPoisonByte, d_elems_ * d_el, r_.gemm)) != cudaSuccess ||
      (e = cudaEventRecord(poisoned, r_.gemm)) != cudaSuccess ||
      (e = cudaStreamWaitEvent(r_.copy, poisoned, 0)) != cudaSuccess) {
    return CudaFail(e, "preparing the run with waits");
  }
  std::string msg;
  const uint8_t* staging = o_.staging == "host" ? r_.staging_host : r_.staging_dev;
  for (const int band : result_->arrival_order) {
    if (o_.delay_us > 0 &&
        (e = cudaLaunchHostFunc(r_.copy, SleepOnHost, &delay_us_)) != cudaSuccess) {
      return CudaFail(e, "enqueueing a delay");
    }
    const size_t off = size_t(band) * band_elems_ * el;  // bytes
    e = cudaMemcpyAsync(r_.a + off, staging + off, band_elems_ * el, cudaMemcpyDefault, r_.copy);
    if (e != cudaSuccess) return CudaFail(e, "enqueueing a band's copy");
    const Status flagged = EnqueueWriteValue(r_.copy, r_.flags + band, o_.flag_value);
    if (!flagged.ok()) return Fail(cudaErrorUnknown, "enqueueing a band's flag: " + flagged.message());
  }
  if ((e = cudaEventRecord(last_flag, r_.copy)) != cudaSuccess) {
    return CudaFail(e, "recording the last flag");
  }
  r_.release_words = set_words_;
  r_.num_flags = o_.bands;
  if ((e = LaunchSignalingGemm(r_.gemm, consumer_, &msg)) != cudaSuccess) {
    return Fail(e, "consumer GEMM: " + msg);
  }
  if ((e = cudaEventRecord(gemm_end, r_.gemm)) != cudaSuccess) {
    return CudaFail(e, "recording the GEMM's end");
  }

  if ((e = WaitForGemm(gemm_end)) != cudaSuccess) return e;
  r_.release_words = nullptr;
  if ((e = cudaStreamSynchronize(r_.copy)) != cudaSuccess ||
      (e = cudaStreamSynchronize(r_.rescue)) != cudaSuccess) {
    return CudaFail(e, "the copy stream");
  }
  float ms = 0;
  if ((e = cudaEventElapsedTime(&ms, poisoned, gemm_end)) != cudaSuccess) {
    return CudaFail(e, "timing the run with waits");
  }
  result_->wait_run_us = 1e3 * ms;
  if ((e = cudaEventElapsedTime(&ms, last_flag, gemm_end)) != cudaSuccess) {
    return CudaFail(e, "timing the last flag");
  }
  result_->end_after_last_flag_us = 1e3 * ms;
  return cudaSuccess;
}

// Waits for the GEMM with a deadline; past it, releases every flag (a copy-engine write on a
// third stream) so that a kernel waiting for a wrong flag ends and the caller sees timed_out.
cudaError_t Check::WaitForGemm(cudaEvent_t gemm_end) {
  const auto wait_for = [&](double seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
    cudaError_t q;
    while ((q = cudaEventQuery(gemm_end)) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    (void)cudaGetLastError();  // cudaErrorNotReady is no error
    return q;
  };
  cudaError_t e = wait_for(o_.timeout_s + 1e-6 * o_.delay_us * o_.bands);
  if (e == cudaErrorNotReady) {
    result_->timed_out = true;
    e = cudaMemcpyAsync(r_.flags, set_words_, o_.bands * sizeof(uint32_t),
                        cudaMemcpyHostToDevice, r_.rescue);
    if (e == cudaSuccess) e = wait_for(10.0);
    if (e == cudaErrorNotReady) {
      r_.leak = true;
      return Fail(cudaErrorLaunchTimeout,
                  "the consumer GEMM did not end " + std::to_string(o_.timeout_s) +
                      " s after launch, nor 10 s after every flag was released (hung)");
    }
  }
  return e == cudaSuccess ? e : CudaFail(e, "the run with waits");
}

// D against the reference, bit for bit; the counters against the tiles of each group.
cudaError_t Check::CompareWithReference() {
  CompareStats stats;
  std::memset(&stats, 0, sizeof(stats));
  stats.first_bad_row = ULLONG_MAX;
  std::vector<uint32_t> counters(consumer_.num_groups);
  cudaError_t e = cudaMemcpyAsync(r_.stats, &stats, sizeof(stats), cudaMemcpyHostToDevice,
                                  r_.gemm);
  if (e != cudaSuccess) return CudaFail(e, "clearing the statistics");
  CompareBits<<<1024, 256, 0, r_.gemm>>>(r_.d, r_.d_ref, int64_t(d_elems_), o_.n, o_.m_local,
                                         o_.dtype != GemmDtype::kF16, r_.stats);  // D bf16
  if ((e = cudaGetLastError()) != cudaSuccess ||
      (e = cudaMemcpyAsync(&stats, r_.stats, sizeof(stats), cudaMemcpyDeviceToHost, r_.gemm)) !=
          cudaSuccess ||
      (e = cudaMemcpyAsync(counters.data(), r_.counters, counters.size() * sizeof(uint32_t),
                           cudaMemcpyDeviceToHost, r_.gemm)) != cudaSuccess ||
      (e = cudaStreamSynchronize(r_.gemm)) != cudaSuccess) {
    return CudaFail(e, "comparing D with the reference");
  }
  result_->band_mismatches.assign(o_.bands, 0);
  result_->mismatches = 0;
  for (int b = 0; b < o_.bands; ++b) {
    result_->band_mismatches[b] = int64_t(stats.band_mismatches[b]);
    result_->mismatches += result_->band_mismatches[b];
  }
  result_->first_bad_row = stats.first_bad_row == ULLONG_MAX ? -1 : int64_t(stats.first_bad_row);
  float max_diff;
  std::memcpy(&max_diff, &stats.max_abs_diff_bits, sizeof(max_diff));
  result_->max_abs_diff = max_diff;
  result_->reference_nonfinite = int64_t(stats.reference_nonfinite);
  result_->counter_problem.clear();
  for (int g = 0; g < consumer_.num_groups; ++g) {
    const uint32_t want = uint32_t(ExpectedGroupCount(consumer_, g));
    if (counters[g] != want && result_->counter_problem.size() < 400) {
      result_->counter_problem += "group " + std::to_string(g) + ": counter " +
                                  std::to_string(counters[g]) + ", expected " +
                                  std::to_string(want) + "; ";
    }
  }
  return cudaSuccess;
}

// The cost of the flag checks: the consumer with every flag set against the plain kernel
// visiting the same tiles in the same order (rotated by the own band), no counters, the two
// launches interleaved after 3 warm-up pairs; median of timing_iters event pairs each.
cudaError_t Check::TimeFlagChecks() {
  SignalingGemmArgs timed_plain = plain_;
  timed_plain.d = r_.d;
  timed_plain.rotate_tile_rows = o_.rank * band_tiles_;
  SignalingGemmArgs timed_consumer = consumer_;
  timed_consumer.counters = nullptr;
  timed_consumer.zero_counters_on_launch = false;
  cudaError_t e = cudaMemcpyAsync(r_.flags, set_words_, o_.bands * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, r_.gemm);
  if (e != cudaSuccess) return CudaFail(e, "setting the flags");
  std::vector<cudaEvent_t> marks(4 * size_t(o_.timing_iters));
  for (cudaEvent_t& ev : marks) {
    if ((e = r_.NewEvent(&ev)) != cudaSuccess) return CudaFail(e, "creating events");
  }
  std::string msg;
  constexpr int kWarmup = 3;
  for (int i = -kWarmup; i < o_.timing_iters; ++i) {
    for (int which = 0; which < 2; ++which) {
      const SignalingGemmArgs& args = which == 0 ? timed_plain : timed_consumer;
      if (i >= 0 && (e = cudaEventRecord(marks[4 * i + 2 * which], r_.gemm)) != cudaSuccess) {
        return CudaFail(e, "recording a timing event");
      }
      if ((e = LaunchSignalingGemm(r_.gemm, args, &msg)) != cudaSuccess) {
        return Fail(e, "timed GEMM: " + msg);
      }
      if (i >= 0 &&
          (e = cudaEventRecord(marks[4 * i + 2 * which + 1], r_.gemm)) != cudaSuccess) {
        return CudaFail(e, "recording a timing event");
      }
    }
  }
  if ((e = cudaStreamSynchronize(r_.gemm)) != cudaSuccess) return CudaFail(e, "the timed GEMMs");
  std::vector<float> t_plain, t_consumer;
  for (int i = 0; i < o_.timing_iters; ++i) {
    float t0 = 0, t1 = 0;
    if ((e = cudaEventElapsedTime(&t0, marks[4 * i], marks[4 * i + 1])) != cudaSuccess ||
        (e = cudaEventElapsedTime(&t1, marks[4 * i + 2], marks[4 * i + 3])) != cudaSuccess) {
      return CudaFail(e, "reading the timing events");
    }
    t_plain.push_back(1e3f * t0);
    t_consumer.push_back(1e3f * t1);
  }
  result_->plain_us = Median(t_plain);
  result_->consumer_us = Median(t_consumer);
  return cudaSuccess;
}

}  // namespace

cudaError_t RunConsumerGemmCheck(const ConsumerGemmCheckOptions& options,
                                 ConsumerGemmCheckResult* result, std::string* error) {
  *result = ConsumerGemmCheckResult();
  DeviceScope scope(options.device);
  if (scope.status() != cudaSuccess) {
    if (error != nullptr) {
      *error = std::string("consumer_gemm_check: cudaSetDevice failed: ") +
               cudaGetErrorString(scope.status());
    }
    return scope.status();
  }
  return Check(options, result, error).Run();
}

}  // namespace fo_jax
