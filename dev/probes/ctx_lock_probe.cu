// Diagnostic (not part of the library): can the copy-engine transport's enqueue on one GPU be
// blocked by another host thread that waits for a second GPU to drain? (docs/performance.md,
// 'Copies as graph launches'.)
//
// The suspected hang: GPU 0 holds work that waits for a peer's copy (a band sum waiting for its
// arrival flag); another host thread makes a CUDA call that waits for GPU 0 to drain while it
// holds a driver lock (cudaFree, a module load or unload, ...); the peer's host thread then has
// to enqueue that very copy, and if the enqueue needs that lock, nothing moves again. NCCL's
// kernels never name a peer in an API call; fo_jax's copy-engine transport did (cudaMemcpyAsync
// into peer memory, cuStreamWriteValue32 of flags in peer memory).
//
// One case per process (a deadlock leaves a kernel spinning; the process exits and the driver
// ends it): GPU 0 runs a kernel spinning on a flag in its memory; the "blocker" thread starts
// the disruption on GPU 0 and should sit in it; then the "peer" thread (GPU 1) makes the calls
// that release the spin. Each step prints when it returns; a watchdog ends the process after
// 6 s with the step that did not return.
//   ctx_lock_probe BLOCKER PEER
//   BLOCKER (on GPU 0, from another thread): none | free (cudaFree) | malloc (cudaMalloc) |
//     free_host (cudaFreeHost of pinned memory) | host_alloc (cudaHostAlloc) | first_launch (a
//     kernel never launched before) | load_globals / unload_globals (a library whose module has
//     an initialised global) | graph_destroy (cudaGraphExecDestroy of a launched graph) | sync
//     (cudaDeviceSynchronize)
//   PEER (GPU 1's thread; every case ends by setting the flag in GPU 0's memory):
//     memcpy (cudaMemcpyAsync GPU 1 -> GPU 0 on a GPU 1 stream, then cuStreamWriteValue32 of the
//       flag: the transport's former pattern) | dtod (cuMemcpyDtoDAsync) | peer_ctx
//       (cuMemcpyPeerAsync, explicit contexts) | batch (cudaMemcpyBatchAsync) | graph (launch of a
//       graph instantiated beforehand whose memcpy node makes the same copy) | graph_update
//       (cudaGraphExecMemcpyNodeSetParams1D on it, same buffers, then the launch) |
//       graph_update_src / graph_update_dst (the same with another source in GPU 1 / another
//       destination in GPU 0) | graph_create (a new graph built, instantiated and launched, the
//       old exec destroyed) | local (cudaMemcpyAsync
//       within GPU 1) | kernel_copy (a GPU 1 kernel copies through the peer pointer) |
//       memset_local (cudaMemsetAsync of GPU 1 memory: the counters' reset) | event_pair
//       (cudaEventRecord on one GPU 1 stream, cudaStreamWaitEvent on another) |
//       flag_only (the stream write alone) | kernel_flag (a GPU 1 kernel stores the flag through
//       the peer pointer: NCCL's pattern)
//     all followed by the stream write of the flag except kernel_copy / kernel_flag / local (a
//     kernel store).
// Under CUDA_MODULE_LOADING=EAGER first_launch has nothing to load (the control).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "comm/stream_wait.h"
#include "probe_status.cuh"
#include "tool_common.cuh"

namespace {

std::atomic<const char*> g_step{"start"};
const auto g_t0 = std::chrono::steady_clock::now();

// Prints the step with the time since start; the watchdog names the last one (a literal or a
// string that outlives the process's wait).
void Step(const char* s) {
  g_step.store(s);
  std::printf("[%7.3f s] %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - g_t0).count(), s);
  std::fflush(stdout);
}

__global__ void SpinUntil(const volatile uint32_t* flag, uint32_t value) {
  while (*flag < value) __nanosleep(1000);
}

// Never launched before the disruption (first_launch): its load is lazy under LAZY loading.
__global__ void FirstTimeKernel(uint32_t* out) { out[0] = 42; }

__global__ void Noop() {}

__global__ void StoreFlag(uint32_t* flag, uint32_t value) {
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t*>(flag) = value;
}

__global__ void CopyWords(uint32_t* dst, const uint32_t* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

// A small library with an initialised global (XLA's modules carry constants this way).
const char* kPtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .global .align 4 .b32 table[4] = {1, 2, 3, 4};
.visible .entry noop() { ret; }
)";

template <typename Fn>
Fn Driver(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    std::printf("no driver entry point %s\n", name);
    std::exit(2);
  }
  return reinterpret_cast<Fn>(fn);
}

__global__ void Sleep(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) __nanosleep(1000);
}

// Peer access both ways between GPUs 0 and 1; leaves GPU 1 current.
void EnablePeerAccess01() {
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaSetDevice(1));
  CK(cudaDeviceEnablePeerAccess(0, 0));
}

// The copy-engine transport's copy primitive (PeerState::copy_exec): a one-node memcpy graph,
// re-pointed before each launch.
// The graph is never destroyed: an update names a node of the graph the exec was instantiated
// from (destroying it made every update fail with "invalid argument").
struct CopyGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t node = nullptr;
};

CopyGraph MakeCopyGraph(void* dst, const void* src, size_t bytes) {
  CopyGraph c;
  CK(cudaGraphCreate(&c.graph, 0));
  CK(cudaGraphAddMemcpyNode1D(&c.node, c.graph, nullptr, 0, dst, src, bytes,
                              cudaMemcpyDeviceToDevice));
  CK(cudaGraphInstantiate(&c.exec, c.graph, 0));
  return c;
}

void UpdateAndLaunch(const CopyGraph& c, void* dst, const void* src, size_t bytes,
                     cudaStream_t stream) {
  CK(cudaGraphExecMemcpyNodeSetParams1D(c.exec, c.node, dst, src, bytes, cudaMemcpyDeviceToDevice));
  CK(cudaGraphLaunch(c.exec, stream));
}

}  // namespace

// `ctx_lock_probe bench`: do copies issued as graph launches still run on the copy engine (not on
// SMs), and what do they cost on the host and the GPU? 16 copies of 4 MiB GPU 1 -> GPU 0 issued
// by cudaMemcpyAsync and by one graph exec updated before each launch: (a) behind a 2 ms sleep
// kernel (the host's enqueue time, and whether an update waits for the earlier launches), (b)
// while a kernel holds every SM of GPU 1 for ~5 ms (an SM-based copy would end after it).
int Bench() {
  constexpr int kCopies = 16;
  constexpr size_t kBytes = 4 << 20;
  EnablePeerAccess01();
  CK(cudaSetDevice(0));
  char* dst = nullptr;
  CK(cudaMalloc(&dst, kCopies * kBytes));
  CK(cudaSetDevice(1));
  char* src = nullptr;
  CK(cudaMalloc(&src, kCopies * kBytes));
  CK(cudaMemset(src, 1, kCopies * kBytes));
  cudaStream_t s = nullptr, busy = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  const CopyGraph copy = MakeCopyGraph(dst, src, kBytes);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int sms = 0, clock_khz = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 1));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 1));
  auto issue = [&](bool graph) {
    for (int i = 0; i < kCopies; ++i) {
      if (graph) {
        UpdateAndLaunch(copy, dst + i * kBytes, src + i * kBytes, kBytes, s);
      } else {
        CK(cudaMemcpyAsync(dst + i * kBytes, src + i * kBytes, kBytes, cudaMemcpyDeviceToDevice, s));
      }
    }
  };
  for (int rep = 0; rep < 3; ++rep) {
    for (bool graph : {false, true}) {
      const char* name = graph ? "graph update+launch" : "cudaMemcpyAsync";
      Sleep<<<1, 1, 0, s>>>(2LL * clock_khz);  // ~2 ms
      CK(cudaEventRecord(e0, s));
      const auto t0 = std::chrono::steady_clock::now();
      issue(graph);
      const double host_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      CK(cudaEventRecord(e1, s));
      CK(cudaStreamSynchronize(s));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      std::printf("rep %d %-20s behind a sleep: host %.1f us for %d copies; GPU %.1f us (%.0f GB/s)\n",
                  rep, name, host_us, kCopies, ms * 1e3, kCopies * kBytes / (ms * 1e6));
      Sleep<<<sms * 4, 256, 0, busy>>>(5LL * clock_khz);  // every SM busy for ~5 ms
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      CK(cudaEventRecord(e0, s));
      issue(graph);
      CK(cudaEventRecord(e1, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaEventElapsedTime(&ms, e0, e1));
      std::printf("rep %d %-20s while every SM is busy for ~5 ms: GPU %.1f us\n", rep, name,
                  ms * 1e3);
      CK(cudaStreamSynchronize(busy));
    }
  }
  std::printf("RESULT: bench done\n");
  return 0;
}

__global__ void FillWords(uint32_t* p, size_t n, uint32_t base) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = base + uint32_t(i / (1 << 18));  // one value per MiB
  }
}

// `ctx_lock_probe order`: are graph-launched copies correct in the transport's use? (A) a launch
// behind a cuStreamWaitValue32 on the same stream must not run before the wait is satisfied;
// (B) 16 update + launch pairs queued behind such a wait must each copy with their own
// parameters. cudaMemcpyAsync as the control.
int Order() {
  constexpr int kCopies = 16;
  constexpr size_t kBytes = 1 << 20, kWords = kCopies * kBytes / 4;
  EnablePeerAccess01();
  CK(cudaSetDevice(0));
  uint32_t* dst = nullptr;
  CK(cudaMalloc(&dst, kCopies * kBytes));
  cudaStream_t s0 = nullptr;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaSetDevice(1));
  uint32_t *src = nullptr, *gate = nullptr;
  CK(cudaMalloc(&src, kCopies * kBytes));
  CK(cudaMalloc(&gate, 4));
  FillWords<<<64, 256>>>(src, kWords, 1000);
  cudaStream_t s = nullptr, side = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const CopyGraph copy = MakeCopyGraph(dst, src, 4);
  std::string err;
  if (ProbeStatus(fo_jax::PrepareStreamWait(), &err) != cudaSuccess) return 2;
  std::vector<uint32_t> host(kWords);
  for (bool graph : {false, true}) {
    const char* name = graph ? "graph" : "cudaMemcpyAsync";
    CK(cudaSetDevice(0));
    CK(cudaMemset(dst, 0, kCopies * kBytes));
    CK(cudaSetDevice(1));
    CK(cudaMemset(gate, 0, 4));
    CK(cudaDeviceSynchronize());
    if (ProbeStatus(fo_jax::EnqueueWaitGeq(s, gate, 1), &err) != cudaSuccess) return 2;
    for (int i = 0; i < kCopies; ++i) {
      // Copy i: source chunk (i * 7) % 16 into destination chunk i.
      const int from = (i * 7) % kCopies;
      char* d = reinterpret_cast<char*>(dst) + i * kBytes;
      const char* sr = reinterpret_cast<const char*>(src) + from * kBytes;
      if (graph) {
        UpdateAndLaunch(copy, d, sr, kBytes, s);
      } else {
        CK(cudaMemcpyAsync(d, sr, kBytes, cudaMemcpyDeviceToDevice, s));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CK(cudaSetDevice(0));
    CK(cudaMemcpyAsync(host.data(), dst, kCopies * kBytes, cudaMemcpyDeviceToHost, s0));
    CK(cudaStreamSynchronize(s0));
    size_t early = 0;
    for (size_t i = 0; i < kWords; ++i) early += host[i] != 0;
    std::printf("%-16s (A) words copied before the wait was satisfied: %zu of %zu%s\n", name,
                early, kWords, early ? "  <-- ORDER BROKEN" : "");
    CK(cudaSetDevice(1));
    if (ProbeStatus(fo_jax::EnqueueWriteValue(side, gate, 1), &err) != cudaSuccess) return 2;
    CK(cudaStreamSynchronize(s));
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(host.data(), dst, kCopies * kBytes, cudaMemcpyDeviceToHost));
    int wrong = 0;
    std::string got;
    for (int i = 0; i < kCopies; ++i) {
      const uint32_t v = host[i * (kBytes / 4)];
      got += " " + std::to_string(v);
      wrong += v != 1000u + uint32_t((i * 7) % kCopies) || host[(i + 1) * (kBytes / 4) - 1] != v;
    }
    std::printf("%-16s (B) chunks with the wrong content: %d of %d; first words:%s\n", name, wrong,
                kCopies, got.c_str());
    CK(cudaSetDevice(1));
  }
  std::printf("RESULT: order done\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "bench") return Bench();
  if (argc == 2 && std::string(argv[1]) == "order") return Order();
  if (argc != 3) {
    std::fprintf(stderr, "usage: ctx_lock_probe BLOCKER PEER (see the source)\n");
    return 2;
  }
  const std::string blocker = argv[1], peer = argv[2];
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("needs 2 GPUs\n");
    return 2;
  }
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  std::printf("case %s / %s, CUDA_MODULE_LOADING=%s\n", blocker.c_str(), peer.c_str(),
              loading ? loading : "(unset)");
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(6));
    std::printf("RESULT: BLOCKED (no return within 6 s from: %s)\n", g_step.load());
    std::fflush(stdout);
    std::_Exit(3);
  }).detach();
  using DtoDFn = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  using PeerFn = CUresult (*)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
  using CtxFn = CUresult (*)(CUcontext*);
  const auto dtod = Driver<DtoDFn>("cuMemcpyDtoDAsync");
  const auto peer_copy = Driver<PeerFn>("cuMemcpyPeerAsync");
  const auto current_ctx = Driver<CtxFn>("cuCtxGetCurrent");
  constexpr size_t kBytes = 1 << 20;

  EnablePeerAccess01();
  // GPU 0: flag, buffers, pinned memory, a library, a launched graph, the spin kernel loaded.
  CK(cudaSetDevice(0));
  CUcontext ctx0 = nullptr, ctx1 = nullptr;
  if (current_ctx(&ctx0) != CUDA_SUCCESS) return 2;
  uint32_t *flag = nullptr, *dst0 = nullptr, *dst0b = nullptr, *spare = nullptr;
  CK(cudaMalloc(&flag, 8));
  CK(cudaMemset(flag, 0, 8));
  CK(cudaMalloc(&dst0, kBytes));
  CK(cudaMalloc(&dst0b, kBytes));
  CK(cudaMalloc(&spare, kBytes));
  void* pinned = nullptr;
  CK(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault));
  cudaLibrary_t lib = nullptr;
  if (blocker == "unload_globals") {
    CK(cudaLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t k = nullptr;
    CK(cudaLibraryGetKernel(&k, lib, "noop"));
    void* no_args[] = {nullptr};
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(k), 1, 1, no_args, 0, 0));  // loaded now
  }
  cudaStream_t s0 = nullptr, s0b = nullptr;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s0b, cudaStreamNonBlocking));
  cudaGraphExec_t graph0 = nullptr;  // graph_destroy: a graph launched on GPU 0 before the spin
  {
    cudaGraph_t g = nullptr;
    CK(cudaStreamBeginCapture(s0b, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemsetAsync(spare, 0, kBytes, s0b));
    CK(cudaStreamEndCapture(s0b, &g));
    CK(cudaGraphInstantiate(&graph0, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaGraphLaunch(graph0, s0b));
  }
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, SpinUntil));
  CK(cudaFuncGetAttributes(&attr, Noop));
  // GPU 1: source buffers, stream, kernels loaded, the copy graph, stream memory operations.
  CK(cudaSetDevice(1));
  if (current_ctx(&ctx1) != CUDA_SUCCESS) return 2;
  uint32_t *src1 = nullptr, *dst1 = nullptr;
  CK(cudaMalloc(&src1, kBytes));
  CK(cudaMalloc(&dst1, kBytes));
  CK(cudaMemset(src1, 1, kBytes));
  cudaStream_t s1 = nullptr, s1b = nullptr;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s1b, cudaStreamNonBlocking));
  cudaEvent_t ev1 = nullptr;
  CK(cudaEventCreateWithFlags(&ev1, cudaEventDisableTiming));
  CK(cudaFuncGetAttributes(&attr, StoreFlag));
  CK(cudaFuncGetAttributes(&attr, CopyWords));
  const CopyGraph copy = MakeCopyGraph(dst0, src1, kBytes);
  CK(cudaGraphLaunch(copy.exec, s1));  // uploaded and run once
  std::string err;
  if (ProbeStatus(fo_jax::PrepareStreamWait(), &err) != cudaSuccess) {
    std::printf("stream memory operations: %s\n", err.c_str());
    return 2;
  }
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(0));
  CK(cudaDeviceSynchronize());

  Step("GPU 0: spin kernel launched (waits for the flag)");
  SpinUntil<<<1, 1, 0, s0>>>(flag, 1);
  CK(cudaGetLastError());

  std::thread blocking([&] {
    CK(cudaSetDevice(0));
    static const std::string begins = "blocker: " + blocker + " begins (GPU 0 is busy)";
    static const std::string returned = "blocker: " + blocker + " returned";
    Step(begins.c_str());
    if (blocker == "first_launch") {
      FirstTimeKernel<<<1, 1, 0, s0b>>>(spare);
      CK(cudaGetLastError());
    } else if (blocker == "free") {
      CK(cudaFree(spare));
    } else if (blocker == "malloc") {
      void* more = nullptr;
      CK(cudaMalloc(&more, 64 << 20));
    } else if (blocker == "free_host") {
      CK(cudaFreeHost(pinned));
    } else if (blocker == "host_alloc") {
      void* more = nullptr;
      CK(cudaHostAlloc(&more, 64 << 20, cudaHostAllocDefault));
    } else if (blocker == "load_globals") {
      CK(cudaLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
      cudaKernel_t k = nullptr;
      CK(cudaLibraryGetKernel(&k, lib, "noop"));
      void* no_args[] = {nullptr};
      CK(cudaLaunchKernel(reinterpret_cast<const void*>(k), 1, 1, no_args, 0, s0b));
    } else if (blocker == "unload_globals") {
      CK(cudaLibraryUnload(lib));
    } else if (blocker == "graph_destroy") {
      CK(cudaGraphExecDestroy(graph0));
    } else if (blocker == "sync") {
      CK(cudaDeviceSynchronize());
    } else if (blocker == "queue_full") {
      std::string e2;
      if (ProbeStatus(fo_jax::EnqueueWaitGeq(s0b, flag, 1), &e2) != cudaSuccess) std::_Exit(2);
      int i = 0;
      for (auto t = std::chrono::steady_clock::now(); i < 100000; ++i) {
        Noop<<<1, 1, 0, s0b>>>();
        const auto now = std::chrono::steady_clock::now();
        if (now - t > std::chrono::milliseconds(100)) {
          std::printf("blocker: launch %d waited %.0f ms for room\n", i,
                      std::chrono::duration<double, std::milli>(now - t).count());
          std::fflush(stdout);
        }
        t = now;
      }
      std::printf("blocker: %d launches queued\n", i);
    } else if (blocker != "none") {
      std::printf("unknown blocker\n");
      std::_Exit(2);
    }
    Step(returned.c_str());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it reach its wait

  std::thread peering([&] {
    CK(cudaSetDevice(1));
    bool kernel_store = false;
    if (peer == "memcpy") {
      Step("peer: cudaMemcpyAsync GPU 1 -> GPU 0 ...");
      CK(cudaMemcpyAsync(dst0, src1, kBytes, cudaMemcpyDeviceToDevice, s1));
    } else if (peer == "dtod") {
      Step("peer: cuMemcpyDtoDAsync GPU 1 -> GPU 0 ...");
      if (dtod(CUdeviceptr(dst0), CUdeviceptr(src1), kBytes, s1) != CUDA_SUCCESS) std::_Exit(2);
    } else if (peer == "peer_ctx") {
      Step("peer: cuMemcpyPeerAsync GPU 1 -> GPU 0 ...");
      if (peer_copy(CUdeviceptr(dst0), ctx0, CUdeviceptr(src1), ctx1, kBytes, s1) !=
          CUDA_SUCCESS) {
        std::_Exit(2);
      }
    } else if (peer == "batch") {
      Step("peer: cudaMemcpyBatchAsync GPU 1 -> GPU 0 ...");
      void* dsts[1] = {dst0};
      const void* srcs[1] = {src1};
      size_t sizes[1] = {kBytes}, attr_index[1] = {0};
      cudaMemcpyAttributes a{};
      a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, attr_index, 1, s1));
    } else if (peer == "graph") {
      Step("peer: cudaGraphLaunch (memcpy GPU 1 -> GPU 0) ...");
      CK(cudaGraphLaunch(copy.exec, s1));
    } else if (peer == "graph_create") {
      // What every copy of the library did from 7f0cd48 to edff03a (its updates always failed:
      // as the library once did): build, instantiate and launch a new graph, destroy the previous exec.
      Step("peer: new copy graph (create, add memcpy node, instantiate), launch ...");
      CopyGraph fresh = MakeCopyGraph(dst0, src1, kBytes);
      CK(cudaGraphExecDestroy(copy.exec));
      CK(cudaGraphLaunch(fresh.exec, s1));
    } else if (peer == "graph_update") {  // same buffers, half the bytes
      Step("peer: graph memcpy node update + launch ...");
      UpdateAndLaunch(copy, dst0, src1, kBytes / 2, s1);
    } else if (peer == "graph_update_src") {
      Step("peer: graph memcpy node <- another GPU 1 buffer, launch ...");
      UpdateAndLaunch(copy, dst0, dst1, kBytes, s1);
    } else if (peer == "graph_update_dst") {
      Step("peer: graph memcpy node -> another GPU 0 buffer, launch ...");
      UpdateAndLaunch(copy, dst0b, src1, kBytes, s1);
    } else if (peer == "local") {
      Step("peer: cudaMemcpyAsync within GPU 1 ...");
      CK(cudaMemcpyAsync(dst1, src1, kBytes, cudaMemcpyDeviceToDevice, s1));
      kernel_store = true;
    } else if (peer == "memset_local") {
      Step("peer: cudaMemsetAsync of GPU 1 memory ...");
      CK(cudaMemsetAsync(dst1, 0, kBytes, s1));
      kernel_store = true;
    } else if (peer == "event_pair") {
      Step("peer: cudaEventRecord + cudaStreamWaitEvent on GPU 1 streams ...");
      CK(cudaEventRecord(ev1, s1b));
      CK(cudaStreamWaitEvent(s1, ev1, 0));
    } else if (peer == "kernel_copy") {
      Step("peer: GPU 1 kernel copying into GPU 0 ...");
      CopyWords<<<16, 256, 0, s1>>>(dst0, src1, kBytes / 4);
      CK(cudaGetLastError());
      kernel_store = true;
    } else if (peer == "kernel_flag") {
      kernel_store = true;
    } else if (peer != "flag_only") {
      std::printf("unknown peer case\n");
      std::_Exit(2);
    }
    if (kernel_store) {
      Step("peer: GPU 1 kernel storing GPU 0's flag ...");
      StoreFlag<<<1, 1, 0, s1>>>(flag, 1);
      CK(cudaGetLastError());
    } else {
      Step("peer: cuStreamWriteValue32 to GPU 0's flag ...");
      if (ProbeStatus(fo_jax::EnqueueWriteValue(s1, flag, 1), &err) != cudaSuccess) {
        std::printf("write value: %s\n", err.c_str());
        std::_Exit(2);
      }
    }
    Step("peer: cudaStreamSynchronize(GPU 1 stream) ...");
    CK(cudaStreamSynchronize(s1));
    Step("peer: GPU 1 stream done");
  });
  peering.join();
  blocking.join();
  Step("main: cudaStreamSynchronize(GPU 0 spin stream) ...");
  CK(cudaStreamSynchronize(s0));
  std::printf("RESULT: OK (%s / %s)\n", blocker.c_str(), peer.c_str());
  return 0;
}
