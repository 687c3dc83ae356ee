// See all_gather_check.h.
#include "comm/all_gather_check.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "comm/all_gather_copy_engine.h"
#include "comm/copy_engine_graphs.h"
#include "comm/gemm_plan.h"
#include "comm/gpu_check_resources.h"
#include "comm/nan_fill.h"
#include "comm/overlap_plan.h"
#include "comm/stream_wait.h"

namespace fo_jax {
namespace {

void Sleep(void* us) {
  std::this_thread::sleep_for(std::chrono::microseconds(reinterpret_cast<intptr_t>(us)));
}

// Device memory and streams of one check, released at its end (the check owns the GPU).
struct Resources {
  std::vector<void*> memory;
  cudaStream_t gemm = nullptr, copy = nullptr, release = nullptr;
  cudaEvent_t started = nullptr, copies_end = nullptr;
  ~Resources() {
    (void)cudaDeviceSynchronize();
    for (void* p : memory) (void)cudaFree(p);
    for (cudaStream_t s : {gemm, copy, release}) {
      if (s) (void)cudaStreamDestroy(s);
    }
    for (cudaEvent_t e : {started, copies_end}) {
      if (e) (void)cudaEventDestroy(e);
    }
  }
  cudaError_t Alloc(void** p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) memory.push_back(*p);
    return e;
  }
};

std::string Error(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Whether every element of `count` at `p` (the dtype's bytes) is a NaN.
bool AllNaN(const uint8_t* p, size_t count, GemmDtype dtype) {
  for (size_t i = 0; i < count; ++i) {
    if (dtype == GemmDtype::kE4M3) {
      if ((p[i] & 0x7F) != 0x7F) return false;  // e4m3fn: only S.1111.111 is a NaN
      continue;
    }
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    if (!(dtype == GemmDtype::kF16 ? F16IsNaN(v) : Bf16IsNaN(v))) return false;
  }
  return true;
}

}  // namespace

AllGatherCheckResult RunAllGatherCheck(const AllGatherCheckOptions& o) {
  AllGatherCheckResult result;
  const int P = o.ranks;
  if (P < 1 || o.rank < 0 || o.rank >= P || o.rows <= 0 || o.n <= 0 || o.k <= 0 ||
      o.bands_per_rank < 1 || o.rows % o.bands_per_rank || o.calls < 1 ||
      o.released_sender < -1 || o.released_sender >= P || o.released_sender == o.rank) {
    result.error = "bad options (ranks, rank, rows, n, k, bands_per_rank, calls, "
                   "released_sender)";
    return result;
  }
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) {
    result.error = Error(e, "device query");
    return result;
  }
  const int sm_budget = o.sm_budget > 0 ? o.sm_budget : sms - 16;
  // Without a push (two ranks, the sender released) the GEMM may hold every SM: the release's
  // fill must not need one.
  const bool no_push = P == 2 && o.released_sender >= 0;
  const int max_budget = no_push ? sms : sms - 1;
  if (sm_budget <= 0 || sm_budget > max_budget) {
    result.error = "sm_budget must be between 1 and " + std::to_string(max_budget) +
                   (no_push ? "" : " (a same-GPU copy may need an SM)");
    return result;
  }
  Status s = LoadGemmKernelsOnce(device);
  if (s.ok()) s = PrepareStreamWait();
  if (s.ok()) s = PrepareNanFill();
  if (!s.ok()) {
    result.error = s.message();
    return result;
  }

  // The plan as the planner makes it: one group per band, a consumer config.
  const int64_t M = int64_t(P) * o.rows, band_rows = o.rows / o.bands_per_rank;
  const int config = o.config >= 0 ? o.config
                                   : SelectConsumerGemmConfig(o.dtype, int(M), o.n, o.k,
                                                              int(band_rows), sm_budget);
  result.config = config;
  const GemmTileConfig& c = GetGemmConfig(config);
  OverlapPlan plan;
  plan.collective = Collective::kAllGather;
  plan.transport = Transport::kCopyEngine;
  plan.axis_size = P;
  plan.tiles_chunk = static_cast<int>(band_rows / c.tile_m);
  plan.gemm.config = config;
  plan.gemm.batch = 1;
  plan.gemm.sm_budget = sm_budget;
  plan.gemm.num_groups = P * o.bands_per_rank;
  if (plan.gemm.num_groups > kMaxGemmGroups) {
    result.error = "more bands than the GEMM takes";
    return result;
  }
  for (int g = 0; g <= plan.gemm.num_groups; ++g) {
    plan.gemm.group_begin[g] = g * plan.tiles_chunk;
  }
  OverlapShape shape{o.dtype, M, o.n, o.k};
  if (P >= 2) {
    s = ValidateOverlapPlan(plan, shape);
  } else {  // a copy-engine group has 2+ ranks; one rank checks the consumer's own path only
    plan.transport = Transport::kNccl;
    s = ValidateOverlapPlan(plan, shape);
  }
  if (!s.ok()) {
    result.error = s.message();
    return result;
  }
  const AllGatherBands bands = AllGatherBandsOf(plan, shape);
  // Operands in the dtype's bytes (fp8: the weight read K-major, random all the same); the
  // product is 16-bit (bf16 for fp8, unscaled: the scales default to 1).
  const size_t elem = GemmInputBytes(o.dtype), out_elem = 2;
  const size_t band_bytes = size_t(band_rows) * o.k * elem;

  std::mt19937_64 rng(o.seed);
  const std::vector<uint8_t> xs_host = RandomElements(size_t(M) * o.k, o.dtype, rng);
  const std::vector<uint8_t> w_host = RandomElements(size_t(o.k) * o.n, o.dtype, rng);
  Resources r;
  void *xs = nullptr, *w = nullptr, *gathered = nullptr, *d = nullptr, *d_ref = nullptr,
       *flags_v = nullptr;
  if ((e = r.Alloc(&xs, xs_host.size())) != cudaSuccess ||
      (e = r.Alloc(&w, w_host.size())) != cudaSuccess ||
      (e = r.Alloc(&gathered, size_t(M) * o.k * elem)) != cudaSuccess ||
      (e = r.Alloc(&d, size_t(M) * o.n * out_elem)) != cudaSuccess ||
      (e = r.Alloc(&d_ref, size_t(M) * o.n * out_elem)) != cudaSuccess ||
      (e = r.Alloc(&flags_v, bands.count * sizeof(uint32_t))) != cudaSuccess ||
      (e = cudaMemcpy(xs, xs_host.data(), xs_host.size(), cudaMemcpyHostToDevice)) !=
          cudaSuccess ||
      (e = cudaMemcpy(w, w_host.data(), w_host.size(), cudaMemcpyHostToDevice)) !=
          cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&r.gemm, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&r.copy, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&r.release, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaEventCreateWithFlags(&r.started, cudaEventDisableTiming)) != cudaSuccess ||
      (e = cudaEventCreateWithFlags(&r.copies_end, cudaEventDisableTiming)) != cudaSuccess) {
    result.error = Error(e, "setting up");
    return result;
  }
  auto* flags = static_cast<uint32_t*>(flags_v);
  const char* xs_bytes = static_cast<const char*>(xs);
  char* gathered_bytes = static_cast<char*>(gathered);
  const size_t rank_bytes = size_t(o.rows) * o.k * elem;

  // The plain GEMM of the same configuration on the whole input (the rank-major senders' rows).
  std::string msg;
  SignalingGemmArgs plain = GemmArgsOf(plan.gemm, o.dtype, M, o.n, o.k);
  plain.a = xs;
  plain.b = w;
  plain.d = d_ref;
  if ((e = LaunchSignalingGemm(r.gemm, plain, &msg)) != cudaSuccess) {
    result.error = "plain GEMM: " + msg;
    return result;
  }

  // The senders' copy graphs (graph slot "peer" q: the sender here, all on this GPU).
  CopyGraphs graphs;
  for (int q = 0; q < P; ++q) {
    if (q == o.rank) continue;
    for (int b = 0; b < bands.per_rank && s.ok(); ++b) {
      s = EnsureCopyGraph(graphs, q, b, gathered_bytes + (q * bands.per_rank + b) * band_bytes,
                          xs_bytes + q * rank_bytes + b * band_bytes, band_bytes);
    }
  }
  if (!s.ok()) {
    result.error = s.message();
    return result;
  }

  SignalingGemmArgs consumer = OverlapGemmArgs(plan, shape, o.rank);
  consumer.a = gathered;
  consumer.b = w;
  consumer.d = d;
  consumer.wait_flags = flags;
  result.gathered_equal = true;
  bool released_gathered_nan = true, released_product_nan = true;
  std::vector<uint16_t> got(size_t(M) * o.n), want(size_t(M) * o.n);
  std::vector<uint8_t> g_host(xs_host.size());
  for (int call = 0; call < o.calls; ++call) {
    // The receiver's stream, as EnqueueAllGatherCopyEngine: stale values (a step of its own),
    // the flags zeroed, the own rows and their flags, "call started", the consumer.
    if ((e = cudaMemsetAsync(gathered, kStaleByte, size_t(M) * o.k * elem, r.gemm)) !=
            cudaSuccess ||
        (e = cudaMemsetAsync(d, kStaleByte, size_t(M) * o.n * out_elem, r.gemm)) != cudaSuccess ||
        (e = cudaMemsetAsync(flags, 0, bands.count * sizeof(uint32_t), r.gemm)) != cudaSuccess ||
        (e = cudaMemcpyAsync(gathered_bytes + o.rank * rank_bytes, xs_bytes + o.rank * rank_bytes,
                             rank_bytes, cudaMemcpyDeviceToDevice, r.gemm)) != cudaSuccess) {
      result.error = Error(e, "the receiver's stream");
      return result;
    }
    for (int b = 0; b < bands.per_rank && s.ok(); ++b) {
      s = EnqueueWriteValue(r.gemm, flags + o.rank * bands.per_rank + b, 1);
    }
    if (s.ok()) s = CudaStatus(cudaEventRecord(r.started, r.gemm), "call started");
    if (s.ok()) {
      s = LaunchStatus(LaunchSignalingGemm(r.gemm, consumer, &msg), "consumer GEMM", msg);
    }
    // The senders, in the receiver's arrival order, each after a delay.
    if (s.ok()) s = CudaStatus(cudaStreamWaitEvent(r.copy, r.started, 0), "copy stream wait");
    for (int step = 1; step < P && s.ok(); ++step) {
      const int q = AllGatherSource(o.rank, step, P);
      if (o.delay_us > 0) {
        s = CudaStatus(cudaLaunchHostFunc(r.copy, Sleep,
                                          reinterpret_cast<void*>(intptr_t(o.delay_us))),
                       "delay");
      }
      if (s.ok() && q == o.released_sender) {  // as the copy thread without q's entry
        s = EnqueueBandRelease(r.copy, gathered_bytes, flags, q * bands.per_rank,
                               bands.per_rank, band_bytes);
      } else if (s.ok()) {
        s = EnqueueBandPushes(graphs, q, r.copy, xs_bytes + q * rank_bytes, gathered_bytes,
                              flags, q * bands.per_rank, bands.per_rank, band_bytes);
      }
    }
    if (s.ok()) s = CudaStatus(cudaEventRecord(r.copies_end, r.copy), "copies end");
    if (s.ok()) s = CudaStatus(cudaStreamWaitEvent(r.gemm, r.copies_end, 0), "join");
    if (!s.ok()) {
      result.error = s.message();
      return result;
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(int64_t(o.timeout_s * 1000));
    while ((e = cudaStreamQuery(r.gemm)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        result.timed_out = true;  // release every flag so that the GEMM ends (stream writes:
        for (int b = 0; b < bands.count; ++b) {  // no SM, which the GEMM may all hold)
          (void)EnqueueWriteValue(r.release, flags + b, 1);
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if ((e = cudaStreamSynchronize(r.gemm)) != cudaSuccess ||
        (e = cudaMemcpy(g_host.data(), gathered, g_host.size(), cudaMemcpyDeviceToHost)) !=
            cudaSuccess ||
        (e = cudaMemcpy(got.data(), d, got.size() * out_elem, cudaMemcpyDeviceToHost)) !=
            cudaSuccess) {
      result.error = Error(e, "running the check");
      return result;
    }
    if (result.timed_out) break;
    bool same = true, nan = true;
    for (int q = 0; q < P; ++q) {
      const size_t at = q * rank_bytes;
      if (q == o.released_sender) {
        nan = nan && AllNaN(g_host.data() + at, rank_bytes / elem, o.dtype);
      } else {
        same = same && std::memcmp(g_host.data() + at, xs_host.data() + at, rank_bytes) == 0;
      }
    }
    result.gathered_equal = result.gathered_equal && same;
    released_gathered_nan = released_gathered_nan && nan;
    if (o.released_sender >= 0) {  // the product's rows from the released bands, every call
      const size_t row0 = size_t(o.released_sender) * o.rows;
      released_product_nan =
          released_product_nan &&
          AllNaN(reinterpret_cast<const uint8_t*>(got.data() + row0 * o.n), size_t(o.rows) * o.n,
                 o.dtype == GemmDtype::kF16 ? GemmDtype::kF16 : GemmDtype::kBF16);
    }
  }
  if ((e = cudaMemcpy(want.data(), d_ref, want.size() * out_elem, cudaMemcpyDeviceToHost)) !=
      cudaSuccess) {
    result.error = Error(e, "reading the plain GEMM");
    return result;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const bool released_row = int64_t(i / o.n) / o.rows == o.released_sender;
    result.mismatches += !released_row && got[i] != want[i];
  }
  result.product_equal = !result.timed_out && result.mismatches == 0;
  result.released_gathered_nan = o.released_sender >= 0 && !result.timed_out &&
                                 released_gathered_nan;
  result.released_product_nan = o.released_sender >= 0 && !result.timed_out &&
                                released_product_nan;
  return result;
}

}  // namespace fo_jax
