// What a one-GPU check (stuck_release_check.h, stuck_ring_release_check.h, ...) holds: device
// memory, two streams (the stuck call's, the release's) and the call's completion event, all
// released at its end, after the GPU has finished (the check owns the GPU while it runs); and
// the element patterns the checks share (stale bytes, random operands).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/signaling_gemm.h"

namespace fo_jax {

struct GpuCheckResources {
  std::vector<void*> memory;
  cudaStream_t call = nullptr, release = nullptr;
  cudaEvent_t done = nullptr;
  GpuCheckResources() = default;
  GpuCheckResources(const GpuCheckResources&) = delete;
  GpuCheckResources& operator=(const GpuCheckResources&) = delete;
  ~GpuCheckResources() {
    (void)cudaDeviceSynchronize();
    for (void* p : memory) (void)cudaFree(p);
    for (cudaStream_t s : {call, release}) {
      if (s) (void)cudaStreamDestroy(s);
    }
    if (done) (void)cudaEventDestroy(done);
  }
  template <class T>
  cudaError_t Alloc(T** p, size_t bytes) {
    void* v = nullptr;
    cudaError_t e = cudaMalloc(&v, bytes);
    if (e == cudaSuccess) memory.push_back(v);
    *p = static_cast<T*>(v);
    return e;
  }
  // Whether the call (everything before `done` on `call`) is still running `ms` after now: a
  // stuck call's check starts from that.
  bool StillRunningAfter(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const bool running = cudaEventQuery(done) == cudaErrorNotReady;
    (void)cudaGetLastError();
    return running;
  }
  // After a release enqueued at t0: waits up to timeout_s for the call to complete; returns
  // cudaEventQuery's answer then (cudaErrorNotReady: still stuck), the time since t0 in *ms.
  cudaError_t AwaitDone(std::chrono::steady_clock::time_point t0, double timeout_s, double* ms) {
    const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
    while (cudaEventQuery(done) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const cudaError_t err = cudaEventQuery(done);
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return err;
  }
  // The two non-blocking streams and the event (no timing).
  cudaError_t CreateStreams() {
    cudaError_t e = cudaStreamCreateWithFlags(&call, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&release, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    return e;
  }
};

// A finite byte pattern in bf16, fp16 and e4m3 (0x3C3C, 0x3C3C, 0x3C): what a check's buffers
// hold before the call under test, as stale memory would, so that a NaN there can only come from
// the release or failure under test.
inline constexpr int kStaleByte = 0x3C;

// The bits of v rounded to bf16.
inline uint16_t Bf16Bits(float v) {
  const __nv_bfloat16 b = __float2bfloat16(v);
  uint16_t bits;
  std::memcpy(&bits, &b, 2);
  return bits;
}

// Whether bf16 bits are a NaN: exponent all ones, mantissa not zero.
inline bool Bf16IsNaN(uint16_t v) { return (v & 0x7F80u) == 0x7F80u && (v & 0x007Fu) != 0; }

// The bits of v rounded to fp16, and whether fp16 bits are a NaN.
inline uint16_t F16Bits(float v) {
  const __half h = __float2half(v);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
inline bool F16IsNaN(uint16_t v) { return (v & 0x7C00u) == 0x7C00u && (v & 0x03FFu) != 0; }

// `count` random elements of magnitude 0.25 .. 2 (no zeros, infinities or NaNs), as the bytes
// of their bit patterns: bf16, f16 or e4m3 (whose exponents 5..7 stay clear of its NaN).
inline std::vector<uint8_t> RandomElements(size_t count, GemmDtype dtype, std::mt19937_64& rng) {
  std::vector<uint8_t> v(count * GemmInputBytes(dtype));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = rng();
    if (dtype == GemmDtype::kE4M3) {
      v[i] = uint8_t(((r & 1) << 7) | ((5 + (r >> 1) % 3) << 3) | ((r >> 8) & 0x7));
      continue;
    }
    const uint16_t sign = (r & 1) << 15;
    const uint16_t x =
        dtype == GemmDtype::kBF16
            ? uint16_t(sign | ((125 + (r >> 1) % 3) << 7) | ((r >> 8) & 0x7F))
            : uint16_t(sign | ((13 + (r >> 1) % 3) << 10) | ((r >> 8) & 0x3FF));
    std::memcpy(&v[2 * i], &x, 2);
  }
  return v;
}

}  // namespace fo_jax
