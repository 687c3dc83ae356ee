// Feasibility probe (not part of the library): can a reduce-scatter whose data moves on the copy
// engines (NCCL's zero-CTA all-to-all on symmetric windows, NCCL >= 2.28) plus a small local
// reduction kernel run next to the signaling GEMM without taking its SMs, and how fast is the
// counter-gated pipeline built from it compared with the per-group ncclReduceScatter pipeline
// fo_jax runs today? One process drives every visible GPU; times are host wall clock over
// back-to-back iterations (all GPUs synchronized before and after), median of 5 x 20.
//
// Build: dev/README.md (target ce_rs_probe, or dev/lease/gpu_run.sh ce-probe on a lent machine).
// Run: probe [M N K [--check-only]]   (per-GPU x[M,K] @ w[K,N]; default 8192 8192 2048)
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/stream_wait.h"
#include "rs_probe_common.cuh"

struct Dev {
  cudaStream_t gemm_s, comm_s, red_s;
  ncclComm_t zero = nullptr, dflt = nullptr;
  Bf16 *a, *b, *send, *recv, *out, *out_ref;
  ncclWindow_t wsend, wrecv;
  uint32_t* ctr;
  cudaEvent_t ready, done;
  cudaEvent_t a2a_done[64];
};

int main(int argc, char** argv) {
  int M = 8192, N = 8192, K = 2048;
  if (argc >= 4) { M = std::atoi(argv[1]); N = std::atoi(argv[2]); K = std::atoi(argv[3]); }
  const bool check_only = argc >= 5 && std::string(argv[4]) == "--check-only";
  int P = 0;
  CK(cudaGetDeviceCount(&P));
  int nccl_version = 0;
  NK(ncclGetVersion(&nccl_version));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int m = M / P;  // rows each rank receives
  std::printf("ce_rs_probe: %d x %s (%d SMs), NCCL %d, per-GPU x[%d,%d] @ w[%d,%d] bf16, "
              "reduce-scatter over %d GPUs\n", P, prop.name, sms, nccl_version, M, K, K, N, P);
  if (M % (P * 8) != 0 || N % 8 != 0 || K % 8 != 0) { std::printf("bad shape\n"); return 2; }

  std::vector<Dev> dev(P);
  ncclUniqueId id_zero, id_dflt;
  NK(ncclGetUniqueId(&id_zero));
  NK(ncclGetUniqueId(&id_dflt));
  const size_t full = size_t(M) * N, band = size_t(m) * N;
  for (int d = 0; d < P; ++d) {
    CK(cudaSetDevice(d));
    PrepareGpuOrExit(d, M, N, K, &dev[d].a, &dev[d].b);
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithFlags(&dev[d].gemm_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&dev[d].comm_s, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&dev[d].red_s, cudaStreamNonBlocking, hi));
    for (auto& e : dev[d].a2a_done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&dev[d].ready, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&dev[d].done, cudaEventDisableTiming));
    CK(cudaMalloc(&dev[d].out, band * 2));
    CK(cudaMalloc(&dev[d].out_ref, band * 2));
    CK(cudaMalloc(&dev[d].ctr, 64 * 4));
    NK(ncclMemAlloc(reinterpret_cast<void**>(&dev[d].send), full * 2));
    NK(ncclMemAlloc(reinterpret_cast<void**>(&dev[d].recv), full * 2));
    CK(cudaDeviceSynchronize());
  }
  ncclConfig_t cz = NCCL_CONFIG_INITIALIZER;
  cz.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  InitCommsOrExit(P, id_zero, cz, [&](int d) { return &dev[d].zero; });
  InitCommsOrExit(P, id_dflt, FoJaxCommConfig(), [&](int d) { return &dev[d].dflt; });
  NK(ncclGroupStart());
  for (int d = 0; d < P; ++d) {
    CK(cudaSetDevice(d));
    NK(ncclCommWindowRegister(dev[d].zero, dev[d].send, full * 2, &dev[d].wsend,
                              NCCL_WIN_COLL_SYMMETRIC));
    NK(ncclCommWindowRegister(dev[d].zero, dev[d].recv, full * 2, &dev[d].wrecv,
                              NCCL_WIN_COLL_SYMMETRIC));
  }
  NK(ncclGroupEnd());

  const RsGemm<Dev> rs_gemm{dev, m, N, K, P};
  // The P received bands of `count` elements each, contiguous from `in`.
  auto bands = [&](const Bf16* in, size_t count) {
    std::vector<const void*> parts;
    for (int q = 0; q < P; ++q) parts.push_back(in + q * count);
    return parts;
  };
  auto nccl_rs_full = [&] {
    NK(ncclGroupStart());
    for (int d = 0; d < P; ++d)
      NK(ncclReduceScatter(dev[d].send, dev[d].out_ref, band, ncclBfloat16, ncclSum, dev[d].dflt,
                           dev[d].comm_s));
    NK(ncclGroupEnd());
  };
  auto a2a_full = [&] {
    NK(ncclGroupStart());
    for (int d = 0; d < P; ++d)
      NK(ncclAlltoAll(dev[d].send, dev[d].recv, band, ncclBfloat16, dev[d].zero, dev[d].comm_s));
    NK(ncclGroupEnd());
  };
  auto reduce_full = [&](int grid) {
    return [&, grid] {
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        BandSumOrExit(dev[d].comm_s, bands(dev[d].recv, band), dev[d].out, band, grid);
      }
    };
  };
  // GEMM (all SMs, no counters) on one stream and the full all-to-all on the other, unordered.
  Timeline* tl = nullptr;  // set: record device 0's timeline of the next call
  auto gemm_and_a2a = [&] {
    for (int d = 0; d < P; ++d) {
      CK(cudaSetDevice(d));
      if (tl && d == 0) { tl->Mark("start", dev[0].gemm_s); CK(cudaStreamWaitEvent(dev[0].comm_s, tl->marks[0].second, 0)); }
      rs_gemm.Launch(d, rs_gemm.Args(d, 1, 0, false));
      if (tl && d == 0) tl->Mark("gemm_end", dev[0].gemm_s);
    }
    a2a_full();
    if (tl) { CK(cudaSetDevice(0)); tl->Mark("a2a_end", dev[0].comm_s); }
  };
  // The counter-gated pipeline: GEMM with counters on gemm_s; on comm_s per group wait, then
  // either the CE all-to-all (ce = true; the band sum of the group then runs on red_s once that
  // all-to-all is done, so a reduction waiting for SMs never holds up the next group's copies)
  // or ncclReduceScatter (fo_jax today).
  auto pipeline = [&](int groups, int sm_budget, bool ce, int reduce_grid) {
    return [&, groups, sm_budget, ce, reduce_grid] {
      std::vector<fo_jax::SignalingGemmArgs> args(P);
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        args[d] = rs_gemm.Args(d, groups, sm_budget, true);
        if (tl && d == 0) tl->Mark("start", dev[0].gemm_s);
        rs_gemm.Launch(d, args[d]);
        if (tl && d == 0) tl->Mark("gemm_end", dev[0].gemm_s);
        CK(cudaStreamWaitEvent(dev[d].comm_s, dev[d].ready, 0));
      }
      const int tm = fo_jax::GetGemmConfig(args[0].config).tile_m;
      for (int g = 0; g < groups; ++g) {
        const size_t r0 = std::min(args[0].group_begin[g] * tm, m);
        const size_t r1 = std::min(args[0].group_begin[g + 1] * tm, m);
        const size_t cnt = (r1 - r0) * N;
        for (int d = 0; d < P; ++d) {
          CK(cudaSetDevice(d));
          std::string err;
          CK(ProbeStatus(fo_jax::EnqueueWaitGeq(dev[d].comm_s, dev[d].ctr + g,
                                                uint32_t(fo_jax::ExpectedGroupCount(args[d], g))),
                         &err));
          if (tl && d == 0) tl->Mark("ready" + std::to_string(g), dev[0].comm_s);
        }
        NK(ncclGroupStart());
        for (int d = 0; d < P; ++d) {
          if (ce) {
            NK(ncclAlltoAll(dev[d].send + P * r0 * N, dev[d].recv + P * r0 * N, cnt, ncclBfloat16,
                            dev[d].zero, dev[d].comm_s));
          } else {
            NK(ncclReduceScatter(dev[d].send + P * r0 * N, dev[d].out + r0 * N, cnt, ncclBfloat16,
                                 ncclSum, dev[d].dflt, dev[d].comm_s));
          }
        }
        NK(ncclGroupEnd());
        if (tl) { CK(cudaSetDevice(0)); tl->Mark((ce ? "a2a" : "rs") + std::to_string(g), dev[0].comm_s); }
        if (ce) {
          for (int d = 0; d < P; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaEventRecord(dev[d].a2a_done[g], dev[d].comm_s));
            CK(cudaStreamWaitEvent(dev[d].red_s, dev[d].a2a_done[g], 0));
            BandSumOrExit(dev[d].red_s, bands(dev[d].recv + P * r0 * N, cnt), dev[d].out + r0 * N,
                          cnt, reduce_grid);
            if (tl && d == 0) tl->Mark("sum" + std::to_string(g), dev[0].red_s);
          }
        }
      }
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        cudaStream_t last = ce ? dev[d].red_s : dev[d].comm_s;
        CK(cudaEventRecord(dev[d].done, last));
        CK(cudaStreamWaitEvent(dev[d].gemm_s, dev[d].done, 0));
        if (ce) {  // the next call's copies must not overtake this call's reductions
          CK(cudaStreamWaitEvent(dev[d].comm_s, dev[d].done, 0));
        }
      }
    };
  };

  // Correctness: reference = one GEMM, then one ncclReduceScatter; each pipeline's out vs it.
  rs_gemm.Alone(0)();
  SyncAll(P);
  for (int d = 0; d < P; ++d) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(dev[d].gemm_s)); }
  nccl_rs_full();
  SyncAll(P);
  auto check = [&](const char* what) { CheckAll(dev, band, what); };
  for (int d = 0; d < P; ++d) { CK(cudaSetDevice(d)); CK(cudaMemset(dev[d].out, 0xff, band * 2)); }
  pipeline(4, 0, true, 2 * sms)();
  SyncAll(P);
  check("CE pipeline, 4 groups");
  for (int d = 0; d < P; ++d) { CK(cudaSetDevice(d)); CK(cudaMemset(dev[d].out, 0xff, band * 2)); }
  pipeline(4, 100, false, 0)();
  SyncAll(P);
  check("NCCL reduce-scatter pipeline, 4 groups");

  if (check_only) return 0;
  auto add = [&](const std::string& name, const std::function<void()>& op) {
    std::printf("  %-60s %8.3f ms\n", name.c_str(), TimeMs(P, op));
    if (name.find("pipeline") != std::string::npos || name.find("||") != std::string::npos) {
      Timeline t;
      tl = &t;
      op();
      tl = nullptr;
      SyncAll(P);
      t.Print();
    }
    std::fflush(stdout);
  };
  add("gemm alone, all SMs", rs_gemm.Alone(0));
  add("gemm alone, 116 SMs", rs_gemm.Alone(116));
  add("gemm alone, 100 SMs", rs_gemm.Alone(100));
  add("ncclReduceScatter alone (maxCTAs 32)", nccl_rs_full);
  add("CE all-to-all alone (CTA policy zero)", a2a_full);
  add("band sum alone, 2 CTAs/SM", reduce_full(2 * sms));
  add("band sum alone, 16 CTAs", reduce_full(16));
  add("CE all-to-all then band sum (CE reduce-scatter)", [&] { a2a_full(); reduce_full(2 * sms)(); });
  add("gemm (all SMs) || CE all-to-all, unordered", gemm_and_a2a);
  for (int groups : {4, 8}) {
    for (int budget : {0, 124, 116}) {
      for (int grid : {2 * sms}) {
        add("CE pipeline: " + std::to_string(groups) + " groups, GEMM SMs " +
                std::to_string(budget ? budget : sms) + ", band sum grid " + std::to_string(grid),
            pipeline(groups, budget, true, grid));
      }
    }
  }
  add("NCCL RS pipeline (fo_jax today): 4 groups, GEMM SMs 100", pipeline(4, 100, false, 0));
  add("NCCL RS pipeline: 8 groups, GEMM SMs 116", pipeline(8, 116, false, 0));
  // Communicators and windows are left to process exit (a probe, not a library).
  return 0;
}
