// See comm_registry.h. Communicator creation also warms NCCL up (connections, kernels) with
// small collectives on its own buffer, so the first overlapped call does not set up connections
// or load modules while the GEMM holds the GPU.
#include "comm/comm_registry.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "comm/stream_wait.h"

namespace fo_jax {
namespace {

struct Entry {
  std::once_flag once;
  std::unique_ptr<CommState> state;
  std::string error;
};

using Key = std::tuple<int, std::string, int, int, int, int, int>;

std::mutex g_mutex;
std::atomic<int> g_injected_async_error{ncclSuccess};
std::map<Key, std::shared_ptr<Entry>>& Registry() {
  static auto* registry = new std::map<Key, std::shared_ptr<Entry>>();  // never destroyed:
  return *registry;  // communicators outlive static destruction order at exit
}

std::string NcclMessage(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last) msg += std::string(" (") + last + ")";
  }
  return msg;
}

// Warm-up: every (collective, dtype) the overlap issues, at a small and a mid size, so that
// NCCL's runtime connection setup for the protocols it picks happens here, not mid-overlap.
std::string WarmUp(CommState& s) {
  constexpr size_t kElems = size_t{1} << 21;  // 4 MiB of 16-bit values per rank chunk
  void* buf = nullptr;
  if (cudaMalloc(&buf, kElems * 2 * s.nranks) != cudaSuccess) return "cudaMalloc for warm-up";
  // Kept, not freed: cudaFree would synchronize the whole device.
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
      cudaEventCreateWithFlags(&s.comm_done, cudaEventDisableTiming) != cudaSuccess) {
    return "creating events";
  }
  std::string err;
  if (PrepareStreamWait(&err) != cudaSuccess) return err;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
  if (options.min_ctas > 0) config.minCTAs = options.min_ctas;
  if (options.cga_cluster_size > 0) config.cgaClusterSize = options.cga_cluster_size;
  ncclResult_t r = ncclCommInitRankConfig(&s.comm, s.nranks, id, s.rank, &config);
  if (r != ncclSuccess) return NcclMessage("ncclCommInitRankConfig", r, nullptr);
  return WarmUp(s);
}

}  // namespace

CommState* GetOrCreateCommState(int device, const ncclUniqueId& id, int nranks, int rank,
                                const CommOptions& options, std::string* error) {
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
    std::string err = Create(*state, id, options);
    if (err.empty()) {
      entry->state = std::move(state);
    } else {
      entry->error = "creating the fo_jax NCCL communicator (device " + std::to_string(device) +
                     ", rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                     "): " + err;
    }
  });
  if (!entry->state) {
    if (error) *error = entry->error;
    return nullptr;
  }
  return entry->state.get();
}

std::string CommAsyncError(const CommState& state) {
  const int injected = g_injected_async_error.load(std::memory_order_relaxed);
  if (injected != ncclSuccess) {
    return NcclMessage("NCCL (asynchronous)", static_cast<ncclResult_t>(injected), nullptr) +
           " [injected by fo_jax's test hook]";
  }
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(state.comm, &async);
  if (r != ncclSuccess) return NcclMessage("ncclCommGetAsyncError", r, state.comm);
  if (async != ncclSuccess && async != ncclInProgress) {
    return NcclMessage("NCCL (asynchronous)", async, state.comm);
  }
  return "";
}

void InjectAsyncErrorForTests(int code) {
  g_injected_async_error.store(code, std::memory_order_relaxed);
}

}  // namespace fo_jax
