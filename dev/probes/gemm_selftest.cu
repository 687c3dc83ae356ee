// Standalone self-test and micro-benchmark of the signaling GEMM (csrc/kernels/signaling_gemm.h).
// Correctness: random inputs, NaN-poisoned output and guard rows, fp32 cuBLAS reference, permuted
// placement for batch > 1, counters, reduced SM budget, and a consumer stream gated per group by
// cuStreamWaitValue32. Timing: every config on the TP shapes against cuBLAS, with/without counters.
// cuBLAS is loaded with dlopen (FO_CUBLAS_LIB or libcublas.so.13); no link to libcuda/libcublas.
#include <cublas_api.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "kernels/signaling_gemm.h"
#include "tool_common.cuh"

using fo_jax::GemmDtype;
using fo_jax::SignalingGemmArgs;

// ---------------- cuBLAS through dlopen ----------------
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmExFn gemm_ex = nullptr;
  cublasHandle_t handle = nullptr;
  bool Load() {
    const char* path = std::getenv("FO_CUBLAS_LIB");
    void* h = dlopen(path ? path : "libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!h) { std::printf("dlopen cublas failed: %s\n", dlerror()); return false; }
    create = reinterpret_cast<decltype(create)>(dlsym(h, "cublasCreate_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(h, "cublasSetStream_v2"));
    gemm_ex = reinterpret_cast<decltype(gemm_ex)>(dlsym(h, "cublasGemmEx"));
    return create && set_stream && gemm_ex && create(&handle) == CUBLAS_STATUS_SUCCESS;
  }
  // Row-major D[rows, n] = A[rows, k] @ B[k, n] (as column-major D^T = B^T A^T).
  void Gemm(cudaStream_t s, GemmDtype dt, int rows, int n, int k, const void* a, const void* b,
            void* d, bool f32_out) {
    set_stream(handle, s);
    const float one = 1.f, zero = 0.f;
    cudaDataType_t in = dt == GemmDtype::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t st = gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, rows, k, &one, b, in, n, a,
                                in, k, &zero, d, f32_out ? CUDA_R_32F : in, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) { std::printf("cublasGemmEx failed %d\n", int(st)); std::exit(2); }
  }
};

// ---------------- helper kernels ----------------
__device__ __forceinline__ float ToF(uint16_t v, int bf16) {
  if (bf16) { __nv_bfloat16 b = *reinterpret_cast<__nv_bfloat16*>(&v); return __bfloat162float(b); }
  __half h = *reinterpret_cast<__half*>(&v); return __half2float(h);
}
// Compares D (placed rows) against the fp32 reference of logical rows: src_row[dst] tells which.
__global__ void Compare(const uint16_t* d, const float* ref, const int* src_row, long long rows,
                        int n, int bf16, float rtol, float atol, unsigned long long* bad,
                        unsigned int* max_err_bits) {
  long long total = rows * n;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i / n; int c = int(i % n);
    float want = ref[(long long)src_row[r] * n + c];
    float got = ToF(d[i], bf16);
    float err = fabsf(got - want);
    if (!(err <= atol + rtol * fabsf(want))) atomicAdd(bad, 1ULL);
    float rel = err / (fabsf(want) + atol);
    if (!(rel == rel)) rel = 1e30f;
    atomicMax(max_err_bits, __float_as_uint(rel));
  }
}
__global__ void CountNot(const uint16_t* p, size_t count, uint16_t v, unsigned long long* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    if (p[i] != v) atomicAdd(out, 1ULL);
}
// Snapshot of one group's rows right after its counter was observed complete; also records the
// last group's counter at that moment (proof that the GEMM was still running).
__global__ void Snapshot(const uint4* src, uint4* dst, size_t count, const uint32_t* counters,
                         int last_group, uint32_t* observed) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *observed = *reinterpret_cast<const volatile uint32_t*>(counters + last_group);
  }
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// ---------------- test driver ----------------
static int g_failures = 0;
static PFN_cuStreamWaitValue32_v8000 g_wait_value = nullptr;

struct Problem {
  GemmDtype dt;
  int m, n, k, batch;
  std::vector<int> gb;  // group_begin in tile-rows of the config
};

static int TileM(int cfg) { return fo_jax::GetGemmConfig(cfg).tile_m; }

static std::vector<int> EvenGroups(int tiles_m, int groups) {
  std::vector<int> gb(groups + 1);
  for (int g = 0; g <= groups; ++g) gb[g] = int((long long)tiles_m * g / groups);
  return gb;
}

static SignalingGemmArgs MakeArgs(const Problem& p, int cfg, const void* a, const void* b, void* d,
                                  uint32_t* counters, int budget) {
  SignalingGemmArgs s;
  s.dtype = p.dt; s.m = p.m; s.n = p.n; s.k = p.k; s.batch = p.batch;
  s.a = a; s.b = b; s.d = d;
  s.num_groups = int(p.gb.size()) - 1;
  for (size_t i = 0; i < p.gb.size(); ++i) s.group_begin[i] = p.gb[i];
  s.counters = counters; s.sm_budget = budget; s.config = cfg;
  return s;
}

// Destination row -> logical row (batch l, row i) as l * m + i, per the header's formula.
static std::vector<int> SourceRows(const Problem& p, int tile_m) {
  std::vector<int> src(size_t(p.batch) * p.m);
  int G = int(p.gb.size()) - 1;
  for (int g = 0; g < G; ++g) {
    int r0 = std::min(p.gb[g] * tile_m, p.m), r1 = std::min(p.gb[g + 1] * tile_m, p.m);
    for (int l = 0; l < p.batch; ++l)
      for (int i = r0; i < r1; ++i)
        src[size_t(p.batch) * r0 + size_t(l) * (r1 - r0) + (i - r0)] = l * p.m + i;
  }
  return src;
}

static void Check(bool ok, const std::string& what) {
  if (!ok) { ++g_failures; std::printf("  FAIL: %s\n", what.c_str()); }
}

// One correctness case. Returns true on pass.
static void RunCase(Cublas& cb, const Problem& p, int cfg, cudaStream_t s, cudaStream_t s2,
                    bool consumer_test) {
  const int bf16 = p.dt == GemmDtype::kBF16;
  const size_t rows = size_t(p.batch) * p.m;
  const int guard = 64;
  uint16_t *a, *b, *d, *d2, *snap;
  float* ref;
  int* src_row;
  uint32_t *ctr, *observed;
  unsigned long long* bad;
  unsigned int* maxerr;
  const int G = int(p.gb.size()) - 1;
  CK(cudaMalloc(&a, rows * p.k * 2));
  CK(cudaMalloc(&b, size_t(p.k) * p.n * 2));
  CK(cudaMalloc(&d, (rows + guard) * p.n * 2));
  CK(cudaMalloc(&d2, (rows + guard) * p.n * 2));
  CK(cudaMalloc(&snap, rows * p.n * 2));
  CK(cudaMalloc(&ref, rows * p.n * 4));
  CK(cudaMalloc(&src_row, rows * 4));
  CK(cudaMalloc(&ctr, 64 * 4));
  CK(cudaMalloc(&observed, 64 * 4));
  CK(cudaMalloc(&bad, 8));
  CK(cudaMalloc(&maxerr, 4));
  FillRandom<<<512, 256, 0, s>>>(a, rows * p.k, 1234 + p.m, bf16);
  FillRandom<<<512, 256, 0, s>>>(b, size_t(p.k) * p.n, 99 + p.n, bf16);
  CK(cudaMemsetAsync(d, 0xFF, (rows + guard) * p.n * 2, s));  // 0xFFFF: NaN in bf16 and f16
  CK(cudaMemsetAsync(d2, 0xFF, (rows + guard) * p.n * 2, s));
  CK(cudaMemsetAsync(ctr, 0, 64 * 4, s));
  cb.Gemm(s, p.dt, int(rows), p.n, p.k, a, b, ref, true);
  std::vector<int> src = SourceRows(p, TileM(cfg));
  CK(cudaMemcpyAsync(src_row, src.data(), rows * 4, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));

  const char* name = fo_jax::GetGemmConfig(cfg).name;
  char label[256];
  std::snprintf(label, sizeof(label), "%s %s m=%d n=%d k=%d batch=%d groups=%d", name,
                bf16 ? "bf16" : "f16", p.m, p.n, p.k, p.batch, G);

  std::string err;
  SignalingGemmArgs args = MakeArgs(p, cfg, a, b, d, ctr, 0);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (consumer_test) args.sm_budget = sms - 8;  // leave SMs for the consumer's copy kernels

  std::vector<size_t> band_begin(G + 1);
  for (int g = 0; g <= G; ++g)
    band_begin[g] = size_t(p.batch) * std::min(p.gb[g] * TileM(cfg), p.m);
  if (consumer_test) {
    // Consumer on s2, enqueued before the GEMM: per group wait counter >= expected, then copy.
    for (int g = 0; g < G; ++g) {
      uint32_t want = uint32_t(fo_jax::ExpectedGroupCount(args, g));
      CUresult r = g_wait_value(reinterpret_cast<CUstream>(s2),
                                reinterpret_cast<CUdeviceptr>(ctr + g), want,
                                CU_STREAM_WAIT_VALUE_GEQ);
      Check(r == CUDA_SUCCESS, "cuStreamWaitValue32");
      size_t off = band_begin[g] * p.n, cnt = (band_begin[g + 1] - band_begin[g]) * p.n;
      Snapshot<<<264, 256, 0, s2>>>(reinterpret_cast<uint4*>(d + off),
                                    reinterpret_cast<uint4*>(snap + off), cnt * 2 / 16, ctr,
                                    G - 1, observed + g);
    }
  }
  cudaError_t e = fo_jax::LaunchSignalingGemm(s, args, &err);
  Check(e == cudaSuccess, std::string("launch: ") + err);
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamSynchronize(s2));

  // Values and placement.
  CK(cudaMemset(bad, 0, 8));
  CK(cudaMemset(maxerr, 0, 4));
  float rtol = bf16 ? 1.6e-2f : 4e-3f, atol = bf16 ? 2e-2f : 5e-3f;
  Compare<<<1024, 256>>>(d, ref, src_row, (long long)rows, p.n, bf16, rtol, atol, bad, maxerr);
  unsigned long long nbad = 0, nguard = 0;
  unsigned int maxerr_bits = 0;
  CK(cudaMemcpy(&nbad, bad, 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&maxerr_bits, maxerr, 4, cudaMemcpyDeviceToHost));
  CK(cudaMemset(bad, 0, 8));
  CountNot<<<64, 256>>>(d + rows * p.n, size_t(guard) * p.n, 0xFFFF, bad);
  CK(cudaMemcpy(&nguard, bad, 8, cudaMemcpyDeviceToHost));
  float max_rel;
  std::memcpy(&max_rel, &maxerr_bits, 4);
  Check(nbad == 0, std::string(label) + ": " + std::to_string(nbad) + " wrong elements");
  Check(nguard == 0, std::string(label) + ": wrote guard rows");

  // Counters.
  std::vector<uint32_t> c(G);
  CK(cudaMemcpy(c.data(), ctr, G * 4, cudaMemcpyDeviceToHost));
  bool ctr_ok = true;
  for (int g = 0; g < G; ++g) ctr_ok &= c[g] == uint32_t(fo_jax::ExpectedGroupCount(args, g));
  Check(ctr_ok, std::string(label) + ": counters != expected");

  // Reduced SM budget: identical bits.
  SignalingGemmArgs a2 = args;
  a2.d = d2; a2.counters = nullptr; a2.sm_budget = 7 * fo_jax::GetGemmConfig(cfg).cluster_m;
  e = fo_jax::LaunchSignalingGemm(s, a2, &err);
  Check(e == cudaSuccess, std::string("launch budget: ") + err);
  CK(cudaStreamSynchronize(s));
  std::vector<uint16_t> h1(rows * p.n), h2(rows * p.n);
  CK(cudaMemcpy(h1.data(), d, rows * p.n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h2.data(), d2, rows * p.n * 2, cudaMemcpyDeviceToHost));
  Check(h1 == h2, std::string(label) + ": sm_budget=7 result differs");

  int early = 0;
  if (consumer_test) {
    std::vector<uint16_t> hs(rows * p.n);
    CK(cudaMemcpy(hs.data(), snap, rows * p.n * 2, cudaMemcpyDeviceToHost));
    Check(hs == h1, std::string(label) + ": consumer snapshot != final result");
    std::vector<uint32_t> obs(G);
    CK(cudaMemcpy(obs.data(), observed, G * 4, cudaMemcpyDeviceToHost));
    for (int g = 0; g < G; ++g)
      early += obs[g] < uint32_t(fo_jax::ExpectedGroupCount(args, G - 1));
  }
  std::printf("  %-70s max_rel=%.2e bad=%llu ctr=%s%s", label, max_rel, nbad, ctr_ok ? "ok" : "BAD",
              consumer_test ? "" : "\n");
  if (consumer_test)
    std::printf(" consumer: snapshot %s, %d/%d groups copied while GEMM still running\n",
                g_failures ? "?" : "ok", early, G);
  cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(d2); cudaFree(snap); cudaFree(ref);
  cudaFree(src_row); cudaFree(ctr); cudaFree(observed); cudaFree(bad); cudaFree(maxerr);
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::printf("fo_jax signaling GEMM selftest  %s  device: %s (%d SMs, sm_%d%d)\n", date, prop.name,
              prop.multiProcessorCount, prop.major, prop.minor);
  Cublas cb;
  if (!cb.Load()) { std::printf("cuBLAS not available\n"); return 2; }
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32",
                                      reinterpret_cast<void**>(&g_wait_value), 12000,
                                      cudaEnableDefault, &q));
  std::string err;
  if (fo_jax::LoadAllGemmKernels(&err) != cudaSuccess) { std::printf("load: %s\n", err.c_str()); return 2; }
  cudaFuncAttributes fa;  // our own helper kernels, loaded before any overlapped launch too
  CK(cudaFuncGetAttributes(&fa, Snapshot));
  CK(cudaFuncGetAttributes(&fa, Compare));
  CK(cudaFuncGetAttributes(&fa, CountNot));
  CK(cudaFuncGetAttributes(&fa, FillRandom));
  cudaStream_t s, s2;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  // Argument validation.
  {
    SignalingGemmArgs bad_args;
    bad_args.m = 12; bad_args.n = 16; bad_args.k = 16;
    Check(fo_jax::LaunchSignalingGemm(s, bad_args, &err) == cudaErrorInvalidValue,
          "m=12 must be rejected");
    std::printf("validation: m=12 -> \"%s\"\n", err.c_str());
  }

  std::printf("\n== correctness ==\n");
  const int nc = fo_jax::NumGemmConfigs();
  for (int cfg = 0; cfg < nc; ++cfg) {
    const int tm = TileM(cfg);
    for (GemmDtype dt : {GemmDtype::kBF16, GemmDtype::kF16}) {
      if (quick && dt == GemmDtype::kF16 && cfg > 0) continue;
      if (!fo_jax::GemmConfigSupportsDtype(cfg, dt)) continue;  // the fp8 rows (tested in pytest)
      struct Shape { int m, n, k, batch, groups; bool uneven; };
      std::vector<Shape> shapes = {
          {512, 512, 512, 1, 1, false},     {1000, 1032, 520, 1, 3, true},
          {2048, 264, 1024, 1, 4, false},   {136, 2048, 256, 1, 2, true},
          {1000, 1032, 520, 4, 3, true},    {1024, 512, 256, 4, 4, false},
          {200, 136, 64, 4, 2, true},       {1544, 776, 128, 2, 5, true},
      };
      for (size_t si = 0; si < shapes.size(); ++si) {
        const Shape& sh = shapes[si];
        Problem p{dt, sh.m, sh.n, sh.k, sh.batch, {}};
        int tiles_m = (sh.m + tm - 1) / tm;
        int groups = std::min(sh.groups, tiles_m);
        p.gb = EvenGroups(tiles_m, groups);
        if (sh.uneven && groups >= 2) {  // uneven: first group 1 tile-row, maybe an empty one
          p.gb[1] = 1;
          if (groups >= 3) p.gb[2] = 1;
        }
        RunCase(cb, p, cfg, s, s2, false);
      }
    }
  }
  // Consumer gating on a big problem (the default config), batch 1 and 4.
  {
    int cfg = fo_jax::SelectGemmConfig(GemmDtype::kBF16, 8192, 8192, 2048, 1, 0);
    Problem p{GemmDtype::kBF16, 8192, 8192, 2048, 1, EvenGroups(8192 / TileM(cfg), 8)};
    RunCase(cb, p, cfg, s, s2, true);
    Problem p4{GemmDtype::kBF16, 2048, 8192, 2048, 4, EvenGroups(2048 / TileM(cfg), 4)};
    RunCase(cb, p4, cfg, s, s2, true);
  }
  std::printf("correctness: %s (%d failures)\n", g_failures ? "FAILED" : "PASSED", g_failures);

  // Timing: per shape, all variants round-robin (each round times every variant once), so slow
  // clock/thermal drift hits all of them alike; medians over the rounds.
  const int rounds = 40;
  std::printf("\n== timing (bf16; same inputs every call, no rotation; 5 warm-up rounds, median of "
              "%d round-robin event-timed launches; TFLOP/s = 2mnk/t; 8 even groups) ==\n", rounds);
  struct TS { int m, n, k; float xla_ms; };
  std::vector<TS> tshapes = {{4096, 8192, 2048, 0.209f}, {8192, 8192, 2048, 0.394f},
                             {8192, 8192, 7168, 1.394f}, {16384, 8192, 7168, 2.780f},
                             {16384, 8192, 2048, 0.759f}};
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const TS& t : tshapes) {
    uint16_t *a, *b, *d;
    uint32_t* ctr;
    CK(cudaMalloc(&a, size_t(t.m) * t.k * 2));
    CK(cudaMalloc(&b, size_t(t.k) * t.n * 2));
    CK(cudaMalloc(&d, size_t(t.m) * t.n * 2));
    CK(cudaMalloc(&ctr, 64 * 4));
    FillRandom<<<512, 256, 0, s>>>(a, size_t(t.m) * t.k, 7, 1);
    FillRandom<<<512, 256, 0, s>>>(b, size_t(t.k) * t.n, 8, 1);
    struct Variant { std::string name; int cfg; SignalingGemmArgs args; bool cublas; std::vector<float> ms; };
    std::vector<Variant> vs;
    vs.push_back({"cublas", -1, {}, true, {}});
    const int sel = fo_jax::SelectGemmConfig(GemmDtype::kBF16, t.m, t.n, t.k, 1, 0);
    for (int cfg = 0; cfg < nc; ++cfg) {
      if (!fo_jax::GemmConfigSupportsDtype(cfg, GemmDtype::kBF16)) continue;
      const int tm = TileM(cfg);
      Problem p{GemmDtype::kBF16, t.m, t.n, t.k, 1, EvenGroups((t.m + tm - 1) / tm, 8)};
      SignalingGemmArgs plain = MakeArgs(p, cfg, a, b, d, nullptr, 0);
      SignalingGemmArgs sig = MakeArgs(p, cfg, a, b, d, ctr, 0);
      vs.push_back({"plain", cfg, plain, false, {}});
      vs.push_back({"sig", cfg, sig, false, {}});
      if (cfg == sel) {
        SignalingGemmArgs x = sig;
        x.sm_budget = prop.multiProcessorCount - 16;
        vs.push_back({"sig_budget" + std::to_string(x.sm_budget), cfg, x, false, {}});
      }
    }
    for (int r = 0; r < 5 + rounds; ++r) {
      for (Variant& v : vs) {
        if (v.args.counters) CK(cudaMemsetAsync(v.args.counters, 0, 64 * 4, s));
        const float ms = EventTimedMs(s, e0, e1, [&] {
          if (!v.cublas) return fo_jax::LaunchSignalingGemm(s, v.args, &err) == cudaSuccess;
          cb.Gemm(s, GemmDtype::kBF16, t.m, t.n, t.k, a, b, d, false);
          return true;
        });
        if (ms < 0) {
          std::printf("launch failed: %s\n", err.c_str());
          return 2;
        }
        if (r >= 5) v.ms.push_back(ms);
      }
    }
    const double flop = 2.0 * t.m * t.n * t.k;
    const float cublas_ms = Median(vs[0].ms);
    std::printf("\n%dx%dx%d  cuBLAS %.4f ms (%.1f TFLOP/s), XLA reference %.3f ms (%.1f TFLOP/s)\n",
                t.m, t.n, t.k, cublas_ms, flop / cublas_ms / 1e9, t.xla_ms, flop / t.xla_ms / 1e9);
    std::printf("  %-24s %9s %8s %9s %7s %9s %8s\n", "config", "ms", "TFLOP/s", "vs_cublas",
                "vs_xla", "ms_signal", "sig_ovh");
    for (size_t i = 1; i < vs.size(); ++i) {
      const Variant& v = vs[i];
      const float ms = Median(v.ms);
      const char* cname = fo_jax::GetGemmConfig(v.cfg).name;
      if (v.name == "plain") {
        const float ms_sig = Median(vs[i + 1].ms);
        std::printf("  %-24s %9.4f %8.1f %9.3f %7.3f %9.4f %7.2f%%%s\n", cname, ms,
                    flop / ms / 1e9, cublas_ms / ms, t.xla_ms / ms, ms_sig,
                    100.0 * (ms_sig - ms) / ms, v.cfg == sel ? "  <- selected" : "");
        ++i;
      } else {
        std::printf("    %-22s %9.4f %8.1f %9.3f %7.3f   (%s)\n", v.name.c_str(), ms,
                    flop / ms / 1e9, cublas_ms / ms, t.xla_ms / ms, cname);
      }
    }
    cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(ctr);
  }
  std::printf("\nRESULT: %s\n", g_failures ? "FAILED" : "PASSED");
  return g_failures ? 1 : 0;
}
