// See copy_engine_buffers.h.
#include "comm/copy_engine_buffers.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "comm/copy_engine.h"
#include "comm/device_memory.h"

namespace fo_jax {
namespace {

constexpr char kRecv[] = "copy-engine receive buffer";

std::atomic<uint32_t> g_test_epoch_start{0};
std::atomic<int> g_fail_recv_alloc_rank{-1};

// One rank's entry of the address all-gather.
struct PeerInfo {
  uint64_t recv;
  uint64_t flags;
  uint64_t recv_bytes;  // the new buffer's size (0: this rank's allocation failed)
  int32_t pid;
  int32_t device;
};

}  // namespace

void SetTestEpochStartForTests(uint32_t start) { g_test_epoch_start.store(start); }
void SetFailReceiveAllocForTests(int rank) { g_fail_recv_alloc_rank.store(rank); }

Status CreateCopyEngineBuffers(CommState& s, CopyEngineBuffers& b) {
  FO_JAX_RETURN_IF_ERROR(DeviceAlloc(s.device, "copy-engine flags", sizeof(CopyEngineFlags),
                                     reinterpret_cast<void**>(&b.flags)));
  FO_JAX_RETURN_IF_ERROR(DeviceAlloc(s.device, "copy-engine address exchange",
                                     kMaxCopyEngineRanks * sizeof(PeerInfo), &b.exchange));
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
  return CudaStatus(e, "setting the copy-engine flags");
}

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
  PeerInfo mine{reinterpret_cast<uint64_t>(recv), reinterpret_cast<uint64_t>(b.flags),
                allocated.ok() ? uint64_t{capacity} : 0, static_cast<int32_t>(getpid()),
                s.device};
  auto* slots = static_cast<PeerInfo*>(b.exchange);
  std::vector<PeerInfo> all(s.nranks);
  cudaError_t e =
      cudaMemcpyAsync(slots + s.rank, &mine, sizeof(PeerInfo), cudaMemcpyHostToDevice, s.stream);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "address exchange"));
  FO_JAX_RETURN_IF_ERROR(NcclStatus(
      ncclAllGather(slots + s.rank, slots, sizeof(PeerInfo), ncclUint8, s.comm, s.stream),
      "address exchange (ncclAllGather)", s.comm));
  e = cudaMemcpyAsync(all.data(), slots, s.nranks * sizeof(PeerInfo), cudaMemcpyDeviceToHost,
                      s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, "address exchange"));
  // Every rank sees every rank's outcome, so all of them fail this call together (no rank
  // enqueues work that waits for another) and keep their previous buffers, in step.
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
  for (int q = 0; q < s.nranks && problem.ok(); ++q) {
    if (q == s.rank) continue;
    if (all[q].pid != mine.pid) {
      problem = Status::Internal("the copy-engine transport needs every rank in one process "
                                 "(rank " + std::to_string(q) + " is in another); use "
                                 "OverlapConfig(transport='nccl')");
      break;
    }
    int ok = 0;
    e = cudaDeviceCanAccessPeer(&ok, s.device, all[q].device);
    if (e != cudaSuccess || !ok) {
      (void)cudaGetLastError();
      problem = Status::Internal("GPU " + std::to_string(s.device) + " cannot access GPU " +
                                 std::to_string(all[q].device) + " directly (no peer access); "
                                 "use OverlapConfig(transport='nccl')");
      break;
    }
    e = cudaDeviceEnablePeerAccess(all[q].device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else if (e != cudaSuccess) {
      problem = CudaStatus(e, "enabling peer access");
    }
  }
  if (!problem.ok()) {
    // Nothing is committed, so the next call grows again, collectively. Freeing the unused new
    // buffer synchronizes this GPU: safe for the reason given below for the superseded one.
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
  b.recv = recv;
  b.recv_bytes = capacity;
  for (int q = 0; q < s.nranks; ++q) {
    if (q == s.rank) continue;
    b.peer_recv[q] = reinterpret_cast<void*>(all[q].recv);
    b.peer_flags[q] = reinterpret_cast<CopyEngineFlags*>(all[q].flags);
  }
  // A failure to free leaves the buffer counted as held; the call itself goes on (the peers
  // already use the new addresses).
  (void)DeviceFree(s.device, kRecv, old_bytes, old);
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
