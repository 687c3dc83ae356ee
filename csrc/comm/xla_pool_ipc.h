// XLA's own device memory across processes of one host, for the copy-engine all-reduce with one
// process per GPU, whose band sums store into the peers' per-call XLA outputs
// (docs/design.md, "Copy engine across processes"). XLA's buffers are not legacy-IPC capable:
// they lie in virtual-memory allocations (cuMemCreate) whose shareable handle is a POSIX file
// descriptor. With JAX's default preallocation a GPU's whole pool is one such allocation, so one
// mapping per peer covers every output XLA will hand the call. The owner exports the allocation
// holding its output (cuMemRetainAllocationHandle, cuMemExportToShareableHandle), the
// descriptor travels over an abstract Unix socket (SCM_RIGHTS), and each peer imports and maps
// it read-write for its own GPU (cuMemImportFromShareableHandle, cuMemAddressReserve,
// cuMemMap, cuMemSetAccess). Exports and mappings are kept for the process's life: a mapping
// keeps the owner's memory allocated until this process exits, even past the owner's own end.
// Driver entry points come through the runtime (cudaGetDriverEntryPointByVersion): no libcuda
// link.
#pragma once

#include <cstdint>
#include <string>

#include "comm/status.h"

namespace fo_jax {

// The allocation that holds a buffer of this process's current device.
struct PoolExport {
  uint64_t base = 0;  // this process's address of the allocation's start
  uint64_t size = 0;  // its bytes
  int fd = -1;        // its shareable handle (kept open for the process's life)
};

// The allocation holding [ptr, ptr + bytes), exported once per allocation (later calls return
// the same descriptor). Fails where the buffer is not in one exportable allocation (legacy
// cudaMalloc memory, an allocator whose handles cannot be shared, a buffer across two).
Status ExportPoolOf(const void* ptr, uint64_t bytes, PoolExport* out);

// A listening abstract Unix socket that hands one descriptor to each client that connects.
class FdServer {
 public:
  FdServer() = default;
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;
  ~FdServer();
  // Binds a fresh name (returned in *name, at most kFdSocketNameBytes - 1 characters) and listens.
  Status Listen(std::string* name);
  // Sends `fd` to each of `clients` connections, each awaited for at most timeout_ms; the first
  // failure (a client that never came) is returned. Blocks: run it on a thread of its own.
  Status Serve(int fd, int clients, int timeout_ms);

 private:
  int socket_ = -1;
};

inline constexpr int kFdSocketNameBytes = 48;

// Connects to an FdServer's socket `name` and receives its descriptor (waiting at most
// timeout_ms); the caller owns *fd.
Status ReceiveFd(const std::string& name, int timeout_ms, int* fd);

// Maps a peer's exported allocation (`fd` as received, `size` bytes, owned by process `pid` at
// its address `peer_base`) read-write for `device` (the current device); *base is this
// process's address of it. One mapping per (pid, peer_base) for the process's life: a second call
// returns the first mapping. Closes fd in every case.
Status MapPeerPool(int fd, uint64_t size, int pid, uint64_t peer_base, int device, int peer_rank,
                   uint64_t* base);

}  // namespace fo_jax
