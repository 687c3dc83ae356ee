// See copy_engine_output_pools.h.
#include "comm/copy_engine_output_pools.h"

#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/xla_pool_ipc.h"

namespace fo_jax {
namespace {

// How long a rank waits for a peer process at the descriptor hand-over: every rank reaches it
// in the same call, right after an all-gather, so only a broken peer takes this long.
constexpr int kHandOverTimeoutMs = 60000;

// One rank's entry of the first all-gather.
struct PoolEntry {
  uint64_t base;  // the owner's address of the allocation holding its output
  uint64_t size;
  int32_t pid;
  int32_t ok;  // 1: exported and listening on `socket`
  char socket[kFdSocketNameBytes];
};
static_assert(std::is_trivially_copyable<PoolEntry>::value, "travels as raw bytes");

// One rank's entry of the second: its outcome, and where it mapped each peer's allocation.
struct PoolVerdict {
  int32_t ok;
  int32_t reserved;
  uint64_t mapped_at[kMaxCopyEngineRanks];  // 0: a peer in this process, or this rank
};
static_assert(std::is_trivially_copyable<PoolVerdict>::value, "travels as raw bytes");

const char kNccl[] = "; use OverlapConfig(transport='nccl') for this all-reduce";

}  // namespace

bool HasPeersInOtherProcesses(const CommState& s, const CopyEngineBuffers& b) {
  for (int q = 0; q < s.nranks; ++q) {
    if (b.peer_ipc[q]) return true;
  }
  return false;
}

Status MapPeerPools(CommState& s, const void* buffer, uint64_t bytes,
                    const std::string& collective, PeerPools* out) {
  const int P = s.nranks, me = s.rank;
  PoolExport ex;
  Status problem = ExportPoolOf(buffer, bytes, &ex);
  FdServer server;
  std::string name;
  if (problem.ok()) problem = server.Listen(&name);
  PoolEntry mine{};
  mine.base = ex.base;
  mine.size = ex.size;
  mine.pid = static_cast<int32_t>(getpid());
  mine.ok = problem.ok() ? 1 : 0;
  std::strncpy(mine.socket, name.c_str(), kFdSocketNameBytes - 1);
  std::vector<PoolEntry> all(P);
  FO_JAX_RETURN_IF_ERROR(
      AllGatherToHost(s, &mine, sizeof(PoolEntry), all.data(), "XLA memory exchange"));
  int failed = -1;
  for (int q = 0; q < P && failed < 0; ++q) {
    if (!all[q].ok) failed = q;
  }
  PoolVerdict verdict{};
  if (failed >= 0) {
    if (failed != me) {
      problem = Status::Internal("rank " + std::to_string(failed) + " of the group could not "
                                 "export its XLA memory (its own error says why)");
    }
  } else {
    // Every peer in another process connects to this rank's socket once, as this rank does to
    // theirs: this rank serves on a thread of its own while it collects.
    int clients = 0;
    for (int q = 0; q < P; ++q) clients += q != me && all[q].pid != mine.pid;
    Status served = Status::Ok();
    std::thread serve([&] { served = server.Serve(ex.fd, clients, kHandOverTimeoutMs); });
    for (int q = 0; q < P; ++q) {
      if (q == me || all[q].pid == mine.pid) continue;
      int fd = -1;
      Status got = ReceiveFd(std::string(all[q].socket, strnlen(all[q].socket,
                                                                kFdSocketNameBytes)),
                             kHandOverTimeoutMs, &fd);
      if (got.ok()) {
        got = MapPeerPool(fd, all[q].size, all[q].pid, all[q].base, s.device, q,
                          &verdict.mapped_at[q]);
      }
      if (problem.ok() && !got.ok()) problem = got;
    }
    serve.join();
    if (problem.ok()) problem = served;
  }
  verdict.ok = problem.ok() ? 1 : 0;
  std::vector<PoolVerdict> verdicts(P);
  FO_JAX_RETURN_IF_ERROR(AllGatherToHost(s, &verdict, sizeof(PoolVerdict), verdicts.data(),
                                         "XLA memory mapping verdicts"));
  for (int q = 0; q < P && problem.ok(); ++q) {
    if (!verdicts[q].ok) {
      problem = Status::Internal("rank " + std::to_string(q) + " of the group could not map "
                                 "its peers' XLA memory (its own error says why)");
    }
  }
  if (!problem.ok()) {
    return Status::Internal("the copy-engine " + collective + " across processes: " +
                            problem.message() + "; every rank fails this call; use "
                            "OverlapConfig(transport='nccl') for this " + collective);
  }
  PeerPools pools;
  pools.own_base = ex.base;
  pools.own_size = ex.size;
  for (int q = 0; q < P; ++q) {
    const bool other = q != me && all[q].pid != mine.pid;
    pools.base[q] = all[q].base;
    pools.size[q] = all[q].size;
    pools.here[q] = other ? verdict.mapped_at[q] : 0;
    pools.at_peer[q] = other ? verdicts[q].mapped_at[me] : 0;
  }
  *out = pools;
  return Status::Ok();
}

Status MapOutputPools(CommState& s, CopyEngineBuffers& b, const void* out, uint64_t out_bytes) {
  if (b.out_pools_mapped) return Status::Ok();
  FO_JAX_RETURN_IF_ERROR(MapPeerPools(s, out, out_bytes, "all-reduce", &b.out_pools));
  b.out_pools_mapped = true;
  return Status::Ok();
}

Status OutputInPeersMapping(const CommState& s, const CopyEngineBuffers& b, const void* out,
                            uint64_t out_bytes) {
  if (!HasPeersInOtherProcesses(s, b)) return Status::Ok();
  if (b.out_pools_mapped && InOwnPool(b.out_pools, reinterpret_cast<uint64_t>(out), out_bytes)) {
    return Status::Ok();
  }
  return Status::Internal(
      "this all-reduce's output lies outside the XLA memory that its peers in other processes "
      "mapped at the group's first all-reduce (JAX's memory preallocation is off, "
      "XLA_PYTHON_CLIENT_PREALLOCATE=false, or another allocator is in use, so XLA's memory is "
      "not one allocation)" + std::string(kNccl));
}

}  // namespace fo_jax
