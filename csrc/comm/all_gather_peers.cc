// See all_gather_peers.h.
#include "comm/all_gather_peers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/peer_memory_ipc.h"

namespace fo_jax {
namespace {

// How long a rank waits for rank 0's segment: every rank reaches it in the same call, right
// after an all-gather, so only a broken peer takes this long.
constexpr int kOpenTimeoutMs = 60000;
constexpr int kNameBytes = 64;

struct Whereabouts {
  uint64_t host;  // HostIdentity()
  int32_t pid;
  int32_t reserved;
};
static_assert(std::is_trivially_copyable<Whereabouts>::value, "travels as raw bytes");

// One rank's entry of the connection's all-gather: its outcome so far, the segment's name (rank
// 0's counts) and its ring's IPC handles.
struct Hello {
  int32_t ok;
  int32_t reserved;
  char name[kNameBytes];
  unsigned char handles[kAgRing][kAgEventHandleBytes];
};
static_assert(std::is_trivially_copyable<Hello>::value, "travels as raw bytes");

// Random past the pid and the group's count: a name left behind by a process that ended
// between creating and removing it cannot block a later process given the same pid.
std::string SegmentName() {
  static std::atomic<int> groups{0};
  std::random_device random;
  char tag[17];
  std::snprintf(tag, sizeof(tag), "%08x%08x", random(), random());
  return "/fo_jax_ag_" + std::to_string(getpid()) + "_" + std::to_string(groups++) + "_" + tag;
}

const char kNccl[] = "; use OverlapConfig(transport='nccl') for this all-gather";

}  // namespace

Status AllGatherProcessLayout(CommState& s, bool other_process[kMaxCopyEngineRanks], bool* any) {
  Whereabouts mine{HostIdentity(), static_cast<int32_t>(getpid()), 0};
  std::vector<Whereabouts> all(s.nranks);
  FO_JAX_RETURN_IF_ERROR(AllGatherToHost(s, &mine, sizeof(Whereabouts), all.data(),
                                         "all-gather process layout"));
  *any = false;
  for (int q = 0; q < s.nranks; ++q) {
    if (all[q].host != mine.host) {
      return Status::Internal("rank " + std::to_string(q) + " of the all-gather's group runs on "
                              "another host: the copy engine reaches only GPUs of one host" +
                              std::string(kNccl));
    }
    other_process[q] = all[q].pid != mine.pid;
    *any = *any || other_process[q];
  }
  return Status::Ok();
}

Status ConnectAllGatherPeers(CommState& s, const void* gathered, uint64_t gathered_bytes,
                             const cudaEvent_t own_events[kAgRing],
                             const bool other_process[kMaxCopyEngineRanks],
                             std::unique_ptr<AgExchange>* exchange, AgPeers* peers) {
  const int P = s.nranks, me = s.rank;
  AgPeers found;
  for (int q = 0; q < P; ++q) found.other_process[q] = other_process[q];
  FO_JAX_RETURN_IF_ERROR(MapPeerPools(s, gathered, gathered_bytes, "all-gather", &found.pools));

  Hello mine{};
  Status problem = Status::Ok();
  std::string name;
  std::unique_ptr<AgExchange> ex;
  if (me == 0) {
    name = SegmentName();
    const std::string why = AgExchange::OpenShared(name, P, me, /*create=*/true, kOpenTimeoutMs,
                                                   &ex);
    if (!why.empty()) problem = Status::Internal(why);
  }
  for (int slot = 0; slot < kAgRing && problem.ok(); ++slot) {
    cudaIpcEventHandle_t handle;
    problem = CudaStatus(cudaIpcGetEventHandle(&handle, own_events[slot]),
                         "exporting the all-gather's events");
    if (problem.ok()) std::memcpy(mine.handles[slot], &handle, kAgEventHandleBytes);
  }
  mine.ok = problem.ok() ? 1 : 0;
  std::strncpy(mine.name, name.c_str(), kNameBytes - 1);
  std::vector<Hello> all(P);
  const Status named =
      AllGatherToHost(s, &mine, sizeof(Hello), all.data(), "all-gather exchange names");
  if (!named.ok()) {
    if (me == 0 && !name.empty()) (void)shm_unlink(name.c_str());
    return named;
  }
  for (int q = 0; q < P && problem.ok(); ++q) {
    if (!all[q].ok) {
      problem = Status::Internal("rank " + std::to_string(q) + " of the group could not " +
                                 (q == 0 ? "create the group's exchange" : "export its events") +
                                 " (its own error says why)");
    }
  }
  const std::string segment(all[0].name, strnlen(all[0].name, kNameBytes));
  if (problem.ok() && me != 0) {
    const std::string why =
        AgExchange::OpenShared(segment, P, me, /*create=*/false, kOpenTimeoutMs, &ex);
    if (!why.empty()) problem = Status::Internal(why);
  }
  for (int q = 0; q < P && problem.ok(); ++q) {
    if (!other_process[q]) continue;
    for (int slot = 0; slot < kAgRing && problem.ok(); ++slot) {
      cudaIpcEventHandle_t handle;
      std::memcpy(&handle, all[q].handles[slot], kAgEventHandleBytes);
      problem = CudaStatus(cudaIpcOpenEventHandle(&found.events[q][slot], handle),
                           "opening rank " + std::to_string(q) + "'s all-gather events");
    }
  }
  const int32_t verdict = problem.ok() ? 1 : 0;
  std::vector<int32_t> verdicts(P, 0);
  const Status gathered_verdicts = AllGatherToHost(s, &verdict, sizeof(verdict), verdicts.data(),
                                                   "all-gather exchange verdicts");
  // Every rank that could open the segment has by now (or has failed): its name goes, so that
  // nothing is left in /dev/shm whatever happened (the mappings stay).
  if (me == 0 && !segment.empty()) (void)shm_unlink(segment.c_str());
  FO_JAX_RETURN_IF_ERROR(gathered_verdicts);
  for (int q = 0; q < P && problem.ok(); ++q) {
    if (!verdicts[q]) {
      problem = Status::Internal("rank " + std::to_string(q) + " of the group could not join "
                                 "the group's exchange (its own error says why)");
    }
  }
  if (!problem.ok()) {
    return Status::Internal("the copy-engine all-gather across processes: " + problem.message() +
                            "; every rank fails this call" + kNccl);
  }
  *exchange = std::move(ex);
  *peers = found;
  return Status::Ok();
}

}  // namespace fo_jax
