// Diagnostic (not part of the library): does a stream that waits hold up other streams' work
// because CUDA maps them onto the same hardware queue? (docs/troubleshooting.md,
// 'Hardware queues'.)
//
// CUDA multiplexes a context's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues
// (default 8). If a queue executes in order, an operation whose dependency is not met blocks
// everything enqueued after it in that queue, whichever stream it came from. fo_jax enqueues
// waits whose condition depends on other GPUs; if XLA's transfer that another GPU needs sits
// behind such a wait, nothing moves again.
//
//   queue_sharing_probe MODE STREAMS [HELD] [copy|kernel] [prio]
//   MODE: wait   each held stream holds cuStreamWaitValue32 on a flag in pinned host memory,
//                then a tiny kernel (fo_jax's pattern: a flag wait, then the work it gates)
//         spin   each held stream holds a 1-thread kernel spinning on the flag, then a tiny
//                kernel (the spin kernel runs; its successor in the stream waits: NCCL's pattern)
//         none   the held streams hold only the tiny kernel (the control: nothing may be blocked)
//   STREAMS: streams created in this order (non-blocking); the first HELD (default 1) are held,
//            every other stream then gets a 4 KiB device-to-device copy (or a tiny kernel) and
//            an event, enqueued after the held streams' waits.
//   prio: the held streams are created with the highest priority (as fo_jax's copy stream).
//   late=N: set CUDA_DEVICE_MAX_CONNECTIONS=N after the driver is initialised (cuInit, through
//           cudaGetDeviceCount) but before the context exists: is it read per context? (fo_jax
//           sets it at import, when JAX may have initialised the driver but no context yet.)
// Prints which streams' work had not completed 300 ms later, then releases the flag. The
// environment decides the number of hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "tool_common.cuh"

namespace {

using StreamValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// The flag is written by the host: a system-scope acquire load sees it.
__global__ void SpinOnHostFlag(const uint32_t* flag) {
  uint32_t seen;
  do {
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
    if (seen != 0) break;
    __nanosleep(500);
  } while (true);
}

__global__ void Tiny(uint32_t* p) { p[threadIdx.x] += 1; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: queue_sharing_probe wait|spin|none STREAMS [HELD] [copy|kernel] [prio]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int streams = std::atoi(argv[2]);
  int held = 1;
  bool prio = false, kernels = false;
  const char* late = nullptr;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "prio") == 0) prio = true;
    else if (std::strcmp(argv[i], "kernel") == 0) kernels = true;
    else if (std::strncmp(argv[i], "late=", 5) == 0) late = argv[i] + 5;
    else if (std::strcmp(argv[i], "copy") != 0) held = std::atoi(argv[i]);
  }
  if (held < 1 || held >= streams) { std::fprintf(stderr, "need 1 <= HELD < STREAMS\n"); return 2; }
  int devices = 0;
  CK(cudaGetDeviceCount(&devices));  // initialises the driver, creates no context
  if (late) setenv("CUDA_DEVICE_MAX_CONNECTIONS", late, 1);
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  CK(cudaSetDevice(0));

  uint32_t* flag_host = nullptr;
  CK(cudaHostAlloc(&flag_host, sizeof(uint32_t), cudaHostAllocMapped));
  *reinterpret_cast<volatile uint32_t*>(flag_host) = 0;
  uint32_t* flag_dev = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag_host, 0));
  uint32_t* scratch = nullptr;
  CK(cudaMalloc(&scratch, 1024 * sizeof(uint32_t)));
  CK(cudaMemset(scratch, 0, 1024 * sizeof(uint32_t)));
  char *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, 4096 * size_t(streams)));
  CK(cudaMalloc(&dst, 4096 * size_t(streams)));
  CK(cudaMemset(src, 1, 4096 * size_t(streams)));
  // Load both kernels now (lazy loading would serialise a first launch behind the wait).
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, SpinOnHostFlag));
  CK(cudaFuncGetAttributes(&attr, Tiny));
  StreamValue32Fn wait_value32 = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&wait_value32),
                                      12000, cudaEnableDefault, &q));
  CK(cudaDeviceSynchronize());

  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  std::vector<cudaStream_t> s(streams);
  std::vector<cudaEvent_t> ev(streams);
  for (int i = 0; i < streams; ++i) {
    CK(cudaStreamCreateWithPriority(&s[i], cudaStreamNonBlocking, (i < held && prio) ? hi : lo));
    CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
  }

  for (int i = 0; i < held; ++i) {
    if (mode == "wait") {
      CUresult r = wait_value32(reinterpret_cast<CUstream>(s[i]),
                                reinterpret_cast<CUdeviceptr>(flag_dev), 1, CU_STREAM_WAIT_VALUE_GEQ);
      if (r != CUDA_SUCCESS) { std::fprintf(stderr, "cuStreamWaitValue32: %d\n", int(r)); return 2; }
    } else if (mode == "spin") {
      SpinOnHostFlag<<<1, 1, 0, s[i]>>>(flag_dev);
    } else if (mode != "none") {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
    Tiny<<<1, 32, 0, s[i]>>>(scratch);
    CK(cudaEventRecord(ev[i], s[i]));
  }
  for (int i = held; i < streams; ++i) {
    if (kernels) {
      Tiny<<<1, 32, 0, s[i]>>>(scratch + 32 * (i % 32));
    } else {
      CK(cudaMemcpyAsync(dst + 4096 * size_t(i), src + 4096 * size_t(i), 4096,
                         cudaMemcpyDeviceToDevice, s[i]));
    }
    CK(cudaEventRecord(ev[i], s[i]));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string blocked;
  int n_blocked = 0;
  for (int i = held; i < streams; ++i) {
    cudaError_t e = cudaEventQuery(ev[i]);
    if (e == cudaErrorNotReady) {
      blocked += " " + std::to_string(i);
      ++n_blocked;
    } else {
      CK(e);
    }
  }
  const bool head_done = cudaEventQuery(ev[0]) == cudaSuccess;
  __atomic_store_n(flag_host, 1u, __ATOMIC_SEQ_CST);
  CK(cudaDeviceSynchronize());
  std::printf("conn=%s%s mode=%s streams=%d held=%d%s: held streams %s; %d of %d other streams' %s "
              "blocked after 300 ms:%s\n",
              conn ? conn : "default", late ? " (set after cuInit)" : "", mode.c_str(), streams, held, prio ? " (high priority)" : "",
              head_done ? "done (no wait held)" : "held", n_blocked, streams - held,
              kernels ? "kernels" : "copies", blocked.empty() ? " none" : blocked.c_str());
  return 0;
}
