// Diagnostic (not part of the library): how fast can one GPU's output leave it over NVLink, and
// does anything beat one copy-engine push? (docs/performance.md,
// 'What bounds the numbers'.)
//
// The copy-engine transport's chain of pushes runs at ~350 GB/s and is what ends a reduce-scatter
// call: the copies of the last band land 35-40 us after the GEMM. Two pushes from one GPU
// run one after the other, but a pull is executed by the receiver's copy engine, and SM
// stores by SMs: if either adds to a push, a transport that splits each band between them would
// finish its chain sooner.
//
// Every GPU of the process takes part at once, in a ring (GPU i sends to GPU i+1, as the
// transport's steps are permutations). Each mode moves BYTES per GPU per repetition:
//   push      GPU i's stream copies to GPU i+1 (the transport today)
//   pull      GPU i+1's stream copies from GPU i (the receiver's copy engine reads)
//   pushpull  half pushed by GPU i, the other half pulled by GPU i+1, at the same time
//   push2     two streams of GPU i each push half to GPU i+1
//   sm        a kernel on GPU i stores into GPU i+1's memory (SMS blocks, 16-byte stores)
//   smpush    a quarter by the kernel, the rest pushed by the copy engine, at the same time
// and reports GB/s per GPU (BYTES * reps / wall time of the slowest GPU).
//
//   nvlink_rate_probe [MiB per GPU, default 32] [reps, default 20] [SM blocks, default 32]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tool_common.cuh"

namespace {

// Copies n 16-byte vectors from src to dst (dst may be a peer GPU's memory).
__global__ void StoreToPeer(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

struct Gpu {
  int device = 0;
  char* src = nullptr;
  char* dst = nullptr;
  cudaStream_t s[2] = {};
};

void SyncAll(std::vector<Gpu>& g) {
  for (auto& x : g) {
    CK(cudaSetDevice(x.device));
    CK(cudaDeviceSynchronize());
  }
}

// One repetition of `mode`: enqueues every GPU's part. GPU i sends to j = i + 1.
void Enqueue(std::vector<Gpu>& g, const std::string& mode, size_t bytes, int sms) {
  const int P = int(g.size());
  for (int i = 0; i < P; ++i) {
    Gpu& a = g[i];
    Gpu& b = g[(i + 1) % P];
    const size_t half = bytes / 2, quarter = bytes / 4;
    if (mode == "push") {
      CK(cudaSetDevice(a.device));
      CK(cudaMemcpyAsync(b.dst, a.src, bytes, cudaMemcpyDefault, a.s[0]));
    } else if (mode == "pull") {
      CK(cudaSetDevice(b.device));
      CK(cudaMemcpyAsync(b.dst, a.src, bytes, cudaMemcpyDefault, b.s[1]));
    } else if (mode == "pushpull") {
      CK(cudaSetDevice(a.device));
      CK(cudaMemcpyAsync(b.dst, a.src, half, cudaMemcpyDefault, a.s[0]));
      CK(cudaSetDevice(b.device));
      CK(cudaMemcpyAsync(b.dst + half, a.src + half, bytes - half, cudaMemcpyDefault, b.s[1]));
    } else if (mode == "push2") {
      CK(cudaSetDevice(a.device));
      CK(cudaMemcpyAsync(b.dst, a.src, half, cudaMemcpyDefault, a.s[0]));
      CK(cudaMemcpyAsync(b.dst + half, a.src + half, bytes - half, cudaMemcpyDefault, a.s[1]));
    } else if (mode == "sm" || mode == "smpush") {
      const size_t by_sm = mode == "sm" ? bytes : quarter;
      CK(cudaSetDevice(a.device));
      StoreToPeer<<<sms, 512, 0, a.s[1]>>>(reinterpret_cast<const int4*>(a.src),
                                           reinterpret_cast<int4*>(b.dst), by_sm / 16);
      CK(cudaGetLastError());
      if (by_sm < bytes) {
        CK(cudaMemcpyAsync(b.dst + by_sm, a.src + by_sm, bytes - by_sm, cudaMemcpyDefault,
                           a.s[0]));
      }
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      std::exit(2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 32;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int sms = argc > 3 ? std::atoi(argv[3]) : 32;
  const size_t bytes = mib << 20;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "needs 2+ GPUs\n");
    return 2;
  }
  std::vector<Gpu> g(n);
  for (int i = 0; i < n; ++i) {
    g[i].device = i;
    CK(cudaSetDevice(i));
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      int ok = 0;
      CK(cudaDeviceCanAccessPeer(&ok, i, j));
      if (!ok) {
        std::fprintf(stderr, "GPU %d cannot access GPU %d\n", i, j);
        return 2;
      }
      cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError(); else CK(e);
    }
    CK(cudaMalloc(&g[i].src, bytes));
    CK(cudaMalloc(&g[i].dst, bytes));
    FillRandom<<<256, 256>>>(reinterpret_cast<uint16_t*>(g[i].src), bytes / 2, i + 1, 1);
    CK(cudaGetLastError());
    CK(cudaMemset(g[i].dst, 0, bytes));
    for (auto& s : g[i].s) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  SyncAll(g);
  std::printf("%d GPUs, %zu MiB per GPU per repetition, %d repetitions, %d SM blocks\n", n, mib,
              reps, sms);
  for (const char* mode : {"push", "pull", "pushpull", "push2", "sm", "smpush", "push"}) {
    Enqueue(g, mode, bytes, sms);  // warm-up
    SyncAll(g);
    // Check: GPU i+1's dst now equals GPU i's src.
    std::vector<uint16_t> want(4096), got(4096);
    for (int i = 0; i < n; ++i) {
      const int j = (i + 1) % n;
      for (size_t at : {size_t(0), bytes / 2 - 8192, bytes - 8192}) {
        CK(cudaMemcpy(want.data(), g[i].src + at, 8192, cudaMemcpyDefault));
        CK(cudaMemcpy(got.data(), g[j].dst + at, 8192, cudaMemcpyDefault));
        if (want != got) {
          std::printf("%s: WRONG data at GPU %d offset %zu\n", mode, j, at);
          return 1;
        }
      }
    }
    for (int i = 0; i < n; ++i) {  // poison, so the next mode's check means something
      CK(cudaSetDevice(i));
      CK(cudaMemset(g[i].dst, 0xff, bytes));
    }
    SyncAll(g);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) Enqueue(g, mode, bytes, sms);
    SyncAll(g);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-9s %7.1f GB/s per GPU  (%.1f us per %zu MiB)\n", mode,
                double(bytes) * reps / s / 1e9, s / reps * 1e6, mib);
  }
  return 0;
}
