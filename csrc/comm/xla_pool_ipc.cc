// See xla_pool_ipc.h.
#include "comm/xla_pool_ipc.h"

#include <cuda.h>  // types and enums only; the entry points come from the runtime
#include <cuda_runtime.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace fo_jax {
namespace {

using PointerGetAttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
using RetainFn = CUresult (*)(CUmemGenericAllocationHandle*, void*);
using ExportFn = CUresult (*)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                              unsigned long long);
using ImportFn = CUresult (*)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType);
using ReleaseFn = CUresult (*)(CUmemGenericAllocationHandle);
using ReserveFn = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
using MapFn = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
using SetAccessFn = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
using UnmapFn = CUresult (*)(CUdeviceptr, size_t);
using AddressFreeFn = CUresult (*)(CUdeviceptr, size_t);

struct Driver {
  PointerGetAttributeFn pointer_get_attribute = nullptr;
  RetainFn retain = nullptr;
  ExportFn export_handle = nullptr;
  ImportFn import_handle = nullptr;
  ReleaseFn release = nullptr;
  ReserveFn reserve = nullptr;
  MapFn map = nullptr;
  SetAccessFn set_access = nullptr;
  UnmapFn unmap = nullptr;
  AddressFreeFn address_free = nullptr;
  std::string missing;  // the first entry point the driver lacks, else ""
};

template <typename Fn>
void Resolve(const char* name, Fn* fn, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) ==
          cudaSuccess &&
      status == cudaDriverEntryPointSuccess) {
    *fn = reinterpret_cast<Fn>(p);
    return;
  }
  (void)cudaGetLastError();
  if (missing->empty()) *missing = name;
}

const Driver& TheDriver() {
  static const Driver d = [] {
    Driver r;
    Resolve("cuPointerGetAttribute", &r.pointer_get_attribute, &r.missing);
    Resolve("cuMemRetainAllocationHandle", &r.retain, &r.missing);
    Resolve("cuMemExportToShareableHandle", &r.export_handle, &r.missing);
    Resolve("cuMemImportFromShareableHandle", &r.import_handle, &r.missing);
    Resolve("cuMemRelease", &r.release, &r.missing);
    Resolve("cuMemAddressReserve", &r.reserve, &r.missing);
    Resolve("cuMemMap", &r.map, &r.missing);
    Resolve("cuMemSetAccess", &r.set_access, &r.missing);
    Resolve("cuMemUnmap", &r.unmap, &r.missing);
    Resolve("cuMemAddressFree", &r.address_free, &r.missing);
    return r;
  }();
  return d;
}

Status DriverStatus(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Status::Internal(what + " failed with CUresult " + std::to_string(int(r)));
}

Status NeedDriver(const Driver& d) {
  if (d.missing.empty()) return Status::Ok();
  return Status::Internal("the CUDA driver lacks " + d.missing +
                          " (virtual memory management, needed to map XLA's memory across "
                          "processes)");
}

std::mutex g_mu;
std::map<uint64_t, PoolExport> g_exports;                  // by allocation base
std::map<std::pair<int, uint64_t>, uint64_t> g_mappings;  // (pid, peer base) -> base here
std::atomic<int> g_socket_counter{0};

sockaddr_un AbstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';  // abstract namespace: no file, gone with the socket
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// One byte of payload with room for one descriptor (SCM_RIGHTS): the message both ends use. Its
// header points into itself, so it is built in place and never copied.
struct FdMessage {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};

  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

Status ErrnoStatus(const std::string& what) {
  return Status::Internal(what + " failed: " + std::strerror(errno));
}

}  // namespace

Status ExportPoolOf(const void* ptr, uint64_t bytes, PoolExport* out) {
  const Driver& d = TheDriver();
  FO_JAX_RETURN_IF_ERROR(NeedDriver(d));
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  CUdeviceptr base = 0;
  size_t size = 0;
  FO_JAX_RETURN_IF_ERROR(DriverStatus(
      d.pointer_get_attribute(&base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p),
      "finding the allocation of an XLA buffer (cuPointerGetAttribute)"));
  FO_JAX_RETURN_IF_ERROR(DriverStatus(
      d.pointer_get_attribute(&size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p),
      "finding the size of an XLA buffer's allocation (cuPointerGetAttribute)"));
  if (p + bytes > base + size) {
    return Status::Internal("an XLA buffer spans two allocations: it cannot be mapped by "
                            "another process");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_exports.find(base);
  if (it != g_exports.end()) {
    *out = it->second;
    return Status::Ok();
  }
  CUmemGenericAllocationHandle h = 0;
  FO_JAX_RETURN_IF_ERROR(DriverStatus(
      d.retain(&h, reinterpret_cast<void*>(p)),
      "exporting XLA's memory: cuMemRetainAllocationHandle (XLA's allocator does not use CUDA "
      "virtual memory here)"));
  int fd = -1;
  const CUresult r = d.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)d.release(h);  // the export holds its own reference
  FO_JAX_RETURN_IF_ERROR(DriverStatus(
      r, "exporting XLA's memory as a file descriptor (cuMemExportToShareableHandle: the "
         "allocation was not created shareable)"));
  PoolExport e;
  e.base = base;
  e.size = size;
  e.fd = fd;
  g_exports[base] = e;
  *out = e;
  return Status::Ok();
}

FdServer::~FdServer() {
  if (socket_ >= 0) close(socket_);
}

Status FdServer::Listen(std::string* name) {
  socket_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (socket_ < 0) return ErrnoStatus("creating a Unix socket");
  *name = "fo_jax." + std::to_string(getpid()) + "." + std::to_string(g_socket_counter++);
  socklen_t len = 0;
  const sockaddr_un a = AbstractAddress(*name, &len);
  if (bind(socket_, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    return ErrnoStatus("binding the abstract Unix socket " + *name);
  }
  if (listen(socket_, 64) != 0) return ErrnoStatus("listening on " + *name);
  return Status::Ok();
}

Status FdServer::Serve(int fd, int clients, int timeout_ms) {
  for (int i = 0; i < clients; ++i) {
    pollfd pfd{socket_, POLLIN, 0};
    const int ready = poll(&pfd, 1, timeout_ms);
    if (ready <= 0) {
      return ready == 0 ? Status::Internal("a peer process never came for XLA's memory handle "
                                           "(waited " + std::to_string(timeout_ms) + " ms)")
                        : ErrnoStatus("waiting for a peer process's connection");
    }
    const int conn = accept4(socket_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) return ErrnoStatus("accepting a peer process's connection");
    FdMessage m;
    cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    const ssize_t sent = sendmsg(conn, &m.msg, MSG_NOSIGNAL);
    const int err = errno;
    close(conn);
    if (sent != 1) {
      errno = err;
      return ErrnoStatus("sending XLA's memory handle to a peer process");
    }
  }
  return Status::Ok();
}

Status ReceiveFd(const std::string& name, int timeout_ms, int* fd) {
  *fd = -1;
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ErrnoStatus("creating a Unix socket");
  socklen_t len = 0;
  const sockaddr_un a = AbstractAddress(name, &len);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  (void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(s, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const Status st = ErrnoStatus("connecting to the peer process's socket " + name +
                                  " (the processes do not share a network namespace?)");
    close(s);
    return st;
  }
  FdMessage m;
  const ssize_t got = recvmsg(s, &m.msg, MSG_CMSG_CLOEXEC);
  const int err = errno;
  close(s);
  cmsghdr* c = got == 1 ? CMSG_FIRSTHDR(&m.msg) : nullptr;
  if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
    errno = got < 0 ? err : EPROTO;
    return ErrnoStatus("receiving XLA's memory handle from a peer process");
  }
  std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  return Status::Ok();
}

Status MapPeerPool(int fd, uint64_t size, int pid, uint64_t peer_base, int device, int peer_rank,
                   uint64_t* base) {
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd >= 0) close(fd);
    }
  } close_fd{fd};
  const Driver& d = TheDriver();
  FO_JAX_RETURN_IF_ERROR(NeedDriver(d));
  const std::string whose = "the XLA memory of rank " + std::to_string(peer_rank) +
                            " (another process)";
  std::lock_guard<std::mutex> lock(g_mu);
  const auto key = std::make_pair(pid, peer_base);
  auto it = g_mappings.find(key);
  if (it != g_mappings.end()) {
    *base = it->second;
    return Status::Ok();
  }
  CUmemGenericAllocationHandle h = 0;
  FO_JAX_RETURN_IF_ERROR(DriverStatus(
      d.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "importing " + whose + " (cuMemImportFromShareableHandle)"));
  CUdeviceptr va = 0;
  Status st = DriverStatus(d.reserve(&va, size, 0, 0, 0), "reserving addresses for " + whose);
  if (st.ok()) {
    st = DriverStatus(d.map(va, size, 0, h, 0), "mapping " + whose + " (cuMemMap)");
    if (st.ok()) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      st = DriverStatus(d.set_access(va, size, &access, 1),
                        "giving this GPU access to " + whose +
                            " (cuMemSetAccess: no peer access between the GPUs?)");
      if (!st.ok()) (void)d.unmap(va, size);
    }
    if (!st.ok()) (void)d.address_free(va, size);
  }
  (void)d.release(h);  // the mapping holds its own reference
  FO_JAX_RETURN_IF_ERROR(st);
  g_mappings[key] = va;
  *base = va;
  return Status::Ok();
}

}  // namespace fo_jax
