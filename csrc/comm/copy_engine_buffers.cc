// See copy_engine_buffers.h.
#include "comm/copy_engine_buffers.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cstdint>
#include <vector>

#include "comm/copy_engine.h"
#include "comm/device_memory.h"
#include "comm/peer_memory_ipc.h"

namespace fo_jax {
namespace {

constexpr char kRecv[] = "copy-engine receive buffer";

std::atomic<uint32_t> g_test_epoch_start{0};
std::atomic<int> g_fail_recv_alloc_rank{-1};

}  // namespace

void SetTestEpochStartForTests(uint32_t start) { g_test_epoch_start.store(start); }
void SetFailReceiveAllocForTests(int rank) { g_fail_recv_alloc_rank.store(rank); }

Status CreateCopyEngineBuffers(CommState& s, CopyEngineBuffers& b) {
  FO_JAX_RETURN_IF_ERROR(DeviceAlloc(s.device, "copy-engine flags", sizeof(CopyEngineFlags),
                                     reinterpret_cast<void**>(&b.flags)));
  // Every epoch word starts at the epoch start ("no call yet": each wait is for a later epoch,
  // epoch_compare.h); the output addresses start null. Synchronized: the host copy is local.
  b.epoch_start = g_test_epoch_start.load();
  std::vector<uint32_t> words(sizeof(CopyEngineFlags) / sizeof(uint32_t), b.epoch_start);
  std::fill_n(reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(words.data()) +
                                          offsetof(CopyEngineFlags, out_table)),
              kMaxCopyEngineRanks, uint64_t{0});
  cudaError_t e = cudaMemcpyAsync(b.flags, words.data(), sizeof(CopyEngineFlags),
                                  cudaMemcpyHostToDevice, s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "setting the copy-engine flags"));
  FO_JAX_RETURN_IF_ERROR(DeviceAlloc(s.device, "copy-engine NaN tile", kNanTileBytes,
                                     &b.nan_tile));
  e = cudaMemsetAsync(b.nan_tile, 0xFF, kNanTileBytes, s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  return CudaStatus(e, "filling the copy-engine NaN tile");
}

namespace {

// Routes to every peer and their addresses in this process (new_recv, new_flags; the mappings
// this opened are marked in opened_*); the first problem, if any.
Status MapPeers(CommState& s, CopyEngineBuffers& b, const PeerInfo& mine,
                const std::vector<PeerInfo>& all, void** new_recv, CopyEngineFlags** new_flags,
                bool* ipc, bool* opened_recv, bool* opened_flags) {
  for (int q = 0; q < s.nranks; ++q) {
    if (q == s.rank) continue;
    const PeerInfo& peer = all[q];
    int ordinal = -1;
    if (peer.pid == mine.pid) {
      ordinal = peer.device;
    } else {
      char bus[kBusIdBytes + 1] = {};
      std::memcpy(bus, peer.bus_id, kBusIdBytes);
      if (cudaDeviceGetByPCIBusId(&ordinal, bus) != cudaSuccess) {
        (void)cudaGetLastError();  // hidden from this process (CUDA_VISIBLE_DEVICES)
        ordinal = -1;
      }
    }
    int can_access = 0;
    if (ordinal >= 0 && cudaDeviceCanAccessPeer(&can_access, s.device, ordinal) != cudaSuccess) {
      (void)cudaGetLastError();
      can_access = 0;
    }
    const PeerRouteDecision d = DecidePeerRoute(mine, peer, q, ordinal, can_access != 0);
    if (d.route == PeerRoute::kRefused) return Status::Internal(d.problem);
    ipc[q] = d.route == PeerRoute::kIpc;
    if (d.route == PeerRoute::kDirect) {
      cudaError_t e = cudaDeviceEnablePeerAccess(peer.device, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else if (e != cudaSuccess) {
        return CudaStatus(e, "enabling peer access");
      }
      new_recv[q] = reinterpret_cast<void*>(peer.recv);
      new_flags[q] = reinterpret_cast<CopyEngineFlags*>(peer.flags);
      continue;
    }
    // The flags live as long as their process: mapped once, kept across generations.
    if (b.peer_ipc[q] && b.peer_flags[q] != nullptr) {
      new_flags[q] = b.peer_flags[q];
    } else {
      void* p = nullptr;
      FO_JAX_RETURN_IF_ERROR(OpenPeerMemory(peer.flags_handle, "copy-engine flags", q, &p));
      new_flags[q] = static_cast<CopyEngineFlags*>(p);
      opened_flags[q] = true;
    }
    FO_JAX_RETURN_IF_ERROR(OpenPeerMemory(peer.recv_handle, kRecv, q, &new_recv[q]));
    opened_recv[q] = true;
  }
  return Status::Ok();
}

}  // namespace

Status GrowCopyEngineBuffers(CommState& s, CopyEngineBuffers& b, size_t recv_bytes) {
  if (b.recv_bytes >= recv_bytes) return Status::Ok();
  // Every rank grows in the same call (same shapes), so every rank joins this exchange; doubling
  // bounds how often that happens.
  const size_t capacity = std::max(recv_bytes, 2 * b.recv_bytes);
  void* recv = nullptr;
  Status allocated = g_fail_recv_alloc_rank.load() == s.rank
                         ? Status::Internal(std::string("allocating the ") + kRecv +
                                            " failed [injected by FO_JAX_TEST_FAIL=alloc]")
                         : DeviceAlloc(s.device, kRecv, capacity, &recv);
  // The old buffer is freed below, which synchronizes this GPU: first every call this rank
  // handed to its copy worker must be enqueued (each rank does so before it joins the exchange,
  // so once the exchange is complete, every earlier call's work is on every GPU of the group).
  if (b.recv != nullptr) DrainCopyWorker(s);
  PeerInfo mine{};
  mine.recv = reinterpret_cast<uint64_t>(recv);
  mine.flags = reinterpret_cast<uint64_t>(b.flags);
  mine.recv_bytes = allocated.ok() ? uint64_t{capacity} : 0;
  mine.host = HostIdentity();
  mine.pid = static_cast<int32_t>(getpid());
  mine.device = s.device;
  // Exported whatever the layout (peers in this process ignore the handles); a failed export
  // matters only to a peer in another process, which then refuses this rank.
  std::string export_problem;
  if (allocated.ok()) ExportPeerMemory(s.device, recv, b.flags, mine, &export_problem);
  std::vector<PeerInfo> all(s.nranks);
  FO_JAX_RETURN_IF_ERROR(
      AllGatherToHost(s, &mine, sizeof(PeerInfo), all.data(), "address exchange"));
  // Every rank sees every rank's allocation outcome, so all of them fail this call together (no
  // rank enqueues work that waits for another) and keep their previous buffers, in step.
  int failed = -1;
  for (int q = 0; q < s.nranks && failed < 0; ++q) {
    if (all[q].recv_bytes == 0) failed = q;
  }
  Status problem = Status::Ok();
  if (failed >= 0) {
    problem = failed == s.rank
                  ? allocated
                  : Status::Internal("rank " + std::to_string(failed) + " of the group could "
                                     "not allocate its " + kRecv + " (its own error says why); "
                                     "every rank fails this call");
  }
  void* new_recv[kMaxCopyEngineRanks] = {};
  CopyEngineFlags* new_flags[kMaxCopyEngineRanks] = {};
  bool ipc[kMaxCopyEngineRanks] = {};
  bool opened_recv[kMaxCopyEngineRanks] = {};
  bool opened_flags[kMaxCopyEngineRanks] = {};
  if (problem.ok()) {
    problem = MapPeers(s, b, mine, all, new_recv, new_flags, ipc, opened_recv, opened_flags);
    if (!problem.ok() && !export_problem.empty()) {
      problem = Status::Internal(problem.message() + " [this rank's export: " + export_problem +
                                 "]");
    }
  }
  // The routes and mappings are each rank's own findings (a hidden GPU, a failed mapping):
  // a second all-gather shows every rank every outcome, so they fail or commit together.
  const int32_t verdict = problem.ok() ? 0 : 1;
  std::vector<int32_t> verdicts(s.nranks, 0);
  FO_JAX_RETURN_IF_ERROR(AllGatherToHost(s, &verdict, sizeof(verdict), verdicts.data(),
                                         "copy-engine mapping verdicts"));
  for (int q = 0; q < s.nranks && problem.ok(); ++q) {
    if (verdicts[q] != 0) {
      problem = Status::Internal("rank " + std::to_string(q) + " of the group could not reach "
                                 "its peers' copy-engine memory (its own error says why); "
                                 "every rank fails this call");
    }
  }
  if (!problem.ok()) {
    // Nothing is committed, so the next call grows again, collectively. The mappings opened
    // here were never used. Freeing the unused new buffer synchronizes this GPU: safe for the
    // reason given below for the superseded one.
    for (int q = 0; q < s.nranks; ++q) {
      if (opened_recv[q]) ClosePeerMemory(new_recv[q]);
      if (opened_flags[q]) ClosePeerMemory(new_flags[q]);
    }
    if (recv != nullptr) (void)DeviceFree(s.device, kRecv, capacity, recv);
    return problem;
  }
  // The superseded buffer: no call uses it any more. This rank's band sums (and the ring's
  // GEMM) read it only in earlier calls; the peers' copies wrote it only in earlier calls (their
  // jobs were all enqueued before they joined the exchange, and each of those calls' band sums
  // here waits for the copies' arrival flags). cudaFree synchronizes this GPU, which therefore
  // waits only for work that is already enqueued on every GPU of the group.
  void* const old = b.recv;
  const size_t old_bytes = b.recv_bytes;
  void* old_peer_recv[kMaxCopyEngineRanks] = {};
  b.recv = recv;
  b.recv_bytes = capacity;
  for (int q = 0; q < s.nranks; ++q) {
    if (q == s.rank) continue;
    if (b.peer_ipc[q]) old_peer_recv[q] = b.peer_recv[q];
    b.peer_recv[q] = new_recv[q];
    b.peer_flags[q] = new_flags[q];
    b.peer_ipc[q] = ipc[q];
  }
  // A failure to free leaves the buffer counted as held; the call itself goes on (the peers
  // already use the new addresses).
  if (old != nullptr) (void)DeviceFree(s.device, kRecv, old_bytes, old);
  // This process's mappings of the peers' superseded buffers, closed where their owners free
  // them: only this GPU's copies of earlier calls wrote through them, and the cudaFree above
  // synchronized this GPU, so none is still in flight.
  for (int q = 0; q < s.nranks; ++q) ClosePeerMemory(old_peer_recv[q]);
  return Status::Ok();
}

void OutputAddressesForPeers(const CopyEngineBuffers& b, int P, const void* out, uint64_t* at) {
  const uint64_t own = reinterpret_cast<uint64_t>(out);
  for (int q = 0; q < P; ++q) {
    at[q] = b.peer_ipc[q] && b.out_pools_mapped
                ? own - b.out_pools.own_base + b.out_pools.at_peer[q]
                : own;
  }
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
