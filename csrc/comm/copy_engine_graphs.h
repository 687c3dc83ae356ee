// The copy-engine transport's copies (copy_engine.h) are launches of one-node graphs whose
// memcpy node is re-pointed before each launch: unlike cudaMemcpyAsync (and every other memcpy
// call), an update + launch never waits for a driver lock that another thread holds while it
// waits for that peer GPU to drain (freeing memory, loading or unloading a module with globals,
// as XLA does when it runs a new executable or drops an old one). That wait can deadlock: the
// peer's GPU may itself be waiting for this copy (docs/design.md, "The copy thread and copy
// graphs"). The graph stays alive as long as its exec: an update names the node of the graph the
// exec was instantiated from (with that graph destroyed every update failed, and each copy built
// a new graph). An update must name memory of the node's original contexts (CUDA's
// documentation), so a few graphs are kept per peer: one per copy of a call to that peer (each
// group keeps its operands, and a launch with unchanged operands skips the update), which also
// serve other kinds of memory.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "comm/overlap_plan.h"
#include "comm/status.h"

namespace fo_jax {

struct CopyGraphs {
  static constexpr int kPerPeer = 16;  // the ring sends every group to one peer
  // The slots below: XLA's thread fills empty ones (BuildCopyGraph may wait for this GPU to
  // drain), the copy worker re-points and launches them (never builds one).
  std::mutex mu;
  cudaGraph_t graph[kMaxCopyEngineRanks][kPerPeer] = {};
  cudaGraphExec_t exec[kMaxCopyEngineRanks][kPerPeer] = {};
  cudaGraphNode_t node[kMaxCopyEngineRanks][kPerPeer] = {};
  // What each exec's node copies now: a launch with the same operands skips the update (XLA
  // hands the same workspace to call after call, and the update costs host time per copy).
  struct Operands {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  Operands set[kMaxCopyEngineRanks][kPerPeer] = {};
  // Copies launched, graphs built for them and updates made (the rest launched as set).
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> built{0};
  std::atomic<uint64_t> updates{0};
};

// On XLA's thread: makes sure slot `ordinal` (clamped) of peer `to` has a graph, building one
// for these operands if it has none.
Status EnsureCopyGraph(CopyGraphs& graphs, int to, int ordinal, void* dst, const void* src,
                       size_t bytes);

// On the copy worker: the call's `ordinal`-th copy to peer `to`, launched on `stream`. It
// prefers graph slot `ordinal` (clamped), so that each group keeps a graph of its own and, when
// XLA hands the call the same workspace as the previous one, launches it without an update.
// Otherwise the first graph of the peer whose update accepts these operands makes the copy; if
// none does (memory of a kind no graph was built for), the copy fails. Never builds a graph.
// An update only affects later launches, so earlier ones may still be queued.
Status LaunchCopyGraph(CopyGraphs& graphs, int to, int ordinal, void* dst, const void* src,
                       size_t bytes, cudaStream_t stream);

}  // namespace fo_jax
