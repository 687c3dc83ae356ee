// Consumer side of the accurate fp8 mainloop: CUTLASS's MainloopSm90TmaGmmaWarpSpecializedFP8
// collective (its loads, pipeline and shared memory unchanged) with its own mma(), which adds
// the tensor cores' partial sums into the fp32 accumulator every kPromotionKTiles k-tiles as
// CUTLASS's does, in the same order, without zeroing either accumulator at a tile's start.
// Included by signaling_gemm_kernel.cuh only.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace fo_jax::detail {

// Why its own mma(): CUTLASS's accumulates every interval into a temporary, which its first
// promotion adds into the main accumulator. Both are fresh registers at each tile, and both are
// read before they are written: the main one by that first addition, the temporary one by the
// MMAs' inline assembly, whose accumulator operands are read-write ("+f") even where the
// instruction ignores them (GMMA::ScaleOut::Zero). So the compiler materializes zeros for both,
// between two tiles' MMAs: in the 128x192 kernel, 144 instructions that zero register pairs and
// 96 additions of zero per thread (docs/gemm_performance.md, "No zeroed accumulators").
//
// Here the first interval's MMAs write the main accumulator itself, and later intervals write
// the temporary one, which is added at the interval's end. Both accumulators are marked defined
// (MarkDefined) before their first MMA, which overwrites them (GMMA::ScaleOut::Zero on the
// first k-block), so no path reads a value the kernel did not compute. The sum is the same,
// addition for addition, as CUTLASS's: the partial sums of the intervals [0, P), [P, 2P), ...
// added in that order, the first one into nothing. The one difference: a first interval whose
// sum is -0.0 stays -0.0 here, where 0.0 + -0.0 gives 0.0.
//
// Pipeline contract (the kernel's mma_tail()): K_PIPE_MMAS = 1 k-tile of MMAs stays in flight,
// so this releases the stages of the first k_tile_count - 1 k-tiles, each once the MMAs of the
// k-tile after it are issued and its own are done, and mma_tail() waits for the last and
// releases it.
//
// kReleaseAfterPromotion: the stage released after an interval's last k-tile is issued waits
// until the interval's MMAs are done and its sums added, as in CUTLASS's mma() (its
// promote_if_needed() comes before consumer_release()); otherwise it is released at once, before
// that wait. The two orders are the only difference between this loop and CUTLASS's in the
// steady state. Cooperative 128x128 takes the late one: with the early one it ran 7-14% slower
// than CUTLASS's mma() at long K, with the late one as fast there and faster at short K
// (docs/gemm_performance.md, "The order of release and promotion"; the other rows keep the
// early one).
template <class Base, int kPromotionKTiles, bool kReleaseAfterPromotion = false>
struct PromotingFp8Mainloop : Base {
  static_assert(Base::K_PIPE_MMAS == 1, "mma() keeps one k-tile of MMAs in flight");
  static_assert(kPromotionKTiles >= 1, "at least one k-tile per interval");

  template <class FrgTensorC, class Params>
  CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline,
                          typename Base::PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx,
                          typename Base::TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    using TiledMma = typename Base::TiledMma;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator lives in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
                            typename Base::SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                            typename Base::SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_groups = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_groups(warp_group));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, M, K, PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, N, K, PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    // Every unit has a k-tile: the launcher rejects k <= 0 and more K splits than k-tiles
    // (signaling_gemm.cu). A branch for none would merge a zeroed accumulator into the MMAs'.
    __builtin_assume(k_tile_count >= 1);
    Tensor partial = make_fragment_like(accum);
    MarkDefined(accum);
    MarkDefined(partial);

    // One k-tile's MMAs into `acc`, once its stage has arrived; the first k-block overwrites
    // `acc` when `overwrite`.
    auto issue = [&](auto& acc, bool overwrite) {
      auto token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, token);
      const int stage = smem_pipe_read.index();
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        tiled_mma.accumulate_ =
            overwrite && kb == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
      }
      warpgroup_commit_batch();
      ++smem_pipe_read;
    };
    // With the next k-tile's MMAs issued: wait for the previous k-tile's, release its stage
    // (`last`: the issued k-tile ends its interval; kReleaseAfterPromotion defers that release
    // to release_deferred(), after the interval's additions).
    auto pipeline_release = smem_pipe_read;
    bool deferred = false;
    auto release_previous = [&](auto& acc, bool last) {
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
      if (kReleaseAfterPromotion && last) {
        deferred = true;
        return;
      }
      pipeline.consumer_release(pipeline_release);
      ++pipeline_release;
    };
    auto release_deferred = [&]() {
      if (kReleaseAfterPromotion && deferred) {
        pipeline.consumer_release(pipeline_release);
        ++pipeline_release;
        deferred = false;
      }
    };

    // One promotion interval (k < k_tile_count on entry): up to kPromotionKTiles k-tiles into
    // `acc`, the first overwriting it, each but the loop's first releasing its predecessor's
    // stage; then all of the interval's MMAs done. Every interval ends so, the first too (where CUTLASS's
    // first promotion waits as well): ptxas tracks the MMAs in flight only that far, and if the
    // next interval's wait<1> were what retired the MMAs that write accum, it would find them
    // possibly in flight at the promotion that reads accum and serialize every MMA of the kernel
    // (ptxas C7514: a wait after each one). The first k-tile stands outside the k-tile loop: one
    // loop that also tests it (and whether to release) spills registers in the 128x192 kernels.
    int k = 0;
    // Whether k-tile k, the interval's j-th, is its last.
    auto ends_interval = [&](int j) { return j == kPromotionKTiles - 1 || k + 1 == k_tile_count; };
    auto run_interval = [&](auto& acc, bool first_interval) {
      issue(acc, true);
      if (!first_interval) release_previous(acc, ends_interval(0));
      ++k;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 1; j < kPromotionKTiles; ++j) {
        if (k < k_tile_count) {
          issue(acc, false);
          release_previous(acc, ends_interval(j));
          ++k;
        }
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    };

    // The first interval's sums go to accum itself; each later interval's to `partial`, added
    // into accum once all its MMAs are done (the addition reads every register they write).
    run_interval(accum, true);
    release_deferred();
    CUTLASS_PRAGMA_NO_UNROLL
    while (k < k_tile_count) {
      run_interval(partial, false);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
      warpgroup_fence_operand(accum);
      release_deferred();
    }
  }

 private:
  // Marks every register of `t` defined without an instruction: an empty inline assembly that
  // outputs them ("=f"). For accumulators whose first MMA overwrites them, so that the MMAs'
  // read of their operands ("+f") finds a defined value and the compiler has none to
  // materialize. nvcc 13.0 emits the same SASS for this mma() without it; it is there because
  // a value the compiler may choose, once it meets a computed one where paths join (the
  // partial sums' loop), is one it may also choose to be zero, as it does in CUTLASS's mma().
  template <class Tensor>
  CUTLASS_DEVICE static void MarkDefined(Tensor& t) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(t); ++i) asm volatile("" : "=f"(t(i)));
  }
};

}  // namespace fo_jax::detail
