// Tile scheduler of the signaling GEMM: a static persistent scheduler (CUTLASS sm90 scheduler
// interface) that hands out output tiles group by group, plus the TileSchedulerSelector
// specializations that make CUTLASS's GemmUniversal use it for GroupSchedulerTag (groups in table
// order) and OrderedGroupSchedulerTag (groups in a host-given order: the consumer GEMM).
// Included by signaling_gemm_kernel.cuh only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "signaling_gemm.h"

namespace fo_jax::detail {

// ---------------------------------------------------------------------------------------------
// Tile order (host-built table, read by the scheduler).
//
// The unit of work is a cluster tile: kClusterM consecutive tile-rows ("super row") of one batch
// times one column tile. Group g owns the super rows [sgroup_begin[g], sgroup_begin[g+1]) with
// sgroup_begin[g] = ceil(group_begin[g] / kClusterM) (for kClusterM == 1 exactly the tile-rows of
// the group; for kClusterM == 2 a pair straddling a group boundary runs with the earlier group,
// each CTA still signals the group of its own tile-row). The linear unit index u runs over
//   group g = 0 .. G-1  (units [unit_start[g], unit_start[g+1]))
//     raster chunk c of `swizzle` rows of the group's row sequence
//       column tile n (0 .. tiles_n-1)
//         row within the chunk
// where a group's row sequence is batch-major: (batch 0, its super rows), (batch 1, ...), ...
// Visiting `swizzle` rows per column keeps the B columns of a wave hot in L2 (large K).
// Persistent CTA cluster c takes units c, c + num_clusters, c + 2 * num_clusters, ...
// ---------------------------------------------------------------------------------------------
struct GroupTable {
  int num_groups = 1;
  int tiles_n = 1;
  int batch = 1;
  int swizzle = 1;
  int tiles_m = 1;
  int rotate = 0;  // tile-rows; logical tile-row t runs at physical (t + rotate) % tiles_m,
  int period = 1;  // within each run of `period` tile-rows: signaling_gemm.h
  int sgroup_begin[kMaxGemmGroups + 1] = {};
  int unit_start[kMaxGemmGroups + 1] = {};
};

// The consumer GEMM's table: groups are visited in the order group_order[0 .. G-1] (position p
// runs group group_order[p]; unit_start is indexed by position), so that the bands of A are
// visited in the order they arrive while every group keeps its physical tile-rows.
struct OrderedGroupTable : GroupTable {
  int group_order[kMaxGemmGroups] = {};
};

struct GroupSchedulerTag {};
struct OrderedGroupSchedulerTag {};

template <int kClusterM, bool kOrdered = false>
class GroupOrderedScheduler {
  using Table = std::conditional_t<kOrdered, OrderedGroupTable, GroupTable>;

  using Sm90Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  struct WorkTileInfo {
    int32_t M_idx = 0;
    int32_t N_idx = 0;
    int32_t L_idx = 0;
    bool is_valid_tile = false;

    CUTLASS_HOST_DEVICE bool is_valid() const { return is_valid_tile; }
    CUTLASS_HOST_DEVICE static WorkTileInfo invalid_work_tile() { return {-1, -1, -1, false}; }
    CUTLASS_HOST_DEVICE bool is_final_split(uint32_t) const { return true; }
    CUTLASS_HOST_DEVICE int32_t reduction_subtile_idx() const { return -1; }
  };

  using RasterOrder = typename Sm90Base::RasterOrder;
  using RasterOrderOptions = typename Sm90Base::RasterOrderOptions;
  static constexpr bool IsDynamicPersistent = false;
  using Pipeline = typename Sm90Base::Pipeline;
  using PipelineStorage = typename Sm90Base::PipelineStorage;
  using ThrottlePipeline = typename Sm90Base::ThrottlePipeline;
  using ThrottlePipelineStorage = typename Sm90Base::ThrottlePipelineStorage;
  using CLCResponse = typename Sm90Base::CLCResponse;
  using SharedStorage = typename Sm90Base::SharedStorage;

  struct Arguments {
    int max_swizzle_size = 1;  // unused (the kernel's get_grid_shape sets it)
    RasterOrderOptions raster_order = RasterOrderOptions::Heuristic;  // unused
    Table const* table = nullptr;
  };

  struct Params {
    Table table;
    int32_t log_swizzle_size_ = 0;                // read by the kernel's get_grid_shape only
    RasterOrder raster_order_ = RasterOrder::AlongN;  // idem
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL, TileShape, ClusterShape,
                                        cutlass::KernelHardwareInfo const&, Arguments const& args,
                                        void* = nullptr, uint32_t = 1, uint32_t = 1) {
    Params p;
    if (args.table != nullptr) p.table = *args.table;
    return p;
  }

  CUTLASS_HOST_DEVICE static bool can_implement(Arguments const& args) {
    return args.table != nullptr;
  }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape,
                                   cutlass::KernelHardwareInfo const&, uint32_t, uint32_t = 1,
                                   uint32_t = 1) {
    return 0;
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void*, cudaStream_t, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t,
                                              uint32_t = 1, uint32_t = 1,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  // Grid: hw_info.sm_count CTAs (the launcher already applied the SM budget and the co-residency
  // limit of clusters), never more cluster units than exist.
  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static dim3 get_grid_shape(Params const& params, ProblemShapeMNKL, TileShape, ClusterShape,
                             cutlass::KernelHardwareInfo hw_info, Arguments = Arguments{},
                             bool = true) {
    int units = params.table.unit_start[params.table.num_groups];
    int clusters = hw_info.sm_count / kClusterM;
    if (clusters > units) clusters = units;
    if (clusters < 1) clusters = 1;
    return dim3(clusters * kClusterM, 1, 1);
  }

  CUTLASS_HOST_DEVICE GroupOrderedScheduler() {}

  CUTLASS_DEVICE explicit GroupOrderedScheduler(Params const& params) : params_(&params) {
#if defined(__CUDA_ARCH__)
    cta_m_in_cluster_ = int(blockIdx.x) % kClusterM;
    unit_ = int(blockIdx.x) / kClusterM;
    stride_ = int(gridDim.x) / kClusterM;
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return work_for_unit(unit_); }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    unit_ += stride_ * int(advance_count);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo&, uint32_t advance_count = 1) const {
    return !work_for_unit(unit_ + stride_ * int(advance_count)).is_valid();
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo) {
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo info, TileSchedulerPipeline&,
                                      TileSchedulerPipelineState) {
    return fetch_next_work(info);
  }

  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&, Params const&) {
    return true;
  }
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&) { return true; }

  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const&, WorkTileInfo const&, FrgTensorC&, uint32_t,
                                   uint32_t) {}

  CUTLASS_DEVICE static bool continue_current_work(WorkTileInfo&) { return false; }

  template <class ProblemShape, class TileShape>
  CUTLASS_HOST_DEVICE static int get_work_k_tile_count(WorkTileInfo const&, ProblemShape problem,
                                                       TileShape tile) {
    return cute::size(cute::ceil_div(cute::get<2>(problem), cute::get<2>(tile)));
  }

  CUTLASS_HOST_DEVICE static uint32_t get_work_k_tile_start(WorkTileInfo const&) { return 0u; }

  CUTLASS_HOST_DEVICE static bool requires_separate_reduction(Params const&) { return false; }
  CUTLASS_DEVICE static bool need_separate_reduction(Params const&) { return false; }
  CUTLASS_DEVICE static bool valid_warpgroup_in_work_tile(WorkTileInfo const&) { return true; }

 private:
  CUTLASS_DEVICE WorkTileInfo work_for_unit(int u) const {
    Table const& t = params_->table;
    if (u >= t.unit_start[t.num_groups]) return WorkTileInfo::invalid_work_tile();
    // Largest position with unit_start <= u (skips empty groups).
    int lo = 0, hi = t.num_groups - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (t.unit_start[mid] <= u) lo = mid; else hi = mid - 1;
    }
    int g = lo;
    if constexpr (kOrdered) g = t.group_order[lo];
    const int v = u - t.unit_start[lo];
    const int srows = t.sgroup_begin[g + 1] - t.sgroup_begin[g];
    const int seq_rows = t.batch * srows;
    const int chunk = t.swizzle * t.tiles_n;
    const int c = v / chunk;
    const int rem = v - c * chunk;
    const int h = min(t.swizzle, seq_rows - c * t.swizzle);
    const int seq = c * t.swizzle + rem % h;
    const int col = rem / h;
    const int l = seq / srows;
    const int srow = t.sgroup_begin[g] + (seq - l * srows);
    int row = srow * kClusterM;  // rotate and tiles_m are multiples of kClusterM: a cluster's
    if (t.rotate != 0) {         // tile-rows stay together
      const int base = row / t.period * t.period;
      row += t.rotate;
      if (row >= base + t.period) row -= t.period;
    }
    return {row + cta_m_in_cluster_, col, l, true};
  }

  Params const* params_ = nullptr;
  int cta_m_in_cluster_ = 0;
  int unit_ = 0;
  int stride_ = 1;
};

}  // namespace fo_jax::detail

// Select our scheduler for our tags.
namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t kStages, class ProblemShapeT>
struct TileSchedulerSelector<fo_jax::detail::GroupSchedulerTag, ArchTag, TileShape, ClusterShape,
                             kStages, ProblemShapeT> {
  using Scheduler =
      fo_jax::detail::GroupOrderedScheduler<cute::size<0>(ClusterShape{})>;
};
template <class ArchTag, class TileShape, class ClusterShape, uint32_t kStages, class ProblemShapeT>
struct TileSchedulerSelector<fo_jax::detail::OrderedGroupSchedulerTag, ArchTag, TileShape,
                             ClusterShape, kStages, ProblemShapeT> {
  using Scheduler =
      fo_jax::detail::GroupOrderedScheduler<cute::size<0>(ClusterShape{}), true>;
};
}  // namespace cutlass::gemm::kernel::detail
