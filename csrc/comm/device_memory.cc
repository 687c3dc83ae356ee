// See device_memory.h.
#include "comm/device_memory.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace fo_jax {
namespace {

std::mutex g_mu;
std::map<std::pair<int, std::string>, DeviceBytes>& Table() {
  static auto* table = new std::map<std::pair<int, std::string>, DeviceBytes>();  // never
  return *table;  // destroyed: allocations outlive static destruction at exit
}

size_t HeldOn(int device) {
  size_t total = 0;
  for (const auto& [key, row] : Table()) {
    if (key.first == device) total += row.bytes;
  }
  return total;
}

std::string MiB(size_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

Status DeviceAlloc(int device, const char* what, size_t bytes, void** ptr) {
  *ptr = nullptr;
  const cudaError_t e = cudaMalloc(ptr, bytes);
  std::lock_guard<std::mutex> lock(g_mu);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::Internal(
        std::string("allocating ") + MiB(bytes) + " for the " + what + " on GPU " +
        std::to_string(device) + " failed (" + cudaGetErrorString(e) + "; fo_jax already holds " +
        MiB(HeldOn(device)) + " there, outside XLA's memory pool): leave room for it, e.g. "
        "XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 or XLA_PYTHON_CLIENT_PREALLOCATE=false, or use "
        "OverlapConfig(transport='nccl') (docs/troubleshooting.md, \"Memory outside XLA's pool\")");
  }
  DeviceBytes& row = Table()[{device, what}];
  row.device = device;
  row.what = what;
  row.bytes += bytes;
  row.allocations += 1;
  return Status::Ok();
}

Status DeviceFree(int device, const char* what, size_t bytes, void* ptr) {
  if (ptr == nullptr) return Status::Ok();
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaFree(ptr), std::string("freeing the ") + what));
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceBytes& row = Table()[{device, what}];
  row.bytes -= bytes;
  row.allocations -= 1;
  row.freed_bytes += bytes;
  return Status::Ok();
}

std::vector<DeviceBytes> DeviceBytesHeld() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<DeviceBytes> rows;
  for (const auto& [key, row] : Table()) rows.push_back(row);
  return rows;
}

}  // namespace fo_jax
