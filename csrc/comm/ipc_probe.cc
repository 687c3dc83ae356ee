// See ipc_probe.h.
#include "comm/ipc_probe.h"

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>

#include "comm/status.h"

namespace fo_jax {
namespace {

std::mutex g_mu;
std::map<int, void*> g_buffers;  // device -> this process's exported probe buffer

// Makes `device` current for its lifetime and restores the previous device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    error_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

std::string Problem(cudaError_t e, const std::string& what) {
  (void)cudaGetLastError();
  return CudaStatus(e, what).message();
}

}  // namespace

IpcProbeExport ExportIpcProbe(int device) {
  IpcProbeExport out;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) {
    out.problem = Problem(scope.error(), "selecting GPU " + std::to_string(device));
    return out;
  }
  void*& buffer = g_buffers[device];
  cudaError_t e = cudaSuccess;
  if (buffer == nullptr) {
    e = cudaMalloc(&buffer, kIpcProbeBytes);
    if (e == cudaSuccess) e = cudaMemset(buffer, 0, kIpcProbeBytes);
    if (e != cudaSuccess) {
      out.problem = Problem(e, "allocating the CUDA IPC probe buffer");
      if (buffer != nullptr && cudaFree(buffer) != cudaSuccess) (void)cudaGetLastError();
      g_buffers.erase(device);
      return out;
    }
  }
  cudaIpcMemHandle_t handle;
  e = cudaIpcGetMemHandle(&handle, buffer);
  if (e != cudaSuccess) {
    out.problem = Problem(e, "exporting the CUDA IPC probe buffer (cudaIpcGetMemHandle)");
    return out;
  }
  out.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
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
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) {
    return Problem(scope.error(), "selecting GPU " + std::to_string(device));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
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
}

void ReleaseIpcProbes() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [device, buffer] : g_buffers) {
    DeviceScope scope(device);
    if (scope.error() == cudaSuccess && cudaFree(buffer) != cudaSuccess) (void)cudaGetLastError();
  }
  g_buffers.clear();
}

}  // namespace fo_jax
