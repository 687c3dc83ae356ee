// See comm_registry.h. Communicator creation also warms NCCL up (connections, kernels) with
// small collectives on its own buffer, so the first overlapped call does not set up connections
// or load modules while the GEMM holds the GPU.
#include "comm/comm_registry.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/copy_engine.h"
#include "comm/copy_engine_watchdog.h"
#include "comm/device_memory.h"
#include "comm/stream_wait.h"

namespace fo_jax {
namespace {

struct Entry {
  std::once_flag once;
  std::unique_ptr<CommState> state;
  std::string error;
};

using Key = std::tuple<int, std::string, int, int, int, int, int>;

std::mutex g_mutex;  // the registry and the group map
std::atomic<int> g_injected_async_error{ncclSuccess};
std::atomic<int> g_injected_rank{-1};
std::atomic<bool> g_injected_broken{false};
std::map<Key, std::shared_ptr<Entry>>& Registry() {
  static auto* registry = new std::map<Key, std::shared_ptr<Entry>>();  // never destroyed:
  return *registry;  // communicators outlive static destruction order at exit
}

std::string NcclMessage(const char* what, ncclResult_t r, ncclComm_t comm) {
  return NcclStatus(r, what, comm).message();
}

// Warm-up: every (collective, dtype) the overlap issues, at a small and a mid size, so that
// NCCL's runtime connection setup for the protocols it picks happens here, not mid-overlap.
std::string WarmUp(CommState& s) {
  constexpr size_t kElems = kScratchBytesPerRank / 2;  // 16-bit values per rank chunk
  void* buf = nullptr;
  const Status allocated = DeviceAlloc(s.device, "NCCL warm-up buffer", kElems * 2 * s.nranks,
                                       &buf);
  if (!allocated.ok()) return allocated.message();
  // Kept, not freed: cudaFree would synchronize the whole device, and the communicator is
  // created inside a call, while other work on this GPU may wait for the group's other ranks.
  // Kept as the state's scratch, too (comm_registry.h).
  s.scratch = buf;
  for (ncclDataType_t dt : {ncclBfloat16, ncclFloat16}) {
    for (size_t count : {size_t{1024}, kElems}) {
      ncclResult_t r = ncclGroupStart();
      // In-place reduce-scatter: this rank's chunk of the send buffer is the receive buffer.
      void* chunk = static_cast<char*>(buf) + static_cast<size_t>(s.rank) * count * 2;
      if (r == ncclSuccess) r = ncclReduceScatter(buf, chunk, count, dt, ncclSum, s.comm, s.stream);
      if (r == ncclSuccess) r = ncclAllReduce(buf, buf, count, dt, ncclSum, s.comm, s.stream);
      if (r == ncclSuccess) r = ncclGroupEnd();
      if (r != ncclSuccess) return NcclMessage("NCCL warm-up", r, s.comm);
    }
  }
  if (cudaStreamSynchronize(s.stream) != cudaSuccess) return "synchronizing the NCCL warm-up";
  return "";
}

std::string Create(CommState& s, const ncclUniqueId& id, const CommOptions& options) {
  if (cudaSetDevice(s.device) != cudaSuccess) return "cudaSetDevice";
  int least = 0, greatest = 0;
  if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) return "priority range";
  if (cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking, greatest) != cudaSuccess) {
    return "creating the comm stream";
  }
  if (cudaEventCreateWithFlags(&s.inputs_ready, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&s.comm_done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&s.progress, cudaEventDisableTiming) != cudaSuccess) {
    return "creating events";
  }
  const Status wait = PrepareStreamWait();
  if (!wait.ok()) return wait.message();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
  if (options.min_ctas > 0) config.minCTAs = options.min_ctas;
  if (options.cga_cluster_size > 0) config.cgaClusterSize = options.cga_cluster_size;
  ncclResult_t r = ncclCommInitRankConfig(&s.comm, s.nranks, id, s.rank, &config);
  if (r != ncclSuccess) return NcclMessage("ncclCommInitRankConfig", r, nullptr);
  const std::string warm_up = WarmUp(s);
  if (!warm_up.empty()) return warm_up;
  // Allocated with the communicator, for the same reason as the warm-up buffer: never inside a
  // later call, where another GPU's work may wait for this one.
  void* words = nullptr;
  const Status counters = DeviceAlloc(s.device, "GEMM group counters", kGroupCounterBytes, &words);
  if (!counters.ok()) return counters.message();
  s.counters.words = static_cast<uint32_t*>(words);
  return "";
}

}  // namespace

struct CommGroup {
  int index = 0;                    // in creation order, for diagnostics
  std::mutex mu;                    // failure, members
  std::string failure;              // "" while healthy
  std::vector<CommState*> members;  // created states of this process (never destroyed)
};

namespace {

// Groups by unique id (every rank of a communicator clique has the same one).
std::map<std::string, std::shared_ptr<CommGroup>>& Groups() {
  static auto* groups = new std::map<std::string, std::shared_ptr<CommGroup>>();
  return *groups;
}

bool Injected(const CommState& s) {
  const int rank = g_injected_rank.load(std::memory_order_relaxed);
  return g_injected_async_error.load(std::memory_order_relaxed) != ncclSuccess &&
         (rank < 0 || rank == s.rank);
}

// The communicator's own asynchronous error (ncclCommGetAsyncError) as a message, "" when none.
std::string NcclAsyncError(const CommState& s) {
  if (s.aborted || s.comm == nullptr) return "";
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(s.comm, &async);
  if (r != ncclSuccess) return NcclMessage("ncclCommGetAsyncError", r, s.comm);
  if (async != ncclSuccess && async != ncclInProgress) {
    return NcclMessage("NCCL (asynchronous)", async, s.comm);
  }
  return "";
}

// This rank's asynchronous error, injected or NCCL's, as a message; "" when none.
std::string OwnAsyncError(const CommState& s) {
  if (Injected(s)) {
    return NcclMessage("NCCL (asynchronous)",
                       static_cast<ncclResult_t>(g_injected_async_error.load()), nullptr) +
           " [injected by fo_jax's test hook]";
  }
  return NcclAsyncError(s);
}

// Fails the group with `failure` unless it failed already (the first failure is kept).
void FailGroup(CommGroup& g, const std::string& failure) {
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.failure.empty()) g.failure = failure;
}

std::string Describe(const CommState& s) {
  return "rank " + std::to_string(s.rank) + " (GPU " + std::to_string(s.device) +
         ") of an fo_jax communicator of " + std::to_string(s.nranks) + " ranks";
}

}  // namespace

Status AllGatherToHost(CommState& s, const void* mine, size_t bytes, void* all,
                       const std::string& what) {
  if (bytes > kScratchBytesPerRank || s.scratch == nullptr) {
    return Status::Internal(what + ": " + std::to_string(bytes) + " bytes per rank do not fit "
                            "the communicator's scratch");
  }
  char* slots = static_cast<char*>(s.scratch);
  cudaError_t e = cudaMemcpyAsync(slots + s.rank * bytes, mine, bytes, cudaMemcpyHostToDevice,
                                  s.stream);
  FO_JAX_RETURN_IF_ERROR(CudaStatus(e, what));
  FO_JAX_RETURN_IF_ERROR(NcclStatus(
      ncclAllGather(slots + s.rank * bytes, slots, bytes, ncclUint8, s.comm, s.stream),
      what + " (ncclAllGather)", s.comm));
  e = cudaMemcpyAsync(all, slots, s.nranks * bytes, cudaMemcpyDeviceToHost, s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  return CudaStatus(e, what);
}

Status GetOrCreateCommState(int device, const ncclUniqueId& id, int nranks, int rank,
                            const CommOptions& options, CommState** state_out) {
  Key key{device, std::string(id.internal, sizeof(id.internal)), nranks, rank, options.max_ctas,
          options.min_ctas, options.cga_cluster_size};
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto& slot = Registry()[key];
    if (!slot) slot = std::make_shared<Entry>();
    entry = slot;
  }
  // Outside the registry lock: creation blocks until all ranks of the group arrive, and the other
  // local devices' threads need the registry meanwhile.
  std::call_once(entry->once, [&] {
    auto state = std::make_unique<CommState>();
    state->device = device;
    state->nranks = nranks;
    state->rank = rank;
    state->options = options;
    std::string err = Create(*state, id, options);
    if (err.empty()) {
      std::lock_guard<std::mutex> lock(g_mutex);
      auto& group = Groups()[std::string(id.internal, sizeof(id.internal))];
      if (!group) {
        group = std::make_shared<CommGroup>();
        group->index = static_cast<int>(Groups().size()) - 1;
      }
      state->group = group;
      std::lock_guard<std::mutex> members(group->mu);
      group->members.push_back(state.get());
      entry->state = std::move(state);
    } else {
      entry->error = "creating the fo_jax NCCL communicator (device " + std::to_string(device) +
                     ", rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                     "): " + err;
    }
  });
  if (!entry->state) return Status::Internal(entry->error);
  *state_out = entry->state.get();
  return Status::Ok();
}

std::string CommGroupFailure(CommState& s) {
  const std::string own = OwnAsyncError(s);
  if (!own.empty()) FailGroup(*s.group, own + " on " + Describe(s));
  std::lock_guard<std::mutex> lock(s.group->mu);
  return s.group->failure;
}

void FailCommGroup(CommState& s, const std::string& failure) { FailGroup(*s.group, failure); }

bool CommUsable(const CommState& s) {
  if (s.aborted || s.comm == nullptr) return false;
  if (Injected(s) && g_injected_broken.load(std::memory_order_relaxed)) return false;
  return NcclAsyncError(s).empty();
}

void AbortCommGroup(CommState& s) {
  std::vector<CommState*> members;
  {
    std::lock_guard<std::mutex> lock(s.group->mu);
    members = s.group->members;
  }
  for (CommState* m : members) {
    std::unique_lock<std::timed_mutex> lock(m->mu, std::defer_lock);
    (void)lock.try_lock_for(std::chrono::seconds(2));
    if (m->aborted) continue;
    // ncclCommAbort needs the communicator's device current on this thread.
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(m->device);
    (void)ncclCommAbort(m->comm);
    m->comm = nullptr;
    m->aborted = true;
    if (previous >= 0) (void)cudaSetDevice(previous);
  }
}

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::atomic<double> g_timeout_s{0.0};  // SetCommTimeoutSeconds (0: off)

// Whether `m`'s latest recorded call, recorded at `stamp`, is still running; a query error
// counts as not (it is the next call's to report).
bool StillRunning(CommState& m, int64_t stamp) {
  if (cudaSetDevice(m.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const cudaError_t q = cudaEventQuery(m.progress);
  if (q != cudaErrorNotReady) {
    if (q != cudaSuccess) (void)cudaGetLastError();
    return false;
  }
  (void)cudaGetLastError();
  return m.progress_ns.load() == stamp;  // a call recorded in between is a new one
}

std::string Seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

// The copy-engine transport's side of a pass (copy_engine_watchdog.h), for a group whose member
// `stuck` has run past the limit: every local member still running is released (again, if it
// recorded calls since its last release); one released a limit ago whose latest call is still
// the one it was released at ends the process.
void ReleaseCopyEngineGroup(CommGroup& group, const std::vector<CommState*>& members,
                            CommState& stuck, double timeout) {
  FailGroup(group, "no progress for " + Seconds(timeout) + " s on " + Describe(stuck) +
                       ": another rank failed or stopped calling (FO_JAX_COMM_TIMEOUT_S sets "
                       "the limit; 0 waits, as XLA's collectives do); the copy-engine "
                       "transport's waits of the group's pending calls were released");
  for (CommState* m : members) {
    const int64_t stamp = m->progress_ns.load();
    if (stamp == 0 || !StillRunning(*m, stamp)) {
      m->released_ns.store(0);  // its calls completed: a later stall starts afresh
      continue;
    }
    const int64_t released = m->released_ns.load();
    if (released != 0 && m->released_stamp.load() == stamp) {
      if (double(NowNs() - released) >= timeout * 1e9) {
        EndStuckProcess("a copy-engine call on " + Describe(*m) + " was still waiting " +
                        Seconds(timeout) + " s after the progress watchdog released it");
      }
      continue;
    }
    // Not released yet, or calls were recorded since the release: release through its latest.
    if (m->copy_engine) {
      uint32_t through = 0;
      const Status r = ReleaseStuckCopyEngineRank(*m, &through);
      if (!r.ok()) {
        std::fprintf(stderr, "fo_jax: %s on %s\n", r.message().c_str(), Describe(*m).c_str());
      }
    }
    // The copy-engine all-gather has no state here: its copy threads release its waits after
    // the same limit (all_gather_copy_engine.cc); the end of the process covers the rest.
    m->released_stamp.store(stamp);
    m->released_ns.store(NowNs());
  }
}

// One pass over every communicator of this process: a call recorded more than `timeout` ago and
// still running fails its group, and aborts it (NCCL) or releases it (copy engine).
void CheckProgress(double timeout) {
  std::vector<std::shared_ptr<CommGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& [id, group] : Groups()) groups.push_back(group);
  }
  for (auto& group : groups) {
    std::vector<CommState*> members;
    {
      std::lock_guard<std::mutex> lock(group->mu);
      members = group->members;
    }
    for (CommState* m : members) {
      const int64_t stamp = m->progress_ns.load();
      if (m->aborted || stamp == 0 || double(NowNs() - stamp) < timeout * 1e9) continue;
      if (!StillRunning(*m, stamp)) continue;
      if (m->copy_engine_call.load()) {
        ReleaseCopyEngineGroup(*group, members, *m, timeout);
        break;
      }
      FailGroup(*group, "no progress for " + Seconds(timeout) + " s on " + Describe(*m) +
                            ": another rank failed or stopped calling (FO_JAX_COMM_TIMEOUT_S "
                            "sets the limit; 0 waits, as XLA's collectives do)");
      AbortCommGroup(*m);
      break;
    }
  }
}

std::atomic<bool> g_watchdog_stop{false};
std::thread* g_watchdog = nullptr;

void StopWatchdog() {
  g_watchdog_stop.store(true);
  if (g_watchdog != nullptr && g_watchdog->joinable()) g_watchdog->join();
}

void StartWatchdogOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const double timeout = g_timeout_s.load();
    if (timeout <= 0) return;
    g_watchdog = new std::thread([timeout] {
      const auto period = std::chrono::milliseconds(timeout < 10 ? 100 : 1000);
      while (!g_watchdog_stop.load()) {
        std::this_thread::sleep_for(period);
        if (!g_watchdog_stop.load()) CheckProgress(timeout);
      }
    });
    std::atexit(StopWatchdog);  // joined before the CUDA runtime tears down
  });
}

}  // namespace

void SetCommTimeoutSeconds(double seconds) { g_timeout_s.store(seconds > 0 ? seconds : 0.0); }
double CommTimeoutSeconds() { return g_timeout_s.load(); }

std::vector<std::pair<std::string, std::string>> FailedGroups() {
  std::vector<std::pair<std::string, std::string>> failed;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [id, group] : Groups()) {
    std::lock_guard<std::mutex> members(group->mu);
    if (!group->failure.empty()) failed.emplace_back(id, group->failure);
  }
  return failed;
}

void AbortGroupForKnownFailure(const std::string& id, const std::string& failure) {
  std::shared_ptr<CommGroup> group;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = Groups().find(id);
    if (it == Groups().end()) return;
    group = it->second;
  }
  CommState* first = nullptr;
  bool copy_engine = false;
  {
    std::lock_guard<std::mutex> lock(group->mu);
    if (group->members.empty()) return;
    first = group->members.front();
    for (CommState* m : group->members) copy_engine = copy_engine || m->copy_engine_calls.load();
  }
  FailGroup(*group, failure);
  // The copy engine's calls keep running in step after a failure (a failed call releases its
  // flags: failed_call.h) and wait on flags, not in NCCL: an abort would stop this side only,
  // and the other side would then wait for it. Its failed group raises on every later call.
  if (!copy_engine) AbortCommGroup(*first);  // skips the members already aborted
}

Status NoteCallEnd(CommState& s, cudaStream_t stream, bool copy_engine) {
  // Off (the default): nothing reads the mark, so no call pays for an event record.
  if (g_timeout_s.load() <= 0) return Status::Ok();
  FO_JAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(s.progress, stream),
                                    "recording the call's progress event"));
  s.copy_engine_call.store(copy_engine);
  s.progress_ns.store(NowNs());
  StartWatchdogOnce();
  return Status::Ok();
}

void InjectAsyncErrorForTests(int code, int rank, bool broken) {
  g_injected_rank.store(rank);
  g_injected_broken.store(broken);
  g_injected_async_error.store(code);
  if (code != ncclSuccess) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [id, group] : Groups()) {
    std::lock_guard<std::mutex> members(group->mu);
    bool aborted = false;
    for (CommState* m : group->members) aborted = aborted || m->aborted;
    if (!aborted) group->failure.clear();  // an aborted group stays failed
  }
}

void ClearCommGroupFailureForTests(CommState& s) {
  std::lock_guard<std::mutex> lock(s.group->mu);
  if (!s.aborted) s.group->failure.clear();
}

std::vector<CommState*> AllCommStatesForDebug() {
  std::vector<CommState*> all;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [key, entry] : Registry()) {
    if (entry->state) all.push_back(entry->state.get());
  }
  return all;
}

int CommGroupIndex(const CommState& state) { return state.group ? state.group->index : -1; }

}  // namespace fo_jax
