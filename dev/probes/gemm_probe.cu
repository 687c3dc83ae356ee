// Diagnostic: where does the signaling GEMM lose against XLA's GEMM? Times, round-robin on the same
// bf16 inputs, (1) fo_jax's GEMM (no counters, one group), (2) stock CUTLASS 3.x sm90 kernels of
// the same tile shapes with CUTLASS's own persistent scheduler, both with w row-major as JAX stores
// it ("NN": B is N-major) and with B K-major ("NT", the layout cuBLAS calls TN), (3) stock CUTLASS
// kernels of the transposed product D^T = w^T x^T on the same buffers ("T": the weight is an
// MN-major A operand, x a K-major B operand, D^T stored column-major, i.e. D row-major), whose
// tile is named N x M as cuBLASLt names its own (its view of XLA's row-major dot is this
// transposed product): tiles that step along M by 16 or 32 rows, such as cuBLASLt's 128x160 at
// N = 1280, which fo_jax's tiles (64-row steps along M) cannot take, and (4) every algorithm
// cuBLASLt's heuristic offers (what XLA picks from). Not part of the library.
// Build: dev/README.md (target gemm_probe). Run: gemm_probe [MxNxK ...]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/signaling_gemm.h"
#include "kernels/signaling_gemm_kernel.cuh"
#include "tool_common.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

using Bf16 = cutlass::bfloat16_t;

// ---------------- stock CUTLASS kernels ----------------
// LayoutD ColumnMajor: the transposed product (MakeStock): problem (N, M, K), A = w viewed as
// [N, K] with N contiguous, B = x viewed as [M, K] with K contiguous, D^T = [N, M] with N
// contiguous (D itself, row-major); the tile is then N x M and the cluster runs along N.
template <class LayoutB, int kTM, int kTN, int kCM, bool kPingpong,
          class LayoutA = cutlass::layout::RowMajor, class LayoutD = cutlass::layout::RowMajor>
struct Stock {
  using TileShape = cute::Shape<cute::Int<kTM>, cute::Int<kTN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<kCM>, cute::_1, cute::_1>;
  using EpiSchedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                         cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using Schedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                      cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, 8, Bf16,
      LayoutD, 8, EpiSchedule>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA, 8,
      Bf16, LayoutB, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Main, Epi,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr bool kKMajorB = std::is_same_v<LayoutB, cutlass::layout::ColumnMajor>;
  static constexpr bool kTransposed = std::is_same_v<LayoutD, cutlass::layout::ColumnMajor>;
};

// The transposed product with a tile of kTN x kTM along N x M, the cluster along N.
template <int kTN, int kTM, int kCN, bool kPingpong>
using StockT = Stock<cutlass::layout::ColumnMajor, kTN, kTM, kCN, kPingpong,
                     cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor>;

struct Runner {
  std::string name;
  // Launch on stream; returns false if the problem cannot run.
  std::function<bool(cudaStream_t)> run;
  std::vector<float> ms;
};

// One timed problem: D[m,n] = A[m,k] @ B[k,n] (bf16), plus the device's SMs and a workspace.
struct Problem {
  int m, n, k;
  const void* a;
  const void* b;
  void* d;
  int sms;
  void* workspace;
  size_t ws_bytes;
};

template <class S>
Runner MakeStock(const char* name, const Problem& p) {
  const int m = p.m, n = p.n, k = p.k;
  using Gemm = typename S::Gemm;
  using K = typename S::Kernel;
  typename K::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  typename K::StrideD sd;
  if constexpr (S::kTransposed) {
    args.problem_shape = cute::make_shape(n, m, k, 1);
    args.mainloop.ptr_A = static_cast<Bf16 const*>(p.b);  // w[k, n]: (n, k) at k * n + n
    args.mainloop.dA = cute::make_stride(cute::Int<1>{}, int64_t(n), int64_t(n) * k);
    args.mainloop.ptr_B = static_cast<Bf16 const*>(p.a);  // x[m, k]: (m, k) at m * k + k
    args.mainloop.dB = cute::make_stride(int64_t(k), cute::Int<1>{}, int64_t(m) * k);
    sd = cute::make_stride(cute::Int<1>{}, int64_t(n), int64_t(m) * n);  // (n, m) at m * n + n
  } else {
    args.problem_shape = cute::make_shape(m, n, k, 1);
    args.mainloop.ptr_A = static_cast<Bf16 const*>(p.a);
    args.mainloop.dA = cute::make_stride(int64_t(k), cute::Int<1>{}, int64_t(m) * k);
    args.mainloop.ptr_B = static_cast<Bf16 const*>(p.b);
    if constexpr (S::kKMajorB) {
      args.mainloop.dB = cute::make_stride(int64_t(k), cute::Int<1>{}, int64_t(n) * k);
    } else {
      args.mainloop.dB = cute::make_stride(cute::Int<1>{}, int64_t(n), int64_t(n) * k);
    }
    sd = cute::make_stride(int64_t(n), cute::Int<1>{}, int64_t(m) * n);
  }
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = sd;
  args.epilogue.ptr_D = static_cast<Bf16*>(p.d);
  args.epilogue.dD = sd;
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = p.sms;
  auto gemm = std::make_shared<Gemm>();
  if (gemm->can_implement(args) != cutlass::Status::kSuccess ||
      Gemm::get_workspace_size(args) > p.ws_bytes ||
      gemm->initialize(args, p.workspace) != cutlass::Status::kSuccess) {
    return {name, [](cudaStream_t) { return false; }, {}};
  }
  return {name, [gemm](cudaStream_t s) { return gemm->run(s) == cutlass::Status::kSuccess; }, {}};
}

// ---------------- ping-pong hybrids: which fo_jax part costs against stock CUTLASS ----------------
// fo_jax's ping-pong mainloop (B N-major, shared over L) with either CUTLASS's persistent scheduler
// or fo_jax's group scheduler, and either CUTLASS's TMA epilogue or fo_jax's signaling epilogue
// (no counters), all launched by CUTLASS's adapter. (Before commit 809fb72 fo_jax's launcher
// used a cluster launch even for a 1x1 cluster; the adapter launches those as a plain grid.)
// fo_jax's epilogue with its per-tile work taken out: store() and store_tail() go straight to the
// CUTLASS TMA epilogue it wraps (no group, destination row or signal bookkeeping), while its
// parameters, shared storage and construction stay. Beside the stock and fo_jax epilogues it
// splits what fo_jax's epilogue costs at short K between that per-tile work and the rest. Runs
// problems of batch 1 without rotation (tile coordinates are rows of D).
template <class Base>
struct PlainStoreEpilogue : Base {
  using Base::Base;
  using typename Base::LoadPipeline;
  using typename Base::LoadPipelineState;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;
  using Inner = typename Base::Inner;

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine,
            class AccLayout, class TiledMma, class... Ts>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadPipelineState load_state,
                            StorePipeline store_pipeline, StorePipelineState store_state,
                            ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape,
                            TileCoordMNKL tile_coord,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma,
                            int thread_idx, typename Base::TensorStorage& shared, Ts... rest) {
    typename Inner::TensorStorage* inner;
    if constexpr (std::is_same_v<typename Base::TensorStorage, typename Inner::TensorStorage>) {
      inner = &shared;
    } else {
      inner = &shared.inner;  // (the signal handoff's storage follows it)
    }
    return Inner::store(load_pipeline, load_state, store_pipeline, store_state, problem_shape,
                        tile_shape, tile_coord, accumulators, tiled_mma, thread_idx, *inner,
                        rest...);
  }
  CUTLASS_DEVICE auto store_tail(LoadPipeline load_pipeline, LoadPipelineState load_state,
                                 StorePipeline store_pipeline, StorePipelineState store_state) {
    return Inner::store_tail(load_pipeline, load_state, store_pipeline, store_state);
  }
};

// fo_jax's epilogue with only one of its two per-tile calls taken straight to CUTLASS's:
// kPlainStore, store() (store_tail() fo_jax's), else store_tail() (store() fo_jax's).
template <class Base, bool kPlainStore>
struct HalfPlainEpilogue : PlainStoreEpilogue<Base> {
  using PlainStoreEpilogue<Base>::PlainStoreEpilogue;
  using typename Base::LoadPipeline;
  using typename Base::LoadPipelineState;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;
  using Inner = typename Base::Inner;

  template <class... Args>
  CUTLASS_DEVICE auto store(Args&&... args) {
    if constexpr (kPlainStore) {
      return PlainStoreEpilogue<Base>::store(args...);
    } else {
      return Base::store(args...);
    }
  }
  CUTLASS_DEVICE auto store_tail(LoadPipeline load_pipeline, LoadPipelineState load_state,
                                 StorePipeline store_pipeline, StorePipelineState store_state) {
    if constexpr (kPlainStore) {
      return Base::store_tail(load_pipeline, load_state, store_pipeline, store_state);
    } else {
      return Inner::store_tail(load_pipeline, load_state, store_pipeline, store_state);
    }
  }
};

// kEpi: 0 CUTLASS's TMA epilogue, 1 fo_jax's signaling epilogue, 2 fo_jax's without its per-tile
// work (PlainStoreEpilogue), 3 fo_jax's with a plain store() only, 4 with a plain store_tail()
// only (HalfPlainEpilogue).
template <int kTM, int kTN, int kCM, bool kGroupSched, int kEpi>
struct Hybrid {
  using Cfg = fo_jax::detail::GemmKernelConfig<Bf16, kTM, kTN, 64, kCM, 1, true>;
  static constexpr bool kOurs = kEpi != 0;
  using Epi = std::conditional_t<
      kEpi == 0, typename Stock<cutlass::layout::RowMajor, kTM, kTN, kCM, true>::Epi,
      std::conditional_t<
          kEpi == 1, typename Cfg::Epilogue,
          std::conditional_t<
              kEpi == 2, PlainStoreEpilogue<typename Cfg::Epilogue>,
              HalfPlainEpilogue<typename Cfg::Epilogue, kEpi == 3>>>>;
  using Sched = std::conditional_t<kGroupSched, fo_jax::detail::GroupSchedulerTag,
                                   cutlass::gemm::PersistentScheduler>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      typename Cfg::Mainloop, Epi, Sched>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// swizzle: tile-rows per raster chunk of the group scheduler (fo_jax's launcher: 8), or 0 for
// the order CUTLASS's persistent scheduler picks here (whole columns when there are more column
// tiles than tile-rows, else whole rows: chunks of all tile-rows, or of one).
template <class H>
Runner MakeHybrid(const char* name, const Problem& p, int swizzle = 8) {
  constexpr int kTM = H::Cfg::kTileM, kTN = H::Cfg::kTileN, kCM = H::Cfg::kClusterM;
  using K = typename H::Kernel;
  const int tiles_m = (p.m + kTM - 1) / kTM, tiles_n = (p.n + kTN - 1) / kTN;
  typename K::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = cute::make_shape(p.m, p.n, p.k, 1);
  args.mainloop.ptr_A = static_cast<Bf16 const*>(p.a);
  args.mainloop.dA = cute::make_stride(int64_t(p.k), cute::Int<1>{}, int64_t(p.m) * p.k);
  args.mainloop.ptr_B = static_cast<Bf16 const*>(p.b);
  args.mainloop.dB = cute::make_stride(cute::Int<1>{}, int64_t(p.n), cute::Int<0>{});
  auto sd = cute::make_stride(int64_t(p.n), cute::Int<1>{}, int64_t(p.m) * p.n);
  if constexpr (H::kOurs) {
    args.epilogue.inner.ptr_C = nullptr;
    args.epilogue.inner.dC = sd;
    args.epilogue.inner.ptr_D = static_cast<Bf16*>(p.d);
    args.epilogue.inner.dD = sd;
    fo_jax::detail::EpilogueParams e;
    e.d = p.d;
    e.m = p.m;
    e.n = p.n;
    e.tiles_m = tiles_m;
    e.num_groups = 1;
    e.group_begin[0] = 0;
    e.group_begin[1] = tiles_m;
    args.epilogue.signal = e;
  } else {
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sd;
    args.epilogue.ptr_D = static_cast<Bf16*>(p.d);
    args.epilogue.dD = sd;
  }
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = p.sms;
  auto table = std::make_shared<fo_jax::detail::GroupTable>();
  if constexpr (std::is_same_v<typename H::Sched, fo_jax::detail::GroupSchedulerTag>) {
    table->num_groups = 1;
    table->tiles_n = tiles_n;
    table->swizzle = swizzle > 0 ? swizzle : (tiles_n > tiles_m ? tiles_m : 1);
    table->sgroup_begin[1] = (tiles_m + kCM - 1) / kCM;
    table->unit_start[1] = table->sgroup_begin[1] * tiles_n;
    args.scheduler.table = table.get();
  }
  auto gemm = std::make_shared<typename H::Gemm>();
  if (gemm->can_implement(args) != cutlass::Status::kSuccess ||
      H::Gemm::get_workspace_size(args) > p.ws_bytes ||
      gemm->initialize(args, p.workspace) != cutlass::Status::kSuccess) {
    return {name, [](cudaStream_t) { return false; }, {}};
  }
  return {name, [gemm, table](cudaStream_t s) {
            return gemm->run(s) == cutlass::Status::kSuccess;
          }, {}};
}

// Co-resident clusters of a kernel: the launcher's own query (its cap on the persistent grid).
template <class K, int kCM>
int MaxClusters() {
  int clusters = -1;
  if (cudaFuncSetAttribute(&cutlass::device_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(K::SharedStorageSize)) != cudaSuccess ||
      fo_jax::detail::MaxResidentClusters<K, kCM>(&clusters) != cudaSuccess) {
    return -1;
  }
  return clusters;
}

// ---------------- cuBLASLt through dlopen ----------------
struct Lt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
  cublasLtHandle_t h = nullptr;
  bool Load() {
    void* lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { std::printf("dlopen cublasLt: %s\n", dlerror()); return false; }
#define SYM(f, s) f = reinterpret_cast<decltype(f)>(dlsym(lib, s)); if (!f) return false;
    SYM(create, "cublasLtCreate") SYM(desc_create, "cublasLtMatmulDescCreate")
    SYM(layout_create, "cublasLtMatrixLayoutCreate")
    SYM(pref_create, "cublasLtMatmulPreferenceCreate")
    SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute")
    SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic") SYM(matmul, "cublasLtMatmul")
#undef SYM
    return create(&h) == CUBLAS_STATUS_SUCCESS;
  }
};

std::vector<Runner> MakeLt(Lt& lt, int m, int n, int k, const void* a, const void* b, void* d,
                           void* ws, size_t ws_bytes) {
  // Row-major D[m,n] = A[m,k] B[k,n] as column-major D^T[n,m] = B^T[n,k] A^T[k,m] (both "N").
  auto desc = std::make_shared<cublasLtMatmulDesc_t>();
  lt.desc_create(desc.get(), CUBLAS_COMPUTE_32F, CUDA_R_32F);
  auto la = std::make_shared<cublasLtMatrixLayout_t>();
  auto lb = std::make_shared<cublasLtMatrixLayout_t>();
  auto ld = std::make_shared<cublasLtMatrixLayout_t>();
  lt.layout_create(la.get(), CUDA_R_16BF, n, k, n);  // B^T
  lt.layout_create(lb.get(), CUDA_R_16BF, k, m, k);  // A^T
  lt.layout_create(ld.get(), CUDA_R_16BF, n, m, n);
  cublasLtMatmulPreference_t pref;
  lt.pref_create(&pref);
  lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  lt.heuristic(lt.h, *desc, *la, *lb, *ld, *ld, pref, 16, res, &found);
  std::vector<Runner> out;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto algo = std::make_shared<cublasLtMatmulAlgo_t>(res[i].algo);
    Lt* p = &lt;
    out.push_back({"cublasLt#" + std::to_string(i), [=](cudaStream_t s) {
                     const float one = 1.f, zero = 0.f;
                     return p->matmul(p->h, *desc, &one, b, *la, a, *lb, &zero, d, *ld, d, *ld,
                                      algo.get(), ws, ws_bytes, s) == CUBLAS_STATUS_SUCCESS;
                   }, {}});
  }
  return out;
}

// max |got - want| and max |want| over n bf16 values, as float bits in *diff and *ref
// (non-negative floats order as their bits): every method is checked against fo_jax's GEMM
// (itself checked against cuBLAS by gemm_selftest) before it is timed.
__global__ void MaxAbs(const uint16_t* got, const uint16_t* want, size_t n, unsigned* diff,
                       unsigned* ref) {
  float d = 0.f, r = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float g = __uint_as_float(unsigned(got[i]) << 16);
    const float w = __uint_as_float(unsigned(want[i]) << 16);
    d = fmaxf(d, isnan(g) || isnan(w) ? INFINITY : fabsf(g - w));  // fmaxf drops NaN operands
    r = fmaxf(r, fabsf(w));
  }
  atomicMax(diff, __float_as_uint(d));
  atomicMax(ref, __float_as_uint(r));
}

int main(int argc, char** argv) {
  std::vector<std::string> shapes;
  for (int i = 1; i < argc; ++i) shapes.push_back(argv[i]);
  if (shapes.empty()) {
    shapes = {"4096x8192x2048", "8192x8192x2048", "8192x8192x7168", "16384x8192x7168",
              "16384x8192x2048", "6000x5000x3000"};
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("gemm_probe  device: %s (%d SMs); bf16, median of 30 round-robin event-timed "
              "launches (a 50 us sleep kernel ahead of each hides host setup)\n", prop.name, sms);
  using H11 = Hybrid<128, 128, 1, true, 1>;
  using H12 = Hybrid<128, 128, 2, true, 1>;
  std::printf("max co-resident clusters: pp128x128 c1 %d, pp128x128 c2 %d\n",
              MaxClusters<H11::Kernel, 1>(), MaxClusters<H12::Kernel, 2>());
  std::string err;
  if (fo_jax::LoadAllGemmKernels(&err) != cudaSuccess) {
    std::printf("%s\n", err.c_str());
    return 2;
  }
  Lt lt;
  const bool have_lt = lt.Load();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  uint32_t* counters;
  CK(cudaMalloc(&counters, 64 * sizeof(uint32_t)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const std::string& sh : shapes) {
    int m, n, k;
    if (std::sscanf(sh.c_str(), "%dx%dx%d", &m, &n, &k) != 3) continue;
    uint16_t *a, *b, *d;
    CK(cudaMalloc(&a, size_t(m) * k * 2));
    CK(cudaMalloc(&b, size_t(k) * n * 2));
    CK(cudaMalloc(&d, size_t(m) * n * 2));
    FillRandom<<<1024, 256, 0, s>>>(a, size_t(m) * k, 1, 1);
    FillRandom<<<1024, 256, 0, s>>>(b, size_t(k) * n, 2, 1);
    std::vector<Runner> rs;
    for (int cfg = 0; cfg < fo_jax::NumGemmConfigs(); ++cfg) {
      fo_jax::SignalingGemmArgs g;
      g.dtype = fo_jax::GemmDtype::kBF16;
      g.m = m; g.n = n; g.k = k; g.a = a; g.b = b; g.d = d;
      g.config = cfg;
      g.num_groups = 1;
      g.group_begin[0] = 0;
      const int tile_m = fo_jax::GetGemmConfig(cfg).tile_m;
      g.group_begin[1] = (m + tile_m - 1) / tile_m;
      // One group without counters (fo_jax.matmul) and 8 groups with counters (the overlap's
      // producer; counters zeroed by the launcher).
      const int tiles_m = g.group_begin[1];
      for (int groups : {1, 8}) {
        if (groups > tiles_m) continue;
        fo_jax::SignalingGemmArgs gg = g;
        gg.num_groups = groups;
        for (int i = 0; i <= groups; ++i) gg.group_begin[i] = int(int64_t(tiles_m) * i / groups);
        gg.counters = groups > 1 ? counters : nullptr;
        gg.zero_counters_on_launch = groups > 1;
        rs.push_back({std::string("fo_jax ") + fo_jax::GetGemmConfig(cfg).name +
                          (groups > 1 ? " 8g+sig" : ""),
                      [gg](cudaStream_t st) {
                        std::string e;
                        return fo_jax::LaunchSignalingGemm(st, gg, &e) == cudaSuccess;
                      }, {}});
      }
    }
    const Problem prob{m, n, k, a, b, d, sms, ws, ws_bytes};
    using RM = cutlass::layout::RowMajor;
    rs.push_back(MakeStock<Stock<RM, 128, 256, 1, false>>("stock NN coop 128x256 c1", prob));
    rs.push_back(MakeStock<Stock<RM, 128, 256, 2, false>>("stock NN coop 128x256 c2", prob));
    rs.push_back(MakeStock<Stock<RM, 256, 128, 2, false>>("stock NN coop 256x128 c2", prob));
    rs.push_back(MakeStock<Stock<RM, 128, 128, 1, true>>("stock NN pingpong 128x128 c1", prob));
    rs.push_back(MakeStock<Stock<RM, 128, 128, 2, true>>("stock NN pingpong 128x128 c2", prob));
    rs.push_back(MakeStock<Stock<RM, 128, 160, 2, true>>("stock NN pingpong 128x160 c2", prob));
    rs.push_back(MakeStock<Stock<RM, 128, 192, 2, true>>("stock NN pingpong 128x192 c2", prob));
    // The transposed product, tile N x M: the control (fo_jax's ping-pong 128x128, transposed),
    // cuBLASLt's pick at N = 1280 and 5120 with M = 2048 (128x160 with a 2x1 cluster along N)
    // and the same without the cluster, 128x96, and cooperative tiles 256 long along N (near
    // cuBLASLt's 256x96 and 320x128 at N = 1280-1536).
    rs.push_back(MakeStock<StockT<128, 128, 1, true>>("stock T pingpong 128x128 c1", prob));
    rs.push_back(MakeStock<StockT<128, 160, 2, true>>("stock T pingpong 128x160 c2", prob));
    rs.push_back(MakeStock<StockT<128, 160, 1, true>>("stock T pingpong 128x160 c1", prob));
    rs.push_back(MakeStock<StockT<128, 96, 2, true>>("stock T pingpong 128x96 c2", prob));
    rs.push_back(MakeStock<StockT<256, 128, 1, false>>("stock T coop 256x128 c1", prob));
    rs.push_back(MakeStock<StockT<256, 160, 1, false>>("stock T coop 256x160 c1", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, true, 0>>(
        "hyb pp128 c1 groupsched+stockepi", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, false, 1>>(
        "hyb pp128 c1 stocksched+ourepi", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, false, 0>>(
        "hyb pp128 c1 stocksched+stockepi", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, false, 2>>(
        "hyb pp128 c1 stocksched+ourepi plain store", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, true, 2>>(
        "hyb pp128 c1 groupsched+ourepi plain store", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, false, 3>>(
        "hyb pp128 c1 stocksched+ourepi plain store()", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, false, 4>>(
        "hyb pp128 c1 stocksched+ourepi plain store_tail()", prob));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, true, 0>>(
        "hyb pp128 c1 groupsched(swz 1)+stockepi", prob, 1));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, true, 0>>(
        "hyb pp128 c1 groupsched(swz all)+stockepi", prob, 1 << 20));
    rs.push_back(MakeHybrid<Hybrid<128, 128, 1, true, 0>>(
        "hyb pp128 c1 groupsched(stock order)+stockepi", prob, 0));
    rs.push_back(MakeHybrid<H11>("hyb pp128 c1 ours, plain launch", prob));
    rs.push_back(MakeHybrid<H12>("hyb pp128 c2 ours, adapter", prob));
    if (have_lt) {
      for (Runner& r : MakeLt(lt, m, n, k, a, b, d, ws, ws_bytes)) rs.push_back(std::move(r));
    }
    // Every method must compute x @ w: each writes into d once, compared with fo_jax's first
    // configuration's result (NaN or more than 2% of the largest value: not timed).
    {
      uint16_t* want;
      unsigned* words;
      CK(cudaMalloc(&want, size_t(m) * n * 2));
      CK(cudaMalloc(&words, 2 * sizeof(unsigned)));
      CK(cudaMemsetAsync(d, 0xff, size_t(m) * n * 2, s));
      const bool have_want = rs.front().run(s);  // NaN where it cannot run: nothing passes
      CK(cudaMemcpyAsync(want, d, size_t(m) * n * 2, cudaMemcpyDeviceToDevice, s));
      for (Runner& r : rs) {
        if (&r == &rs.front()) continue;
        CK(cudaMemsetAsync(d, 0xff, size_t(m) * n * 2, s));  // NaN: unwritten elements show
        CK(cudaMemsetAsync(words, 0, 2 * sizeof(unsigned), s));
        if (!r.run(s)) continue;
        MaxAbs<<<264, 256, 0, s>>>(d, want, size_t(m) * n, words, words + 1);
        unsigned host[2];
        CK(cudaMemcpyAsync(host, words, sizeof(host), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        float diff, ref;
        std::memcpy(&diff, &host[0], sizeof(float));
        std::memcpy(&ref, &host[1], sizeof(float));
        if (!have_want || !(diff <= 0.02f * ref)) {
          std::printf("  %-32s wrong result (max |diff| %g, max |ref| %g%s): not timed\n",
                      r.name.c_str(), diff, ref, have_want ? "" : ", no reference");
          r.run = [](cudaStream_t) { return false; };
        }
      }
      CK(cudaFree(want));
      CK(cudaFree(words));
    }
    for (int round = 0; round < 35; ++round) {
      for (Runner& r : rs) {
        SleepNs<<<1, 1, 0, s>>>(50000);  // fo_jax's launcher builds its parameters per launch
        const float ms = EventTimedMs(s, e0, e1, [&] { return r.run(s); });
        if (ms < 0) { r.ms.clear(); continue; }
        if (round >= 5) r.ms.push_back(ms);
      }
    }
    const double flop = 2.0 * m * n * k;
    std::printf("\n%s\n", sh.c_str());
    for (Runner& r : rs) {
      if (r.ms.empty()) { std::printf("  %-32s cannot run\n", r.name.c_str()); continue; }
      const float med = Median(r.ms);
      std::printf("  %-32s %8.4f ms %7.1f TFLOP/s\n", r.name.c_str(), med, flop / med / 1e9);
    }
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(d));
  }
  return 0;
}
