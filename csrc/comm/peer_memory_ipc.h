// How a copy-engine rank reaches its peers' memory (copy_engine_buffers.h) when they live in
// other processes of this host (one JAX process per GPU): the owner exports each fo_jax-owned
// allocation (receive buffer, flag words) with cudaIpcGetMemHandle, the handles travel in the
// address exchange (PeerInfo), and each peer maps them with cudaIpcOpenMemHandle: the flags once,
// a receive buffer once per generation (GrowCopyEngineBuffers closes a superseded mapping where
// its owner frees the buffer). This covers fo_jax's own memory only: XLA's buffers, which the
// all-reduce stores into, are not legacy-IPC capable and cross processes as virtual-memory
// allocations instead (xla_pool_ipc.h). docs/design.md, "Copy engine across processes".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "comm/status.h"

namespace fo_jax {

// Bus id text as cudaDeviceGetPCIBusId writes it ("0000:19:00.0"), zero-padded.
constexpr int kBusIdBytes = 16;

// One rank's entry of the copy engine's address exchange (an ncclAllGather of raw bytes, so it
// is plain data of one layout in every process of one build).
struct PeerInfo {
  uint64_t recv;        // this process's address of the new receive buffer
  uint64_t flags;       // and of the flag words
  uint64_t recv_bytes;  // the new buffer's size (0: this rank's allocation failed)
  uint64_t host;        // host identity (HostIdentity): ranks on other hosts are refused
  int32_t pid;
  int32_t device;  // CUDA ordinal in the owner's process (meaningful only there)
  int32_t exported;  // 1: recv_handle and flags_handle are valid
  int32_t reserved;
  char bus_id[kBusIdBytes];
  cudaIpcMemHandle_t recv_handle;
  cudaIpcMemHandle_t flags_handle;
};
static_assert(std::is_trivially_copyable<PeerInfo>::value, "PeerInfo travels as raw bytes");

// How this rank reaches one peer's memory.
enum class PeerRoute : int {
  kDirect = 0,   // same process: the peer's own addresses, peer access enabled by ordinal
  kIpc = 1,      // another process on this host: map the peer's IPC handles
  kRefused = 2,  // cannot: `problem` says why
};

struct PeerRouteDecision {
  PeerRoute route = PeerRoute::kRefused;
  std::string problem;  // "" unless refused
};

// The route from `mine` to rank `peer_rank`'s `peer`, from what the exchange says and what this
// process sees of the peer's GPU: `peer_ordinal_here` is its ordinal in this process (the same
// process: peer.device; another: found by bus id, -1 where CUDA_VISIBLE_DEVICES hides it) and
// `can_access` whether this GPU has peer access to it (meaningful when the ordinal is >= 0).
// A hidden GPU is not refused here: opening its handles is then the test (an open that fails is
// reported through the verdict exchange, so every rank fails the call). Pure: no CUDA call.
PeerRouteDecision DecidePeerRoute(const PeerInfo& mine, const PeerInfo& peer, int peer_rank,
                                  int peer_ordinal_here, bool can_access);

// This host's identity for PeerInfo::host: a hash of the host name and the kernel's boot id
// (two machines with one host name differ by boot id; containers of one machine share it).
uint64_t HostIdentity();

// Fills info's bus id, and exports `recv` and `flags` (both from cudaMalloc, as DeviceAlloc
// allocates) into its handles, setting `exported` (0, with the reason in *why, when either
// export fails: a peer in another process then refuses this rank; ranks in this process do
// not need the handles).
void ExportPeerMemory(int device, void* recv, void* flags, PeerInfo& info, std::string* why);

// Maps a peer's exported allocation into this process (current device: this rank's GPU; peer
// access enabled lazily by the driver). *ptr is this process's address of it.
Status OpenPeerMemory(const cudaIpcMemHandle_t& handle, const char* what, int peer_rank,
                      void** ptr);

// Unmaps what OpenPeerMemory mapped (nullptr: nothing). The caller guarantees that no work of
// this GPU still uses the mapping.
void ClosePeerMemory(void* ptr);

}  // namespace fo_jax
