// Mainloop of the consumer ("all-gather") GEMM: CUTLASS's sm90 TMA warp-specialized mainloop
// collective, whose load() first waits until the band of A that holds the tile's rows has
// arrived (SignalingGemmArgs::wait_flags). Everything else (TMA descriptors, pipeline, MMA) is
// the base collective's. Included by signaling_gemm_kernel.cuh only.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "epoch_compare.h"

namespace fo_jax::detail {

// Where the wait sits: CUTLASS's warp-specialized kernels (ping-pong and cooperative) call the
// mainloop's load() once per output tile, from the producer warp that issues A's and B's TMA
// loads, with the tile's coordinates; A's loads for that tile are all issued inside it. So a wait
// at the top of load() holds back exactly the A rows of that tile, and only this CTA's loads: the
// MMA warps keep consuming the stages already loaded, and the other CTAs keep running.
//
// Why the data is visible (PTX memory model): band b's rows are copied into A (a copy engine
// write, possibly from a peer GPU), then a stream memory operation writes wait_flags[b]; the
// driver orders that write after the stream's earlier memory operations at system scope. Every
// lane of the producer warp reads the flag with ld.acquire.sys until it has reached the call's
// value, so the copy's writes happen-before its later operations; fence.proxy.async.global then
// orders those generic-proxy observations before the lane's later async-proxy operations, the
// TMA loads of A that the elected lane issues next. (The ring reduce-scatter's epilogue waits for
// its addend the same way: signaling_gemm_kernel.cuh, wait_for_addend.)
//
// Cost: a CTA visits its tiles band by band (the scheduler's order), so it checks each band's
// flag once (the last band seen is cached); with every flag already set, a check is one
// system-scope load per band and CTA on the producer warp, hidden behind the loaded stages.
//
// Clusters: a 2x1 cluster's CTAs hold consecutive tile-rows of one band (band_rows is a multiple
// of tile_m * cluster_m), so they wait for the same flag; B's multicast loads of a CTA that waits
// hold back its partner, which needs the same band anyway.
template <class Base>
struct BandWaitMainloop : Base {
  struct Arguments : Base::Arguments {
    uint32_t const* band_flags = nullptr;  // one word per band of A
    uint32_t flag_value = 0;               // band b is there once flags[b] has reached it
    int band_tiles = 1;                    // tile-rows per band
  };

  struct Params : Base::Params {
    uint32_t const* band_flags = nullptr;
    uint32_t flag_value = 0;
    int band_tiles = 1;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) =
        Base::to_underlying_arguments(problem_shape, args, workspace);
    p.band_flags = args.band_flags;
    p.flag_value = args.flag_value;
    p.band_tiles = args.band_tiles;
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return args.band_flags != nullptr && args.band_tiles > 0 &&
           Base::can_implement(problem_shape, args);
  }

  template <class Pipeline, class PipelineState, class LoadInputs, class BlockCoord,
            class KTileIterator>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& shared_tensors) {
    wait_for_band(params, int(cute::get<0>(blk_coord)) / params.band_tiles);
    Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter,
               k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
  }

 private:
  // Every lane of the producer warp waits until flags[band] has reached the call's value. The
  // comparison is wrap-safe (epoch_compare.h): the flags are never reset, each call waits for the
  // next value, and a flag up to 2^31 values behind (left by earlier calls) reads as not reached.
  CUTLASS_DEVICE void wait_for_band(Params const& params, int band) {
    if (band == seen_band_) return;
    uint32_t const* flag = params.band_flags + band;
    while (true) {
      uint32_t seen;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
      if (EpochReached(seen, params.flag_value)) break;
      __nanosleep(256);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
    seen_band_ = band;
  }

  int seen_band_ = -1;  // the band whose flag this CTA's producer warp saw set last
};

}  // namespace fo_jax::detail
