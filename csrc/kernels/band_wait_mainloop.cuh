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
// lane of the producer warp reads the flags with strong (relaxed, system-scope) loads and, once
// the band it needs has reached the call's value, executes fence.acq_rel.sys: a strong read
// followed by that fence is an acquire pattern, so the copies of every band it saw set
// happen-before the lane's later operations; fence.proxy.async.global then orders those
// generic-proxy observations before the lane's later async-proxy operations, the TMA loads of A
// that the elected lane issues next. (The ring reduce-scatter's epilogue waits for its addend
// with one ld.acquire.sys per group instead: signaling_gemm_kernel.cuh, wait_for_addend.)
//
// Cost: a check reads every band's flag in one pass of independent loads (one round trip per 4
// bands, not one per band) and remembers each band it saw set (`ready_`), so a CTA fences once
// per pass that finds its band, not once per band: with every flag already set, once per CTA.
// One load per band and check cost ping-pong bf16 +1.0-3.4% of GPU time with 16 bands (each CTA
// meets a new band nearly every tile), against +0.1-0.8% with 4
// (benchmarks/results/consumer_gemm_2026-11-24_acc2c6c_bands.md).
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
    int num_bands = 1;                     // words in band_flags (at most 64)
  };

  struct Params : Base::Params {
    uint32_t const* band_flags = nullptr;
    uint32_t flag_value = 0;
    int band_tiles = 1;
    int num_bands = 1;
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
    p.num_bands = args.num_bands;
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return args.band_flags != nullptr && args.band_tiles > 0 && args.num_bands > 0 &&
           args.num_bands <= 64 && Base::can_implement(problem_shape, args);
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
  // Every lane of the producer warp waits until flags[band] has reached the call's value (see
  // above). The comparison is wrap-safe (epoch_compare.h): the flags are never reset, each call
  // waits for the next value, and a flag up to 2^31 values behind (left by earlier calls) reads
  // as not reached. Every lane reads the same words in the same order, so `ready_` is the same
  // in every lane.
  CUTLASS_DEVICE void wait_for_band(Params const& params, int band) {
    if ((ready_ >> band) & 1u) return;
    // Loads in flight per round trip: 8 spilled registers in the ping-pong kernel (the producer
    // warp has few).
    constexpr int kChunk = 4;
    while (true) {
      uint64_t seen_set = 0;
      for (int first = 0; first < params.num_bands; first += kChunk) {
        uint32_t seen[kChunk];
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kChunk; ++i) {
          seen[i] = params.flag_value;  // past the last band: counts as set, never used
          if (first + i < params.num_bands) {
            asm volatile("ld.relaxed.sys.global.u32 %0, [%1];"
                         : "=r"(seen[i]) : "l"(params.band_flags + first + i) : "memory");
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kChunk; ++i) {
          if (first + i < params.num_bands && EpochReached(seen[i], params.flag_value)) {
            seen_set |= uint64_t{1} << (first + i);
          }
        }
      }
      if ((seen_set >> band) & 1u) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        asm volatile("fence.proxy.async.global;" ::: "memory");
        ready_ |= seen_set;
        return;
      }
      __nanosleep(256);
    }
  }

  uint64_t ready_ = 0;  // bit b: this CTA's producer warp saw band b's flag set, and fenced
};

}  // namespace fo_jax::detail
