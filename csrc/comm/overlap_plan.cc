// See overlap_plan.h.
#include "comm/overlap_plan.h"

#include <string>

namespace fo_jax {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

Status ValidateCopyEngine(const OverlapPlan& plan, const OverlapShape& shape) {
  const int P = plan.axis_size, H = plan.rounds;
  const bool rs = plan.collective == Collective::kReduceScatter;
  const GemmTileConfig& c = GetGemmConfig(plan.gemm.config);
  if (P < 2 || P > kMaxCopyEngineRanks) {
    return Status::InvalidArgument("the copy-engine transport takes 2 to " +
                                   Str(kMaxCopyEngineRanks) + " ranks, the plan has " + Str(P));
  }
  if (H < 1 || (H > 1 && rs) || H * (P - 1) > kMaxReceiveSlots) {
    return Status::InvalidArgument(
        "copy-engine rounds " + Str(H) + ": at least 1, more only for an all-reduce, and "
        "rounds * (P - 1) at most " + Str(kMaxReceiveSlots));
  }
  const int64_t band_rows = shape.m / P;
  const int64_t unit = int64_t(c.tile_m) * c.cluster_m;
  if (band_rows <= 0 || band_rows % (H * unit) != 0 ||
      plan.tiles_chunk != band_rows / H / c.tile_m) {
    return Status::InvalidArgument(
        "the copy-engine transport needs rows per rank (" + Str(band_rows) + ") a multiple of "
        "rounds (" + Str(H) + ") * tile_m * cluster_m (" + Str(unit) + ") of GEMM config " +
        c.name + ", in chunks of tiles_chunk tile-rows (the plan says " +
        Str(plan.tiles_chunk) + ")");
  }
  const int chunks = H * P;
  const GemmPlan& g = plan.gemm;
  for (int i = 0; i <= g.num_groups; ++i) {
    if (g.group_begin[i] % c.cluster_m != 0) {
      return Status::InvalidArgument("the copy-engine transport needs groups of whole clusters (" +
                                     Str(c.cluster_m) + " tile-rows, GEMM config " + c.name + ")");
    }
  }
  for (int chunk = 0; chunk < chunks; ++chunk) {
    if (ChunkFirstGroup(g, plan.tiles_chunk, chunk) < 0) {
      return Status::InvalidArgument(
          "the copy-engine groups do not split along the rounds x ranks chunks (" +
          Str(chunks) + " chunks of " + Str(plan.tiles_chunk) + " tile-rows)");
    }
  }
  if (plan.ring) {
    if (shape.dtype == GemmDtype::kE4M3) {
      return Status::InvalidArgument(
          "fp8 operands cannot run the ring (it adds partial sums in the GEMM's epilogue and no "
          "fp8 kernel takes an addend): plan the direct form (ring false)");
    }
    if (!rs || H != 1) {
      return Status::InvalidArgument("the ring is a reduce-scatter of one round");
    }
    if (!GemmConfigTakesAddends(g.config) || !c.pingpong) {
      return Status::InvalidArgument(std::string("GEMM config ") + c.name +
                                     " has no ping-pong kernel with addends (the ring needs one)");
    }
  }
  const int L = LastSentChunk(P, H);
  const int pieces =
      ChunkFirstGroup(g, plan.tiles_chunk, L + 1) - ChunkFirstGroup(g, plan.tiles_chunk, L);
  if (!plan.ring && plan.sum_split == SumSplit::kByRows && pieces > kMaxRowPieces) {
    return Status::InvalidArgument("sums by rows take at most " + Str(kMaxRowPieces) +
                                   " groups in the last chunk sent, the plan has " + Str(pieces));
  }
  switch (plan.sum_split) {
    case SumSplit::kOnePass:
    case SumSplit::kByBands:
    case SumSplit::kByRows:
      return Status::Ok();
  }
  return Status::InvalidArgument("unknown sum split " + Str(int(plan.sum_split)));
}

// The all-gather's requirements (docs/design.md, "The all-gather"): rows per rank in bands of
// whole clusters of a consumer config, one group per band; 2 to 16 ranks on the copy engine.
Status ValidateAllGather(const OverlapPlan& plan, const OverlapShape& shape) {
  const int P = plan.axis_size;
  if (plan.transport == Transport::kCopyEngine && (P < 2 || P > kMaxCopyEngineRanks)) {
    return Status::InvalidArgument("the copy-engine transport takes 2 to " +
                                   Str(kMaxCopyEngineRanks) + " ranks, the plan has " + Str(P));
  }
  if (plan.rounds != 1 || plan.ring || plan.sum_split != SumSplit::kOnePass) {
    return Status::InvalidArgument("an all-gather plan with a reduce-scatter's copy-engine "
                                   "program");
  }
  const GemmPlan& g = plan.gemm;
  const GemmTileConfig& c = GetGemmConfig(g.config);
  if (!GemmConfigHasConsumer(g.config)) {
    return Status::InvalidArgument(std::string("GEMM config ") + c.name + " has no consumer "
                                   "kernel (the all-gather's GEMM needs one)");
  }
  const int64_t per_rank = shape.m / P;
  const int64_t unit = int64_t(c.tile_m) * c.cluster_m;
  const int64_t band = int64_t(plan.tiles_chunk) * c.tile_m;
  if (plan.tiles_chunk <= 0 || band % unit != 0 || per_rank % band != 0) {
    return Status::InvalidArgument(
        "the all-gather needs rows per rank (" + Str(per_rank) + ") in bands of a multiple of "
        "tile_m * cluster_m (" + Str(unit) + ") rows of GEMM config " + c.name + " (the plan "
        "says " + Str(plan.tiles_chunk) + " tile-rows per band)");
  }
  const int64_t bands = shape.m / band;
  if (bands > kMaxGemmBands) {
    return Status::InvalidArgument(Str(bands) + " bands, at most " + Str(kMaxGemmBands));
  }
  bool one_per_band = g.num_groups == bands;
  for (int i = 0; one_per_band && i <= g.num_groups; ++i) {
    one_per_band = g.group_begin[i] == i * plan.tiles_chunk;
  }
  if (!one_per_band) {
    return Status::InvalidArgument("the all-gather's GEMM takes one group per band (" +
                                   Str(bands) + " groups of " + Str(plan.tiles_chunk) +
                                   " tile-rows)");
  }
  return Status::Ok();
}

}  // namespace

AllGatherBands AllGatherBandsOf(const OverlapPlan& plan, const OverlapShape& shape) {
  AllGatherBands b;
  b.rows = int64_t(plan.tiles_chunk) * GetGemmConfig(plan.gemm.config).tile_m;
  b.per_rank = b.rows > 0 ? static_cast<int>(shape.m / plan.axis_size / b.rows) : 0;
  b.count = b.per_rank * plan.axis_size;
  b.band_bytes = static_cast<size_t>(b.rows * shape.k) * GemmInputBytes(shape.dtype);
  return b;
}

int LastSentChunk(int P, int rounds) { return (rounds - 1) * P + P - 2; }

int ChunkFirstGroup(const GemmPlan& gemm, int tiles_chunk, int chunk) {
  const int row = chunk * tiles_chunk;
  if (row == gemm.group_begin[gemm.num_groups]) return gemm.num_groups;
  for (int g = 0; g < gemm.num_groups; ++g) {
    if (gemm.group_begin[g] == row) return g;
  }
  return -1;
}

Status ValidateOverlapPlan(const OverlapPlan& plan, const OverlapShape& shape) {
  const int P = plan.axis_size;
  const bool rs = plan.collective == Collective::kReduceScatter;
  const bool ag = plan.collective == Collective::kAllGather;
  if (plan.collective != Collective::kReduceScatter && plan.collective != Collective::kAllReduce &&
      !ag) {
    return Status::InvalidArgument("unknown collective " + Str(int(plan.collective)));
  }
  if (shape.dtype != GemmDtype::kBF16 && shape.dtype != GemmDtype::kF16 &&
      shape.dtype != GemmDtype::kE4M3) {
    return Status::InvalidArgument("operands must be bf16, f16 or float8_e4m3fn");
  }
  if (P < 1) return Status::InvalidArgument("axis size " + Str(P));
  if ((rs || ag) && shape.m % P) {
    return Status::InvalidArgument(std::string(ag ? "gathered rows (" : "rows of x (") +
                                   Str(shape.m) + ") not divisible by the axis size " + Str(P));
  }
  if (plan.nccl_max_ctas < 0) {
    return Status::InvalidArgument("nccl_max_ctas " + Str(plan.nccl_max_ctas));
  }
  if (plan.transport != Transport::kNccl && plan.transport != Transport::kCopyEngine) {
    return Status::InvalidArgument("unknown transport " + Str(int(plan.transport)));
  }
  // The NCCL reduce-scatter's GEMM writes P bands group-major (signaling_gemm.h); the copy
  // engine's, all rows in one batch.
  const int batch = plan.transport == Transport::kNccl && rs ? P : 1;
  if (plan.gemm.batch != batch) {
    return Status::InvalidArgument(
        std::string(plan.transport == Transport::kNccl ? "the NCCL" : "the copy-engine") +
        " transport's GEMM takes batch " + Str(batch) + " here, the plan has " +
        Str(plan.gemm.batch));
  }
  FO_JAX_RETURN_IF_ERROR(ValidateGemmPlan(plan.gemm, shape.m, shape.n, shape.k).Within("GEMM"));
  FO_JAX_RETURN_IF_ERROR(ValidateGemmPlanDtype(plan.gemm, shape.dtype, shape.k).Within("GEMM"));
  if (ag) return ValidateAllGather(plan, shape).Within("all-gather");
  switch (plan.transport) {
    case Transport::kNccl: {
      if (plan.rounds != 1 || plan.ring || plan.tiles_chunk != 0 ||
          plan.sum_split != SumSplit::kOnePass) {
        return Status::InvalidArgument("an NCCL transport plan with a copy-engine program");
      }
      return Status::Ok();
    }
    case Transport::kCopyEngine:
      return ValidateCopyEngine(plan, shape).Within("copy-engine transport");
  }
  return Status::InvalidArgument("unknown transport " + Str(int(plan.transport)));
}

SignalingGemmArgs OverlapGemmArgs(const OverlapPlan& plan, const OverlapShape& shape, int rank) {
  SignalingGemmArgs args = GemmArgsOf(plan.gemm, shape.dtype, shape.m, shape.n, shape.k);
  if (plan.transport == Transport::kCopyEngine && plan.collective != Collective::kAllGather) {
    const int P = plan.axis_size;
    args.rotate_tile_rows = ((rank + 1) % P) * plan.tiles_chunk;
    args.rotate_period_tile_rows = plan.rounds > 1 ? P * plan.tiles_chunk : 0;
  }
  if (plan.collective == Collective::kAllGather) {
    // The consumer launch: bands in arrival order (AllGatherBands), each flag reaching 1 (the
    // call zeroes its flags in stream order first: comm/all_gather_nccl.h).
    const AllGatherBands bands = AllGatherBandsOf(plan, shape);
    args.band_rows = static_cast<int>(bands.rows);
    args.wait_flag_value = 1;
    int pos = 0;
    for (int s = 0; s < plan.axis_size; ++s) {
      const int q = AllGatherSource(rank, s, plan.axis_size);
      for (int c = 0; c < bands.per_rank && pos < kMaxGemmBands; ++c) {
        args.band_order[pos++] = q * bands.per_rank + c;
      }
    }
  }
  return args;
}

int64_t OutputRows(const OverlapPlan& plan, const OverlapShape& shape) {
  return plan.collective == Collective::kReduceScatter ? shape.m / plan.axis_size : shape.m;
}

}  // namespace fo_jax
