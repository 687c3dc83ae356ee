// See copy_engine_args.h.
#include "comm/copy_engine_args.h"

#include <algorithm>

namespace fo_jax {

CopyEngineArgs CopyEngineArgsOf(const OverlapPlan& plan, const OverlapShape& shape,
                                const SignalingGemmArgs& gemm, void* out) {
  CopyEngineArgs a;
  const GemmPlan& g = plan.gemm;
  const int chunks = plan.rounds * plan.axis_size;
  a.dtype = shape.out_dtype();  // the sums add the GEMM's output (bf16 for fp8 operands)
  a.all_reduce = plan.collective == Collective::kAllReduce;
  a.workspace = gemm.d;  // reduce-scatter: the workspace; all-reduce: the output itself
  a.out = out;
  a.band_elems = static_cast<size_t>(shape.m / plan.axis_size * shape.n);
  a.counters = gemm.counters;
  for (int i = 0; i < gemm.num_groups; ++i) {
    a.expected[i] = static_cast<uint32_t>(ExpectedGroupCount(gemm, i));
  }
  a.rounds = plan.rounds;
  a.ring = plan.ring;
  a.sum_split = plan.sum_split;
  for (int c = 0; c <= chunks; ++c) {
    a.chunk_first_group[c] = ChunkFirstGroup(g, plan.tiles_chunk, c);
  }
  a.num_groups = g.num_groups;
  std::copy(g.group_begin, g.group_begin + g.num_groups + 1, a.group_begin);
  a.tiles_chunk = plan.tiles_chunk;
  a.tile_row_elems =
      static_cast<size_t>(GetGemmConfig(g.config).tile_m) * static_cast<size_t>(shape.n);
  return a;
}

}  // namespace fo_jax
