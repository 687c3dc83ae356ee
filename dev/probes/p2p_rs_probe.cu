// Feasibility probe (not part of the library): a reduce-scatter whose bytes move as copy-engine
// writes straight into the peers' memory (cudaMemcpyAsync to a peer pointer), gated and signalled
// with stream memory operations only (cuStreamWaitValue32 / cuStreamWriteValue32), so that no
// step of the transport needs an SM while the signaling GEMM holds them. Only the final sum of
// the P received bands is a kernel. This is the transport of PyTorch's AsyncTP, rebuilt on
// fo_jax's signaling GEMM; ce_rs_probe.cu measured NCCL's own copy-engine all-to-all, which does
// not progress next to a GEMM on every SM (docs/performance.md, 'Copy engine instead of NCCL').
//
// Per call (epoch e = 1, 2, ...) on each GPU d:
//   gemm_s:   zero counters, signaling GEMM in the reduce-scatter layout (batch = P bands).
//   cp_s[q]:  (one stream per peer q) wait ack_d[q] >= e - 1 (q finished reading its receive
//             buffer in the previous call), then per group g: wait counter[g] full, copy d's band
//             for q of group g into q's receive buffer at slot d, write flag_q[g][d] = e
//             (cuStreamWriteValue32 fences the copy's writes before the flag: "similar semantics
//             to __threadfence_system()" per the driver documentation).
//   red_s:    per group g: wait counter[g] full and flag_d[g][q] >= e for every peer q, then
//             out rows of group g = own band + the P - 1 received bands (fp32 sum, bf16 out).
//             After the last group: write ack_q[d] = e on every peer q.
//   join:     gemm_s waits for red_s and every cp_s (the next GEMM overwrites the send buffer).
// One process drives every visible GPU (peer access enabled between all pairs). Times: host wall
// clock over back-to-back calls, all GPUs synchronized before and after, median of 5 x 20.
//
// Build: dev/README.md (target p2p_rs_probe, or dev/lease/gpu_run.sh p2p-probe on a lent machine).   Run: probe [M N K [--check-only]]  (per GPU x[M,K] @ w[K,N], bf16)
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/stream_wait.h"
#include "rs_probe_common.cuh"

constexpr int kMaxP = 8;
constexpr int kMaxGroups = 16;

// The library's stream memory operations (comm/stream_wait.h), exiting on failure.
void WriteFlag(cudaStream_t s, uint32_t* addr, uint32_t value) {
  std::string err;
  if (ProbeStatus(fo_jax::EnqueueWriteValue(s, addr, value), &err) != cudaSuccess) {
    std::printf("write: %s\n", err.c_str());
    std::exit(2);
  }
}

void WaitGeq(cudaStream_t s, const uint32_t* addr, uint32_t value) {
  std::string err;
  if (ProbeStatus(fo_jax::EnqueueWaitGeq(s, addr, value), &err) != cudaSuccess) {
    std::printf("wait: %s\n", err.c_str());
    std::exit(2);
  }
}

struct Dev {
  cudaStream_t gemm_s, red_s, nccl_s;
  cudaStream_t cp_s[kMaxP];
  ncclComm_t comm = nullptr;
  Bf16 *a, *b, *send, *recv, *out, *out_ref;
  uint32_t* ctr;    // GEMM group counters
  uint32_t* flags;  // [kMaxGroups][kMaxP]: flags[g * kMaxP + q] = epoch of q's group-g copy here
  uint32_t* ack;    // [kMaxP]: ack[q] = last epoch in which q finished reading its receive buffer
  cudaEvent_t ready, done, cp_done[kMaxP];
};

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout kill through a pipe
  int M = 8192, N = 8192, K = 2048;
  if (argc >= 4) { M = std::atoi(argv[1]); N = std::atoi(argv[2]); K = std::atoi(argv[3]); }
  const bool check_only = argc >= 5 && std::string(argv[4]) == "--check-only";
  int P = 0;
  CK(cudaGetDeviceCount(&P));
  if (P < 2 || P > kMaxP) { std::printf("needs 2..%d GPUs\n", kMaxP); return 2; }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int m = M / P;
  int nccl_version = 0;
  NK(ncclGetVersion(&nccl_version));
  std::printf("p2p_rs_probe: %d x %s (%d SMs), NCCL %d, per-GPU x[%d,%d] @ w[%d,%d] bf16, "
              "reduce-scatter over %d GPUs\n", P, prop.name, sms, nccl_version, M, K, K, N, P);
  if (M % (P * 8) != 0 || N % 8 != 0 || K % 8 != 0) { std::printf("bad shape\n"); return 2; }
  std::vector<Dev> dev(P);
  ncclUniqueId id;
  NK(ncclGetUniqueId(&id));
  const size_t full = size_t(M) * N, band = size_t(m) * N;
  for (int d = 0; d < P; ++d) {
    CK(cudaSetDevice(d));
    for (int q = 0; q < P; ++q) {
      if (q == d) continue;
      int can = 0;
      CK(cudaDeviceCanAccessPeer(&can, d, q));
      if (!can) { std::printf("GPU %d cannot access GPU %d\n", d, q); return 2; }
      cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError(); else CK(e);
    }
    PrepareGpuOrExit(d, M, N, K, &dev[d].a, &dev[d].b);
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithFlags(&dev[d].gemm_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&dev[d].red_s, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&dev[d].nccl_s, cudaStreamNonBlocking, hi));
    for (int q = 0; q < P; ++q) {
      CK(cudaStreamCreateWithPriority(&dev[d].cp_s[q], cudaStreamNonBlocking, hi));
      CK(cudaEventCreateWithFlags(&dev[d].cp_done[q], cudaEventDisableTiming));
    }
    CK(cudaEventCreateWithFlags(&dev[d].ready, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&dev[d].done, cudaEventDisableTiming));
    CK(cudaMalloc(&dev[d].send, full * 2));
    CK(cudaMalloc(&dev[d].recv, full * 2));
    CK(cudaMalloc(&dev[d].out, band * 2));
    CK(cudaMalloc(&dev[d].out_ref, band * 2));
    CK(cudaMalloc(&dev[d].ctr, 64 * 4));
    CK(cudaMalloc(&dev[d].flags, kMaxGroups * kMaxP * 4));
    CK(cudaMalloc(&dev[d].ack, kMaxP * 4));
    CK(cudaMemset(dev[d].flags, 0, kMaxGroups * kMaxP * 4));
    CK(cudaMemset(dev[d].ack, 0, kMaxP * 4));
    CK(cudaDeviceSynchronize());
  }
  InitCommsOrExit(P, id, FoJaxCommConfig(), [&](int d) { return &dev[d].comm; });

  const RsGemm<Dev> rs_gemm{dev, m, N, K, P};
  auto nccl_rs_full = [&] {
    NK(ncclGroupStart());
    for (int d = 0; d < P; ++d)
      NK(ncclReduceScatter(dev[d].send, dev[d].out_ref, band, ncclBfloat16, ncclSum, dev[d].comm,
                           dev[d].nccl_s));
    NK(ncclGroupEnd());
  };

  uint32_t epoch = 0;
  Timeline* tl = nullptr;
  // The direct pipeline. gemm = false: the transport alone on the send buffer as it is (no
  // GEMM, no counter waits), to measure the copy engines' rate. one_stream: every peer's copies
  // on cp_s[0] (one copy queue) instead of one stream per peer.
  auto direct = [&](int groups, int sm_budget, int sum_grid, bool gemm, bool one_stream) {
    return [&, groups, sm_budget, sum_grid, gemm, one_stream] {
      const uint32_t e = ++epoch;
      std::vector<fo_jax::SignalingGemmArgs> args(P);
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        args[d] = rs_gemm.Args(d, groups, sm_budget, gemm);
        if (tl && d == 0) tl->Mark("start", dev[0].gemm_s);
        if (gemm) {
          rs_gemm.Launch(d, args[d]);
        } else {
          CK(cudaEventRecord(dev[d].ready, dev[d].gemm_s));
        }
        if (tl && d == 0) tl->Mark("gemm_end", dev[0].gemm_s);
        CK(cudaStreamWaitEvent(dev[d].red_s, dev[d].ready, 0));
        for (int q = 0; q < P; ++q) {
          if (q == d) continue;
          cudaStream_t s = dev[d].cp_s[one_stream ? 0 : q];
          CK(cudaStreamWaitEvent(s, dev[d].ready, 0));
          WaitGeq(s, dev[d].ack + q, e - 1);
        }
      }
      const int tm = fo_jax::GetGemmConfig(args[0].config).tile_m;
      for (int g = 0; g < groups; ++g) {
        const size_t r0 = std::min(args[0].group_begin[g] * tm, m);
        const size_t r1 = std::min(args[0].group_begin[g + 1] * tm, m);
        const size_t cnt = (r1 - r0) * N;
        for (int d = 0; d < P; ++d) {
          CK(cudaSetDevice(d));
          const uint32_t expect = uint32_t(fo_jax::ExpectedGroupCount(args[d], g));
          const Bf16* mine = dev[d].send + P * r0 * N;  // [band for 0 | band for 1 | ...]
          for (int k = 1; k < P; ++k) {  // peers in a rotated order: not all GPUs hit one at once
            const int q = (d + k) % P;
            cudaStream_t s = dev[d].cp_s[one_stream ? 0 : q];
            if (gemm && (!one_stream || k == 1)) WaitGeq(s, dev[d].ctr + g, expect);
            CK(cudaMemcpyAsync(dev[q].recv + P * r0 * N + d * cnt, mine + q * cnt, cnt * 2,
                               cudaMemcpyDeviceToDevice, s));
            WriteFlag(s, dev[q].flags + g * kMaxP + d, e);
          }
          if (gemm) WaitGeq(dev[d].red_s, dev[d].ctr + g, expect);
          std::vector<const void*> parts;
          for (int q = 0; q < P; ++q) {
            if (q == d) {
              parts.push_back(mine + d * cnt);
            } else {
              WaitGeq(dev[d].red_s, dev[d].flags + g * kMaxP + q, e);
              parts.push_back(dev[d].recv + P * r0 * N + q * cnt);
            }
          }
          if (tl && d == 0) tl->Mark("arrived" + std::to_string(g), dev[0].red_s);
          BandSumOrExit(dev[d].red_s, parts, dev[d].out + r0 * N, cnt, sum_grid);
          if (tl && d == 0) tl->Mark("sum" + std::to_string(g), dev[0].red_s);
        }
      }
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        for (int q = 0; q < P; ++q)
          if (q != d) WriteFlag(dev[d].red_s, dev[q].ack + d, e);
        CK(cudaEventRecord(dev[d].done, dev[d].red_s));
        CK(cudaStreamWaitEvent(dev[d].gemm_s, dev[d].done, 0));
        for (int q = 0; q < P; ++q) {
          if (q == d || (one_stream && q != 0)) continue;
          CK(cudaEventRecord(dev[d].cp_done[q], dev[d].cp_s[q]));
          CK(cudaStreamWaitEvent(dev[d].gemm_s, dev[d].cp_done[q], 0));
        }
      }
    };
  };
  // fo_jax today: per group wait, then ncclReduceScatter (on nccl_s).
  auto nccl_pipeline = [&](int groups, int sm_budget) {
    return [&, groups, sm_budget] {
      std::vector<fo_jax::SignalingGemmArgs> args(P);
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        args[d] = rs_gemm.Args(d, groups, sm_budget, true);
        rs_gemm.Launch(d, args[d]);
        CK(cudaStreamWaitEvent(dev[d].nccl_s, dev[d].ready, 0));
      }
      const int tm = fo_jax::GetGemmConfig(args[0].config).tile_m;
      for (int g = 0; g < groups; ++g) {
        const size_t r0 = std::min(args[0].group_begin[g] * tm, m);
        const size_t r1 = std::min(args[0].group_begin[g + 1] * tm, m);
        for (int d = 0; d < P; ++d) {
          CK(cudaSetDevice(d));
          WaitGeq(dev[d].nccl_s, dev[d].ctr + g, uint32_t(fo_jax::ExpectedGroupCount(args[d], g)));
        }
        NK(ncclGroupStart());
        for (int d = 0; d < P; ++d)
          NK(ncclReduceScatter(dev[d].send + P * r0 * N, dev[d].out + r0 * N, (r1 - r0) * N,
                               ncclBfloat16, ncclSum, dev[d].comm, dev[d].nccl_s));
        NK(ncclGroupEnd());
      }
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaEventRecord(dev[d].done, dev[d].nccl_s));
        CK(cudaStreamWaitEvent(dev[d].gemm_s, dev[d].done, 0));
      }
    };
  };

  // Destination-major order (AsyncTP's): one GEMM over all M rows (batch 1) whose row bands are
  // taken in the order "for rank d+1, d+2, ..., d+P-1, then d's own" (in this probe the rotation
  // is a relabelling of random A rows; the library would visit the bands in that order). Step j
  // sends band j to rank (d+1+j) % P as soon as its groups are done and receives the matching
  // band from rank (d-1-j) % P: a permutation per step, one peer per GPU. The last band is d's
  // own and needs no communication, so no collective tail follows the GEMM; only the local sum
  // of the P bands does. Transport: ncclSend/ncclRecv (plain NCCL) or a copy-engine write to the
  // peer (as `direct`). `sub` groups per band.
  auto dm_args = [&](int d, int sub, int sm_budget) {
    fo_jax::SignalingGemmArgs g;
    g.dtype = fo_jax::GemmDtype::kBF16;
    g.m = M; g.n = N; g.k = K; g.batch = 1;
    g.a = dev[d].a; g.b = dev[d].b; g.d = dev[d].send;
    g.sm_budget = sm_budget;
    g.config = fo_jax::SelectGemmConfig(g.dtype, M, N, K, 1, sm_budget);
    const int tm = fo_jax::GetGemmConfig(g.config).tile_m;
    const int tiles_band = m / tm;  // m % tm == 0 for the shapes used here (checked below)
    g.num_groups = P * sub;
    for (int i = 0; i <= P * sub; ++i)
      g.group_begin[i] = (i / sub) * tiles_band + int(int64_t(tiles_band) * (i % sub) / sub);
    g.counters = dev[d].ctr;
    g.zero_counters_on_launch = true;
    g.after_zero_event = dev[d].ready;
    return g;
  };
  auto dm = [&](int sub, int sm_budget, bool ce) {
    return [&, sub, sm_budget, ce] {
      const uint32_t e = ++epoch;
      std::vector<fo_jax::SignalingGemmArgs> args(P);
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        args[d] = dm_args(d, sub, sm_budget);
        if (tl && d == 0) tl->Mark("start", dev[0].gemm_s);
        rs_gemm.Launch(d, args[d]);
        if (tl && d == 0) tl->Mark("gemm_end", dev[0].gemm_s);
        cudaStream_t s = ce ? dev[d].cp_s[0] : dev[d].nccl_s;
        CK(cudaStreamWaitEvent(s, dev[d].ready, 0));
        CK(cudaStreamWaitEvent(dev[d].red_s, dev[d].ready, 0));
        if (ce)
          for (int q = 0; q < P; ++q)
            if (q != d) WaitGeq(s, dev[d].ack + q, e - 1);
      }
      for (int j = 0; j + 1 < P; ++j) {
        for (int d = 0; d < P; ++d) {
          CK(cudaSetDevice(d));
          cudaStream_t s = ce ? dev[d].cp_s[0] : dev[d].nccl_s;
          for (int g = j * sub; g < (j + 1) * sub; ++g)
            WaitGeq(s, dev[d].ctr + g, uint32_t(fo_jax::ExpectedGroupCount(args[d], g)));
          if (ce) {
            const int to = (d + 1 + j) % P;
            CK(cudaMemcpyAsync(dev[to].recv + j * band, dev[d].send + j * band, band * 2,
                               cudaMemcpyDeviceToDevice, s));
            WriteFlag(s, dev[to].flags + j * kMaxP, e);
          }
        }
        if (!ce) {
          NK(ncclGroupStart());
          for (int d = 0; d < P; ++d) {
            NK(ncclSend(dev[d].send + j * band, band, ncclBfloat16, (d + 1 + j) % P, dev[d].comm,
                        dev[d].nccl_s));
            NK(ncclRecv(dev[d].recv + j * band, band, ncclBfloat16, (d - 1 - j + P) % P,
                        dev[d].comm, dev[d].nccl_s));
          }
          NK(ncclGroupEnd());
        }
        if (tl) { CK(cudaSetDevice(0)); tl->Mark("step" + std::to_string(j), ce ? dev[0].cp_s[0] : dev[0].nccl_s); }
      }
      for (int d = 0; d < P; ++d) {
        CK(cudaSetDevice(d));
        cudaStream_t s = ce ? dev[d].cp_s[0] : dev[d].nccl_s;
        // recv + j * band holds the band rank (d-1-j) % P computed for d; send + (P-1) * band is d's own.
        std::vector<const void*> parts{dev[d].send + (P - 1) * band};
        for (int j = 0; j + 1 < P; ++j) parts.push_back(dev[d].recv + j * band);
        for (int g = (P - 1) * sub; g < P * sub; ++g)
          WaitGeq(dev[d].red_s, dev[d].ctr + g, uint32_t(fo_jax::ExpectedGroupCount(args[d], g)));
        if (ce) {
          for (int j = 0; j + 1 < P; ++j) WaitGeq(dev[d].red_s, dev[d].flags + j * kMaxP, e);
        } else {
          CK(cudaEventRecord(dev[d].cp_done[0], s));
          CK(cudaStreamWaitEvent(dev[d].red_s, dev[d].cp_done[0], 0));
        }
        BandSumOrExit(dev[d].red_s, parts, dev[d].out, band);
        if (tl && d == 0) tl->Mark("sum", dev[0].red_s);
        // Acknowledge in both transports: the epochs are shared with the copy-engine pipelines,
        // whose senders wait for ack >= e - 1.
        for (int q = 0; q < P; ++q)
          if (q != d) WriteFlag(dev[d].red_s, dev[q].ack + d, e);
        CK(cudaEventRecord(dev[d].done, dev[d].red_s));
        CK(cudaStreamWaitEvent(dev[d].gemm_s, dev[d].done, 0));
        CK(cudaEventRecord(dev[d].cp_done[1 % P], s));
        CK(cudaStreamWaitEvent(dev[d].gemm_s, dev[d].cp_done[1 % P], 0));
      }
    };
  };

  // Reference: one GEMM, then one ncclReduceScatter of the whole send buffer.
  rs_gemm.Alone(0)();
  SyncAll(P);
  nccl_rs_full();
  SyncAll(P);
  auto check = [&](const std::string& what, const std::function<void()>& op, int calls) {
    for (int d = 0; d < P; ++d) { CK(cudaSetDevice(d)); CK(cudaMemset(dev[d].out, 0xff, band * 2)); }
    SyncAll(P);
    for (int i = 0; i < calls; ++i) op();
    SyncAll(P);
    return CheckAll(dev, band, what);
  };
  bool ok = check("direct pipeline, 4 groups, 1 call", direct(4, 0, 2 * sms, true, false), 1);
  ok &= check("direct pipeline, 8 groups, 116 SMs, 50 calls", direct(8, 116, 16, true, false), 50);
  ok &= check("direct pipeline, 4 groups, one copy stream", direct(4, 0, 2 * sms, true, true), 1);
  ok &= check("NCCL reduce-scatter pipeline, 4 groups", nccl_pipeline(4, 100), 1);
  const int tm_dm = fo_jax::GetGemmConfig(dm_args(0, 1, 0).config).tile_m;
  const bool dm_ok = m % tm_dm == 0;
  if (dm_ok) {
    // Reference for the destination-major layout: run its GEMM alone, put the bands back in rank
    // order (into recv), one ncclReduceScatter into out_ref.
    for (int d = 0; d < P; ++d) {
      CK(cudaSetDevice(d));
      fo_jax::SignalingGemmArgs g = dm_args(d, 1, 0);
      g.counters = nullptr; g.zero_counters_on_launch = false; g.after_zero_event = nullptr;
      rs_gemm.Launch(d, g);
    }
    SyncAll(P);
    for (int d = 0; d < P; ++d) {
      CK(cudaSetDevice(d));
      for (int j = 0; j < P; ++j)
        CK(cudaMemcpy(dev[d].recv + size_t((d + 1 + j) % P) * band, dev[d].send + j * band,
                      band * 2, cudaMemcpyDeviceToDevice));
    }
    NK(ncclGroupStart());
    for (int d = 0; d < P; ++d)
      NK(ncclReduceScatter(dev[d].recv, dev[d].out_ref, band, ncclBfloat16, ncclSum, dev[d].comm,
                           dev[d].nccl_s));
    NK(ncclGroupEnd());
    SyncAll(P);
    ok &= check("destination-major, NCCL send/recv, 116 SMs, 20 calls", dm(1, 116, false), 20);
    ok &= check("destination-major, copy engine, all SMs, 20 calls", dm(2, 0, true), 20);
  } else {
    std::printf("  (destination-major pipelines skipped: %d rows per rank not a multiple of %d)\n",
                m, tm_dm);
  }
  if (!ok) return 1;
  if (check_only) return 0;

  auto add = [&](const std::string& name, const std::function<void()>& op, bool timeline) {
    std::printf("  %-66s %8.3f ms\n", name.c_str(), TimeMs(P, op));
    if (timeline) {
      Timeline t;
      tl = &t;
      op();
      tl = nullptr;
      SyncAll(P);
      t.Print();
    }
    std::fflush(stdout);
  };
  add("gemm alone, all SMs", rs_gemm.Alone(0), false);
  add("gemm alone, 124 SMs", rs_gemm.Alone(124), false);
  add("gemm alone, 116 SMs", rs_gemm.Alone(116), false);
  add("ncclReduceScatter alone (maxCTAs 32)", nccl_rs_full, false);
  add("direct transport alone: 1 group, stream per peer", direct(1, 0, 2 * sms, false, false), true);
  add("direct transport alone: 1 group, one copy stream", direct(1, 0, 2 * sms, false, true), true);
  add("direct transport alone: 4 groups, one copy stream", direct(4, 0, 2 * sms, false, true), false);
  add("direct transport alone: 16 groups, one copy stream", direct(16, 0, 2 * sms, false, true), false);
  // One copy queue per GPU (peers in rotated order) moves the bytes faster than a stream per
  // peer (docs/performance.md, 'One push stream, no pulls').
  for (int groups : {4, 8, 16}) {
    for (int budget : {0, 124}) {
      const int grid = budget ? 2 * (sms - budget) : 2 * sms;
      add("direct pipeline: " + std::to_string(groups) + " groups, GEMM SMs " +
              std::to_string(budget ? budget : sms) + ", sum grid " + std::to_string(grid) +
              ", one copy stream",
          direct(groups, budget, grid, true, true), true);
    }
  }
  if (dm_ok) {
    for (int budget : {100, 116, 124}) {
      for (int sub : {1, 2}) {
        add("destination-major NCCL send/recv: " + std::to_string(sub) + " groups per band, GEMM SMs " +
                std::to_string(budget), dm(sub, budget, false), sub == 1);
      }
    }
    for (int budget : {0, 124}) {
      for (int sub : {1, 2}) {
        add("destination-major copy engine: " + std::to_string(sub) + " groups per band, GEMM SMs " +
                std::to_string(budget ? budget : sms), dm(sub, budget, true), sub == 1);
      }
    }
  }
  add("NCCL RS pipeline (fo_jax today): 4 groups, GEMM SMs 100", nccl_pipeline(4, 100), false);
  add("NCCL RS pipeline: 8 groups, GEMM SMs 116", nccl_pipeline(8, 116), false);
  return 0;
}
