// See copy_engine_buffers.h.
#include "comm/copy_engine_buffers.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace fo_jax {
namespace {

// One rank's entry of the address all-gather.
struct PeerInfo {
  uint64_t recv;
  uint64_t flags;
  int32_t pid;
  int32_t device;
};

}  // namespace

Status CreateCopyEngineBuffers(CommState& s, CopyEngineBuffers& b) {
  cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&b.flags), sizeof(CopyEngineFlags));
  if (e == cudaSuccess) e = cudaMalloc(&b.exchange, kMaxCopyEngineRanks * sizeof(PeerInfo));
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "allocating the copy-engine flags"));
  return CudaStatus(cudaMemsetAsync(b.flags, 0, sizeof(CopyEngineFlags), s.stream),
                    "zeroing the copy-engine flags");
}

Status GrowCopyEngineBuffers(CommState& s, CopyEngineBuffers& b, size_t recv_bytes) {
  if (b.recv_bytes >= recv_bytes) return Status::Ok();
  // Every rank grows in the same call (same shapes), so every rank joins this exchange. The old
  // buffer stays allocated (cudaFree would synchronize the device while other work may be in
  // flight); doubling bounds how often that happens.
  const size_t capacity = std::max(recv_bytes, 2 * b.recv_bytes);
  void* recv = nullptr;
  cudaError_t e = cudaMalloc(&recv, capacity);
  if (e != cudaSuccess) {
    return CudaStatus(e, "allocating " + std::to_string(capacity >> 20) +
                             " MiB for the copy-engine receive buffer (outside XLA's memory "
                             "pool; lower XLA_PYTHON_CLIENT_MEM_FRACTION or use "
                             "OverlapConfig(transport='nccl'))");
  }
  b.recv = recv;
  b.recv_bytes = capacity;
  PeerInfo mine{reinterpret_cast<uint64_t>(b.recv), reinterpret_cast<uint64_t>(b.flags),
                static_cast<int32_t>(getpid()), s.device};
  auto* slots = static_cast<PeerInfo*>(b.exchange);
  std::vector<PeerInfo> all(s.nranks);
  e = cudaMemcpyAsync(slots + s.rank, &mine, sizeof(PeerInfo), cudaMemcpyHostToDevice, s.stream);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "address exchange"));
  FO_JAX_RETURN_IF_ERROR(NcclStatus(
      ncclAllGather(slots + s.rank, slots, sizeof(PeerInfo), ncclUint8, s.comm, s.stream),
      "address exchange (ncclAllGather)", s.comm));
  e = cudaMemcpyAsync(all.data(), slots, s.nranks * sizeof(PeerInfo), cudaMemcpyDeviceToHost,
                      s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "address exchange"));
  for (int q = 0; q < s.nranks; ++q) {
    if (q == s.rank) continue;
    if (all[q].pid != mine.pid) {
      return Status::Internal("the copy-engine transport needs every rank in one process (rank " +
                              std::to_string(q) + " is in another); use "
                              "OverlapConfig(transport='nccl')");
    }
    int ok = 0;
    e = cudaDeviceCanAccessPeer(&ok, s.device, all[q].device);
    if (e != cudaSuccess || !ok) {
      return Status::Internal("GPU " + std::to_string(s.device) + " cannot access GPU " +
                              std::to_string(all[q].device) + " directly (no peer access); use "
                              "OverlapConfig(transport='nccl')");
    }
    e = cudaDeviceEnablePeerAccess(all[q].device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else if (e != cudaSuccess) {
      return CudaStatus(e, "enabling peer access");
    }
    b.peer_recv[q] = reinterpret_cast<void*>(all[q].recv);
    b.peer_flags[q] = reinterpret_cast<CopyEngineFlags*>(all[q].flags);
  }
  return Status::Ok();
}

std::string PeerAccessProblem(const std::vector<int>& ordinals) {
  for (int a : ordinals) {
    for (int b : ordinals) {
      if (a == b) continue;
      int ok = 0;
      cudaError_t e = cudaDeviceCanAccessPeer(&ok, a, b);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return CudaStatus(e, "cudaDeviceCanAccessPeer").message();
      }
      if (!ok) return "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b);
    }
  }
  return "";
}

}  // namespace fo_jax
