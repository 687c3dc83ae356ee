// See copy_engine_graphs.h.
#include "comm/copy_engine_graphs.h"

#include <algorithm>

namespace fo_jax {
namespace {

Status CopyError(cudaError_t e) { return CudaStatus(e, "copy between GPUs"); }

// A one-node graph copying `bytes` from src (this GPU) to dst (peer memory), built without
// touching the slots: building one may wait for this GPU to drain, which only XLA's thread may
// do (XLA's stream may be waiting for the copy worker's copies).
struct BuiltGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t node = nullptr;
};
cudaError_t BuildCopyGraph(void* dst, const void* src, size_t bytes, BuiltGraph* out) {
  BuiltGraph g;
  cudaError_t e = cudaGraphCreate(&g.graph, 0);
  if (e == cudaSuccess) {
    e = cudaGraphAddMemcpyNode1D(&g.node, g.graph, nullptr, 0, dst, src, bytes,
                                 cudaMemcpyDeviceToDevice);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, g.graph, 0);
  if (e != cudaSuccess) {
    if (g.graph) (void)cudaGraphDestroy(g.graph);
    return e;
  }
  *out = g;  // the graph is kept with its exec: updates name its node
  return cudaSuccess;
}

// Puts a built graph into slot k of peer q (under graphs.mu), replacing the slot's graph; an
// exec destroyed while launches of it are queued is freed when they complete.
void PublishCopyGraph(CopyGraphs& graphs, int q, int k, const BuiltGraph& g, void* dst,
                      const void* src, size_t bytes) {
  if (graphs.exec[q][k]) (void)cudaGraphExecDestroy(graphs.exec[q][k]);
  if (graphs.graph[q][k]) (void)cudaGraphDestroy(graphs.graph[q][k]);
  graphs.graph[q][k] = g.graph;
  graphs.exec[q][k] = g.exec;
  graphs.node[q][k] = g.node;
  graphs.set[q][k] = {dst, src, bytes};
  ++graphs.built;
}

}  // namespace

Status EnsureCopyGraph(CopyGraphs& graphs, int to, int ordinal, void* dst, const void* src,
                       size_t bytes) {
  const int k = std::min(ordinal, CopyGraphs::kPerPeer - 1);
  {
    std::lock_guard<std::mutex> lock(graphs.mu);
    if (graphs.exec[to][k]) return Status::Ok();
  }
  BuiltGraph built;  // outside the lock: building may wait for this GPU, the copy worker not
  FO_JAX_RETURN_IF_ERROR(CudaStatus(BuildCopyGraph(dst, src, bytes, &built),
                                    "creating the graph of a copy between GPUs"));
  std::lock_guard<std::mutex> lock(graphs.mu);
  PublishCopyGraph(graphs, to, k, built, dst, src, bytes);  // only XLA's thread fills slots
  return Status::Ok();
}

Status LaunchCopyGraph(CopyGraphs& graphs, int to, int ordinal, void* dst, const void* src,
                       size_t bytes, cudaStream_t stream) {
  ++graphs.copies;
  std::lock_guard<std::mutex> lock(graphs.mu);
  constexpr int kSlots = CopyGraphs::kPerPeer;
  const int preferred = std::min(ordinal, kSlots - 1);
  int k = -1;
  for (int t = 0; t < kSlots && k < 0; ++t) {  // the preferred slot first, then the others
    const int i = (preferred + t) % kSlots;
    if (!graphs.exec[to][i]) continue;
    CopyGraphs::Operands& set = graphs.set[to][i];
    if (set.dst == dst && set.src == src && set.bytes == bytes) {
      k = i;
      break;
    }
    const cudaError_t err = cudaGraphExecMemcpyNodeSetParams1D(
        graphs.exec[to][i], graphs.node[to][i], dst, src, bytes, cudaMemcpyDeviceToDevice);
    if (err == cudaSuccess) {
      set = {dst, src, bytes};
      ++graphs.updates;
      k = i;
    } else if (err == cudaErrorInvalidValue) {
      (void)cudaGetLastError();  // memory of another kind: try the next graph
    } else {
      return CopyError(err);
    }
  }
  if (k < 0) {
    return Status::Internal("no copy graph accepts the buffers of a copy between GPUs (memory of "
                            "a kind the graphs were not built for); use "
                            "OverlapConfig(transport='nccl')");
  }
  const cudaError_t err = cudaGraphLaunch(graphs.exec[to][k], stream);
  if (err != cudaSuccess) return CopyError(err);
  return Status::Ok();
}

}  // namespace fo_jax
