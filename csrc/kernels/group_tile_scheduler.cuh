// Tile scheduler of the signaling GEMM: a static persistent scheduler (CUTLASS sm90 scheduler
// interface) that hands out output tiles group by group, plus the TileSchedulerSelector
// specializations that make CUTLASS's GemmUniversal use it for GroupSchedulerTag (groups in table
// order) and OrderedGroupSchedulerTag (groups in a host-given order: the consumer GEMM).
// Included by signaling_gemm_kernel.cuh only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/fast_math.h"
#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "group_cursor.h"
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
//
// Split K (splits > 1, cooperative kernels only): the first dp_units cluster tiles above run
// whole (the full waves), and each cluster tile after them (the last partial wave, the "tail")
// becomes `splits` consecutive units, split s computing the k-tiles
// [s * k_tiles / splits, (s+1) * k_tiles / splits): the tail's work spreads over the SMs that a
// partial wave leaves idle (with fewer tiles than SMs, every tile is split). The last split is
// the tile's final one: in fixup() it waits until the others have left their fp32 partial sums
// in the workspace (tail tile p's slots), adds them in split order (a fixed order, so the result
// does not depend on timing) and runs the epilogue, which stores and signals the tile as an
// unsplit kernel does. A unit waits only for units of lower index, each cluster visits its
// units in increasing order and the grid is co-resident (the launcher caps it), so the lowest
// unfinished unit can always run: no deadlock. Consecutive splits run side by side in one wave,
// so the final one rarely waits long.
// ---------------------------------------------------------------------------------------------
struct GroupTable {
  int num_groups = 1;
  int tiles_n = 1;
  int batch = 1;
  int swizzle = 1;
  int tiles_m = 1;
  int rotate = 0;  // tile-rows; logical tile-row t runs at physical (t + rotate) % tiles_m,
  int period = 1;  // within each run of `period` tile-rows: signaling_gemm.h
  int splits = 1;    // units per tail cluster tile (split K); 1: each unit runs all of K
  int k_tiles = 0;   // k-tiles of the whole K (read only when splits > 1)
  int dp_units = 0;  // cluster tiles run whole before the split tail (when splits > 1)
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
// GroupSchedulerTag with split K (the cooperative kernels without a consumer mainloop; the
// ping-pong kernel never calls fixup, so its scheduler keeps the unsplit code).
struct SplitKGroupSchedulerTag {};

template <int kClusterM, bool kOrdered = false, bool kSplitK = false>
class GroupOrderedScheduler {
  using Table = std::conditional_t<kOrdered, OrderedGroupTable, GroupTable>;

  using Sm90Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  struct WorkTileInfo {
    int32_t M_idx = 0;
    int32_t N_idx = 0;
    int32_t L_idx = 0;
    bool is_valid_tile = false;
    int32_t k_begin = 0;  // first k-tile of this unit
    int32_t k_count = 0;  // its k-tiles; 0: all of K (no split)
    int32_t split = 0;    // split index, 0 .. splits-1 (the last one stores the tile)
    int32_t splits = 1;
    int32_t slot = 0;     // split tiles: the tile's flag word and partial-sum slots

    CUTLASS_HOST_DEVICE bool is_valid() const { return is_valid_tile; }
    CUTLASS_HOST_DEVICE static WorkTileInfo invalid_work_tile() { return {-1, -1, -1, false}; }
    CUTLASS_HOST_DEVICE bool is_final_split(uint32_t) const { return split == splits - 1; }
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
    // Split K (table->splits > 1): splits - 1 fp32 partial tiles per tail tile (CTA tile), and
    // one flag word per tail tile, zero at launch; the kernel leaves the flags zero again.
    float* partials = nullptr;
    uint32_t* split_flags = nullptr;
  };

  struct Params {
    Table table;
    // Division by the raster chunk (swizzle * tiles_n units) and by swizzle as a multiply and a
    // shift, as CUTLASS's own scheduler divides (set from the table by to_underlying_arguments):
    // an integer division by a runtime divisor is about 20 instructions around a reciprocal, and
    // every warp role computes its next tile's coordinates, the consumers of a cooperative
    // kernel between two tiles with no MMA running.
    cutlass::FastDivmod chunk_div;
    cutlass::FastDivmod swizzle_div;
    float* partials = nullptr;
    uint32_t* split_flags = nullptr;
    int32_t log_swizzle_size_ = 0;                // read by the kernel's get_grid_shape only
    RasterOrder raster_order_ = RasterOrder::AlongN;  // idem
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL, TileShape, ClusterShape,
                                        cutlass::KernelHardwareInfo const&, Arguments const& args,
                                        void* = nullptr, uint32_t = 1, uint32_t = 1) {
    Params p;
    if (args.table != nullptr) p.table = *args.table;
    p.chunk_div = cutlass::FastDivmod(p.table.swizzle * p.table.tiles_n);
    p.swizzle_div = cutlass::FastDivmod(p.table.swizzle);
    p.partials = args.partials;
    p.split_flags = args.split_flags;
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
    int units = NumUnits(params.table);
    int clusters = hw_info.sm_count / kClusterM;
    if (clusters > units) clusters = units;
    if (clusters < 1) clusters = 1;
    return dim3(clusters * kClusterM, 1, 1);
  }

  CUTLASS_HOST_DEVICE GroupOrderedScheduler() {}

  CUTLASS_DEVICE explicit GroupOrderedScheduler(Params const& params) : params_(&params) {
#if defined(__CUDA_ARCH__)
    cta_m_in_cluster_ = int(blockIdx.x) % kClusterM;
    unit_ = FirstUnit();
    stride_ = UnitStride();
#endif
  }

  // This CTA's units: FirstUnit(), then every UnitStride()-th (one cluster per stride).
  CUTLASS_DEVICE static int FirstUnit() { return int(blockIdx.x) / kClusterM; }
  CUTLASS_DEVICE static int UnitStride() { return int(gridDim.x) / kClusterM; }
  // How many of `units` units this CTA visits, without split K (the epilogue's count of its
  // CTA's tiles).
  CUTLASS_DEVICE static int CtaUnits(int units) {
    const int u0 = FirstUnit(), stride = UnitStride();
    return u0 < units ? (units - u0 + stride - 1) / stride : 0;
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

  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const& w, Params const&) {
    return w.split == w.splits - 1;
  }
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const& w) {
    return w.split == w.splits - 1;
  }

  // Split K: a non-final split stores its accumulators as fp32 into its slot of the tile's
  // partials and adds 1 to the tile's flag (release at GPU scope, after a barrier of all the
  // consumer threads, so it is cumulative over every thread's stores); the final split waits
  // for splits - 1 on the flag (acquire), zeroes it for the next launch, and adds the slots in
  // split order. Thread t of the consumers keeps element i of its fragment at float4
  // (i / 4) * threads + t of a slot: a warp's loads and stores are contiguous. Called by the
  // cooperative kernel (num_barriers = its consumer warp groups, barrier_idx = this thread's);
  // CUTLASS reserves named barrier StreamkBarrier0 for this step (bar.sync with a memory
  // clobber, so the compiler keeps the stores before it and the loads after it).
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const& params, WorkTileInfo const& w,
                                   FrgTensorC& accumulators, uint32_t num_barriers,
                                   uint32_t barrier_idx) {
    if constexpr (kSplitK) {
      if (w.splits <= 1) return;
      constexpr int kFrag = decltype(cute::size(accumulators))::value;
      static_assert(kFrag % 4 == 0, "the accumulator fragment moves as float4");
      const int threads = int(num_barriers) * 128;
      const int t = int(barrier_idx) * 128 + int(threadIdx.x) % 128;
      uint32_t* flag = params.split_flags + w.slot;
      float4* slots = reinterpret_cast<float4*>(params.partials) +
                      size_t(w.slot) * size_t(w.splits - 1) * (kFrag / 4) * threads;
      constexpr uint32_t kBarrier =
          uint32_t(cutlass::arch::ReservedNamedBarriers::StreamkBarrier0);
      if (w.split < w.splits - 1) {
        float4* mine = slots + size_t(w.split) * (kFrag / 4) * threads;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kFrag / 4; ++i) {
          __stcg(mine + i * threads + t,
                 make_float4(accumulators(4 * i), accumulators(4 * i + 1), accumulators(4 * i + 2),
                             accumulators(4 * i + 3)));
        }
        asm volatile("bar.sync %0, %1;" ::"r"(kBarrier), "r"(threads) : "memory");
        if (t == 0) {
          asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flag) : "memory");
        }
      } else {
        if (t == 0) {
          const uint32_t want = uint32_t(w.splits - 1);
          while (true) {
            uint32_t seen;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag)
                         : "memory");
            if (seen == want) break;
            __nanosleep(32);
          }
          *flag = 0u;  // no other unit of this launch touches it again
        }
        asm volatile("bar.sync %0, %1;" ::"r"(kBarrier), "r"(threads) : "memory");
        for (int s = 0; s < w.splits - 1; ++s) {
          const float4* slot = slots + size_t(s) * (kFrag / 4) * threads;
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kFrag / 4; ++i) {
            const float4 v = __ldcg(slot + i * threads + t);
            accumulators(4 * i) += v.x;
            accumulators(4 * i + 1) += v.y;
            accumulators(4 * i + 2) += v.z;
            accumulators(4 * i + 3) += v.w;
          }
        }
      }
    }
  }

  // Units of work of a launch with this table (the split tail's count `splits` each).
  CUTLASS_HOST_DEVICE static int NumUnits(Table const& t) {
    const int tiles = t.unit_start[t.num_groups];
    if (!kSplitK || t.splits <= 1) return tiles;
    return t.dp_units + (tiles - t.dp_units) * t.splits;
  }

  CUTLASS_DEVICE static bool continue_current_work(WorkTileInfo&) { return false; }

  template <class ProblemShape, class TileShape>
  CUTLASS_HOST_DEVICE static int get_work_k_tile_count(WorkTileInfo const& w,
                                                       ProblemShape problem, TileShape tile) {
    if constexpr (kSplitK) {
      if (w.k_count > 0) return w.k_count;
    }
    return cute::size(cute::ceil_div(cute::get<2>(problem), cute::get<2>(tile)));
  }

  CUTLASS_HOST_DEVICE static uint32_t get_work_k_tile_start(WorkTileInfo const& w) {
    return uint32_t(w.k_begin);
  }

  CUTLASS_HOST_DEVICE static bool requires_separate_reduction(Params const&) { return false; }
  CUTLASS_DEVICE static bool need_separate_reduction(Params const&) { return false; }
  CUTLASS_DEVICE static bool valid_warpgroup_in_work_tile(WorkTileInfo const&) { return true; }

 private:
  CUTLASS_DEVICE WorkTileInfo work_for_unit(int unit) const {
    Table const& t = params_->table;
    const int splits = kSplitK ? t.splits : 1;
    int u = unit;  // the cluster tile
    int s = -1;    // its split, or -1: the whole K
    if (splits > 1 && unit >= t.dp_units) {
      const int v = unit - t.dp_units;
      u = t.dp_units + v / splits;
      s = v - (v / splits) * splits;
    }
    if (u >= t.unit_start[t.num_groups]) return WorkTileInfo::invalid_work_tile();
    // Largest position with unit_start <= u (skips empty groups).
    const int lo = LastEntryAtMost(t.unit_start, t.num_groups, u);
    int g = lo;
    if constexpr (kOrdered) g = t.group_order[lo];
    const int v = u - t.unit_start[lo];
    const int srows = t.sgroup_begin[g + 1] - t.sgroup_begin[g];
    const int seq_rows = t.batch * srows;
    int c, rem;  // raster chunk c, and the unit's place in it
    params_->chunk_div(c, rem, v);
    const int h = min(t.swizzle, seq_rows - c * t.swizzle);  // the chunk's rows (the last: fewer)
    int col, r;
    if (h == t.swizzle) {
      params_->swizzle_div(col, r, rem);
    } else {
      col = rem / h;
      r = rem - col * h;
    }
    const int seq = c * t.swizzle + r;
    int l = 0, srow_in_group = seq;  // batch-major: seq runs over batch 0's rows, then 1's, ...
    if (t.batch > 1) {
      l = seq / srows;
      srow_in_group = seq - l * srows;
    }
    const int srow = t.sgroup_begin[g] + srow_in_group;
    int row = srow * kClusterM;  // rotate and tiles_m are multiples of kClusterM: a cluster's
    if (t.rotate != 0) {         // tile-rows stay together
      const int base = row / t.period * t.period;
      row += t.rotate;
      if (row >= base + t.period) row -= t.period;
    }
    WorkTileInfo w{row + cta_m_in_cluster_, col, l, true};
    if (s >= 0) {
      w.split = s;
      w.splits = splits;
      w.slot = (u - t.dp_units) * kClusterM + cta_m_in_cluster_;
      w.k_begin = s * t.k_tiles / splits;
      w.k_count = (s + 1) * t.k_tiles / splits - w.k_begin;
    }
    return w;
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
struct TileSchedulerSelector<fo_jax::detail::SplitKGroupSchedulerTag, ArchTag, TileShape,
                             ClusterShape, kStages, ProblemShapeT> {
  using Scheduler =
      fo_jax::detail::GroupOrderedScheduler<cute::size<0>(ClusterShape{}), false, true>;
};
template <class ArchTag, class TileShape, class ClusterShape, uint32_t kStages, class ProblemShapeT>
struct TileSchedulerSelector<fo_jax::detail::OrderedGroupSchedulerTag, ArchTag, TileShape,
                             ClusterShape, kStages, ProblemShapeT> {
  using Scheduler =
      fo_jax::detail::GroupOrderedScheduler<cute::size<0>(ClusterShape{}), true>;
};
}  // namespace cutlass::gemm::kernel::detail
