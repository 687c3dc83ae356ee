// See peer_memory_ipc.h.
#include "comm/peer_memory_ipc.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>

namespace fo_jax {

PeerRouteDecision DecidePeerRoute(const PeerInfo& mine, const PeerInfo& peer, int peer_rank,
                                  int peer_ordinal_here, bool can_access) {
  const std::string rank = "rank " + std::to_string(peer_rank);
  const std::string nccl = "; use OverlapConfig(transport='nccl')";
  PeerRouteDecision d;
  if (peer.host != mine.host) {
    d.problem = "the copy-engine transport needs every rank on one host (" + rank +
                " is on another; CUDA IPC maps memory only within a host)" + nccl;
    return d;
  }
  const bool same_process = peer.pid == mine.pid;
  if (peer_ordinal_here >= 0 && !can_access) {
    d.problem = "GPU " + std::to_string(mine.device) + " cannot access the GPU of " + rank +
                " (bus " + std::string(peer.bus_id, strnlen(peer.bus_id, kBusIdBytes)) +
                ") directly (no peer access)" + nccl;
    return d;
  }
  if (same_process) {
    d.route = PeerRoute::kDirect;
    return d;
  }
  if (!peer.exported) {
    d.problem = rank + " (another process) could not export its copy-engine memory over CUDA "
                "IPC (its own error says why)" + nccl;
    return d;
  }
  d.route = PeerRoute::kIpc;
  return d;
}

uint64_t HostIdentity() {
  char name[256] = {};
  (void)gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::hash<std::string>{}(std::string(name) + "/" + boot);
}

void ExportPeerMemory(int device, void* recv, void* flags, PeerInfo& info, std::string* why) {
  std::memset(info.bus_id, 0, kBusIdBytes);
  cudaError_t e = cudaDeviceGetPCIBusId(info.bus_id, kBusIdBytes, device);
  if (e == cudaSuccess && recv != nullptr) e = cudaIpcGetMemHandle(&info.recv_handle, recv);
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&info.flags_handle, flags);
  info.exported = e == cudaSuccess && recv != nullptr ? 1 : 0;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *why = CudaStatus(e, "exporting the copy-engine memory (cudaIpcGetMemHandle)").message();
  }
}

Status OpenPeerMemory(const cudaIpcMemHandle_t& handle, const char* what, int peer_rank,
                      void** ptr) {
  *ptr = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  *ptr = nullptr;
  return CudaStatus(e, std::string("mapping the ") + what + " of rank " +
                           std::to_string(peer_rank) + " (another process; cudaIpcOpenMemHandle: "
                           "no peer access between the GPUs, or IPC not allowed between the "
                           "processes); use OverlapConfig(transport='nccl')");
}

void ClosePeerMemory(void* ptr) {
  if (ptr == nullptr) return;
  if (cudaIpcCloseMemHandle(ptr) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace fo_jax
