// See ipc_probe.h.
#include "comm/ipc_probe.h"

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "comm/status.h"

namespace fo_jax {
namespace {

std::mutex g_mu;
std::map<int, void*> g_buffers;  // device -> this process's exported probe buffer

std::string Problem(cudaError_t e, const std::string& what) {
  (void)cudaGetLastError();
  return CudaStatus(e, what).message();
}

// Runs f() on a new thread with `device` current there, and returns its result: the caller's
// thread keeps its own current device (restoring it afterwards could create a context on a GPU
// this process never used, since cudaSetDevice initializes the device's primary context).
template <class F>
std::string OnDevice(int device, F f) {
  std::string result;
  std::thread worker([&] {
    const cudaError_t e = cudaSetDevice(device);
    result = e == cudaSuccess ? f() : Problem(e, "selecting GPU " + std::to_string(device));
  });
  worker.join();
  return result;
}

}  // namespace

IpcProbeExport ExportIpcProbe(int device) {
  IpcProbeExport out;
  std::lock_guard<std::mutex> lock(g_mu);
  out.problem = OnDevice(device, [&]() -> std::string {
    void*& buffer = g_buffers[device];
    if (buffer == nullptr) {
      cudaError_t e = cudaMalloc(&buffer, kIpcProbeBytes);
      if (e == cudaSuccess) e = cudaMemset(buffer, 0, kIpcProbeBytes);
      if (e == cudaSuccess) e = cudaStreamSynchronize(0);  // zeroed before a peer writes
      if (e != cudaSuccess) {
        if (buffer != nullptr && cudaFree(buffer) != cudaSuccess) (void)cudaGetLastError();
        g_buffers.erase(device);
        return Problem(e, "allocating the CUDA IPC probe buffer");
      }
    }
    cudaIpcMemHandle_t handle;
    const cudaError_t e = cudaIpcGetMemHandle(&handle, buffer);
    if (e != cudaSuccess) {
      return Problem(e, "exporting the CUDA IPC probe buffer (cudaIpcGetMemHandle)");
    }
    out.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    return "";
  });
  if (!out.problem.empty()) out.handle.clear();
  return out;
}

std::string TryIpcProbe(int device, const std::string& handle, int slot, uint32_t word) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return "a CUDA IPC handle of " + std::to_string(handle.size()) + " bytes (expected " +
           std::to_string(sizeof(cudaIpcMemHandle_t)) + ")";
  }
  if (slot < 0 || slot >= kIpcProbeBytes / static_cast<int>(sizeof(uint32_t))) {
    return "probe slot " + std::to_string(slot) + " is outside the probe buffer";
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  return OnDevice(device, [&]() -> std::string {
    void* peer = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&peer, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) return Problem(e, "mapping the peer's memory (cudaIpcOpenMemHandle)");
    void* local = nullptr;
    uint32_t back = ~word;
    uint32_t* target = static_cast<uint32_t*>(peer) + slot;
    std::string problem;
    e = cudaMalloc(&local, sizeof(word));
    if (e == cudaSuccess) e = cudaMemcpy(local, &word, sizeof(word), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(target, local, sizeof(word), cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(&back, target, sizeof(word), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
      problem = Problem(e, "writing into the peer's mapped memory");
    } else if (back != word) {
      problem = "a word written into the peer's mapped memory read back changed";
    }
    if (local != nullptr && cudaFree(local) != cudaSuccess) (void)cudaGetLastError();
    if (cudaIpcCloseMemHandle(peer) != cudaSuccess) (void)cudaGetLastError();
    return problem;
  });
}

void ReleaseIpcProbes() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [device, buffer] : g_buffers) {
    void* b = buffer;
    (void)OnDevice(device, [b]() -> std::string {
      if (cudaFree(b) != cudaSuccess) (void)cudaGetLastError();
      return "";
    });
  }
  g_buffers.clear();
}

}  // namespace fo_jax
