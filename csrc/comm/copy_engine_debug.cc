// See copy_engine_debug.h.
#include "comm/copy_engine_debug.h"

#include <chrono>
#include <cstddef>
#include <mutex>
#include <thread>

#include "comm/comm_registry.h"
#include "comm/copy_engine.h"

namespace fo_jax {

CopyEngineCounts CountCopyEngineCopies(CommState& s) {
  std::lock_guard<std::timed_mutex> lock(s.mu);
  if (!s.copy_engine) return {};
  DrainCopyWorker(s);  // the calls made so far have enqueued their copies
  const CopyGraphs& g = s.copy_engine->graphs;
  return {g.copies.load(), g.built.load(), g.updates.load()};
}

std::string DescribeCopyEngineForDebug(CommState& s) {
  std::string text = "GPU " + std::to_string(s.device) + " rank " + std::to_string(s.rank) + "/" +
                     std::to_string(s.nranks);
  std::unique_lock<std::timed_mutex> lock(s.mu, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::milliseconds(200))) text += " [a call holds mu]";
  if (!s.copy_engine) return text + " (no copy-engine state)";
  CopyEngineState& ce = *s.copy_engine;
  CopyEngineDebug& d = ce.debug;
  text += " epoch " + std::to_string(ce.epoch.load()) + ", " +
          std::to_string(ce.graphs.copies.load()) + " copies, " +
          std::to_string(ce.graphs.built.load()) + " copy graphs built";
  {
    std::lock_guard<std::mutex> failure_lock(ce.worker.failure_mu);
    if (!ce.worker.failure.empty()) text += " [" + ce.worker.failure + "]";
  }
  // Read on a stream of its own into pinned memory kept for this (never freed: cudaFreeHost
  // and cudaStreamDestroy wait for the GPU to drain, which a hung GPU never does). The reads
  // are cudaMemcpyAsync calls, which block while another thread waits for this GPU to drain
  // with a driver lock held (copy_engine_graphs.h): the caller reads on a thread it can abandon.
  static std::mutex reader;
  std::unique_lock<std::mutex> one_reader(reader, std::try_to_lock);
  if (!one_reader.owns_lock()) return text + " (another read is in progress)";
  constexpr size_t kFlagBytes = sizeof(CopyEngineFlags);
  const int groups = d.last_counters ? d.last_num_groups : 0;
  if (cudaSetDevice(s.device) != cudaSuccess) return text + " (cudaSetDevice failed)";
  if (!d.host && cudaHostAlloc(&d.host, kFlagBytes + kMaxGemmGroups * sizeof(uint32_t),
                               cudaHostAllocDefault) != cudaSuccess) {
    d.host = nullptr;
  }
  if (d.host && !d.stream &&
      cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking) != cudaSuccess) {
    d.stream = nullptr;
  }
  auto* flags = static_cast<CopyEngineFlags*>(d.host);
  auto* counters = reinterpret_cast<uint32_t*>(static_cast<char*>(d.host) + kFlagBytes);
  if (!d.host || !d.stream ||
      cudaMemcpyAsync(flags, ce.buffers.flags, kFlagBytes, cudaMemcpyDeviceToHost, d.stream) !=
          cudaSuccess ||
      (groups > 0 && cudaMemcpyAsync(counters, d.last_counters, groups * sizeof(uint32_t),
                                     cudaMemcpyDeviceToHost, d.stream) != cudaSuccess)) {
    (void)cudaGetLastError();
    return text + " (flags: CUDA call failed)";
  }
  bool done = false;
  for (int i = 0; i < 100 && !done; ++i) {
    done = cudaStreamQuery(d.stream) == cudaSuccess;
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!done) return text + " (flags: the read did not finish within a second)";
  auto list = [&](const char* name, const uint32_t* v, int n) {
    text += std::string(" ") + name + "[";
    for (int i = 0; i < n; ++i) text += (i ? "," : "") + std::to_string(v[i]);
    text += "]";
  };
  const int P = s.nranks;
  list("arrived", flags->arrived, 4 * (P - 1));  // every slot rounds <= 4 use
  list("acked", flags->recv_acked, P);
  list("stored", flags->stored, P);
  list("out_ready", flags->out_ready, P);
  list("own_copies", &flags->own_copies, 1);
  list("last_pieces", flags->last_pieces, kMaxRowPieces);
  list("ring_arrived", flags->ring_arrived, groups > 1 ? groups : 1);
  if (groups > 0) {  // the latest call's GEMM progress (a later call's adds to it)
    list("last_call_counters", counters, groups);
    list("of", d.last_expected, groups);
  }
  return text;
}

}  // namespace fo_jax
