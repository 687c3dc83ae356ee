// Diagnostic (not part of the library): can the copy-engine transport's enqueue on one GPU be
// blocked by another host thread that waits for a second GPU to drain? (benchmarks/NOTES.md §12.)
//
// The suspected hang: GPU 0 holds work that waits for a peer's copy (a band sum waiting for its
// arrival flag); another host thread makes a CUDA call that waits for GPU 0 to drain while it
// holds GPU 0's context lock (a kernel's first launch under lazy module loading, a module
// unload, cudaFree); the peer's host thread then has to enqueue that very copy into GPU 0's
// memory, and if the enqueue needs GPU 0's lock, nothing moves again. NCCL's kernels never
// name a peer in an API call, fo_jax's copy-engine transport does (cudaMemcpyAsync and
// cuStreamWriteValue32 into peer memory).
//
// One case per process (a deadlock leaves a kernel spinning; the process exits and the driver
// ends it): GPU 0 runs a kernel spinning on a flag in its memory; the "blocker" thread starts
// the disruption on GPU 0 and should sit in it; then the "peer" thread (GPU 1) makes the calls
// that release the spin. Each step prints when it returns; a watchdog ends the process after
// 10 s with the step that did not return.
//   ctx_lock_probe BLOCKER PEER
//   BLOCKER: none | first_launch (a kernel never launched before) | unload (a loaded library) |
//            free (cudaFree of a GPU 0 buffer) | sync (cudaDeviceSynchronize on GPU 0)
//   PEER:    copy_then_flag (cudaMemcpyAsync GPU 1 -> GPU 0, then cuStreamWriteValue32 to the
//            flag in GPU 0's memory, both on a GPU 1 stream: the transport's pattern) |
//            flag_only (the stream write alone) | kernel_flag (a GPU 1 kernel stores the flag
//            through the peer pointer: NCCL's pattern) | pull (cudaMemcpyAsync GPU 0 -> GPU 1
//            memory on a GPU 1 stream, then kernel_flag) | peer_wait (cuStreamWaitValue32 on a
//            GPU 1 stream for a word in GPU 0's memory that is already set, then kernel_flag):
//            the last two are the calls a receiver-driven (pull) transport would make
// Under CUDA_MODULE_LOADING=EAGER first_launch has nothing to load (the control).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "comm/stream_wait.h"
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

__global__ void StoreFlag(uint32_t* flag, uint32_t value) {
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t*>(flag) = value;
}

// A tiny library to load now and unload during the spin (unload).
const char* kPtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry noop() { ret; }
)";

}  // namespace

int main(int argc, char** argv) {
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
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::printf("RESULT: BLOCKED (no return within 10 s from: %s)\n", g_step.load());
    std::fflush(stdout);
    std::_Exit(3);
  }).detach();

  // GPU 0: flag, a buffer to free, a library to unload, the spin kernel loaded now.
  CK(cudaSetDevice(0));
  uint32_t *flag = nullptr, *scratch0 = nullptr, *spare = nullptr;
  CK(cudaMalloc(&flag, 8));
  CK(cudaMemset(flag, 0, 4));
  CK(cudaMemset(flag + 1, 0xff, 4));  // flag[1]: already set (peer_wait)
  CK(cudaMalloc(&scratch0, 1 << 20));
  CK(cudaMalloc(&spare, 1 << 20));
  cudaLibrary_t lib = nullptr;
  CK(cudaLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, SpinUntil));
  cudaStream_t s0 = nullptr, s0b = nullptr;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s0b, cudaStreamNonBlocking));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  // GPU 1: source buffer, stream, the flag kernel loaded now, stream memory operations.
  CK(cudaSetDevice(1));
  uint32_t* src1 = nullptr;
  CK(cudaMalloc(&src1, 1 << 20));
  CK(cudaMemset(src1, 1, 1 << 20));
  cudaStream_t s1 = nullptr;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaDeviceEnablePeerAccess(0, 0));
  CK(cudaFuncGetAttributes(&attr, StoreFlag));
  std::string err;
  if (fo_jax::PrepareStreamWait(&err) != cudaSuccess) {
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
      FirstTimeKernel<<<1, 1, 0, s0b>>>(scratch0);
      CK(cudaGetLastError());
    } else if (blocker == "unload") {
      CK(cudaLibraryUnload(lib));
    } else if (blocker == "free") {
      CK(cudaFree(spare));
    } else if (blocker == "sync") {
      CK(cudaDeviceSynchronize());
    }
    Step(returned.c_str());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it reach its wait

  std::thread peering([&] {
    CK(cudaSetDevice(1));
    if (peer == "copy_then_flag") {
      Step("peer: cudaMemcpyAsync GPU 1 -> GPU 0 memory on a GPU 1 stream ...");
      CK(cudaMemcpyAsync(scratch0, src1, 1 << 20, cudaMemcpyDeviceToDevice, s1));
      Step("peer: cudaMemcpyAsync returned");
    } else if (peer == "pull") {
      Step("peer: cudaMemcpyAsync GPU 0 -> GPU 1 memory on a GPU 1 stream ...");
      CK(cudaMemcpyAsync(src1, scratch0, 1 << 20, cudaMemcpyDeviceToDevice, s1));
      Step("peer: cudaMemcpyAsync returned");
    } else if (peer == "peer_wait") {
      Step("peer: cuStreamWaitValue32 on a GPU 1 stream for a GPU 0 word ...");
      if (fo_jax::EnqueueWaitGeq(s1, flag + 1, 1, false, &err) != cudaSuccess) {
        std::printf("wait value: %s\n", err.c_str());
        std::_Exit(2);
      }
      Step("peer: cuStreamWaitValue32 returned");
    }
    if (peer == "copy_then_flag" || peer == "flag_only") {
      Step("peer: cuStreamWriteValue32 to GPU 0's flag on a GPU 1 stream ...");
      if (fo_jax::EnqueueWriteValue(s1, flag, 1, &err) != cudaSuccess) {
        std::printf("write value: %s\n", err.c_str());
        std::_Exit(2);
      }
      Step("peer: cuStreamWriteValue32 returned");
    } else {  // kernel_flag, pull, peer_wait
      Step("peer: GPU 1 kernel storing GPU 0's flag ...");
      StoreFlag<<<1, 1, 0, s1>>>(flag, 1);
      CK(cudaGetLastError());
      Step("peer: launch returned");
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
