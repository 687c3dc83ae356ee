// Internal template of the signaling GEMM: a CUTLASS 3.x sm90 warp-specialized persistent kernel
// (TMA loads, WGMMA, fp32 accumulation) with pieces of our own: a tile scheduler that visits
// output tiles group by group (group_tile_scheduler.cuh), an epilogue (here) that writes each
// tile to its (possibly permuted) rows of D and then signals counters[group], and for the
// consumer kernels a mainloop that waits for A's bands (band_wait_mainloop.cuh); plus the
// host-side launcher. Included only by the generated gemm_*.cu files.
// Longer than our ~500-line guideline on purpose: the epilogue, the kernel and the launcher are
// one CUTLASS type stack (each names the others' template parameters), and every generated file
// instantiates it whole; split, each piece would need the others' headers anyway.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_conversion.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "band_wait_mainloop.cuh"
#include "epoch_compare.h"
#include "fp8_promoting_mainloop.cuh"
#include "group_cursor.h"
#include "group_tile_scheduler.cuh"
#include "signaling_gemm.h"
#include "signaling_gemm_internal.h"

namespace fo_jax::detail {

// Epilogue parameters: D, counters, the group table (placement of signaling_gemm.h).
struct EpilogueParams {
  void* d = nullptr;
  uint32_t* counters = nullptr;
  int m = 0, n = 0, batch = 1;
  int tiles_m = 0;
  int rotate = 0;  // tile-rows (batch 1): the tile coordinate is physical, groups are logical
  int period = 1;  // the rotation applies within each run of `period` tile-rows
  int num_groups = 1;
  int group_begin[kMaxGemmGroups + 1] = {};
  int units = 0;  // the scheduler's cluster units (GroupTable::unit_start[num_groups])
  // Ping-pong without a source: signal each tile at the start of the warp group's next tile
  // instead of right after its store (short K; the launcher decides: kDeferSignalsMaxKTiles).
  bool defer_signals = false;
  // SignalingGemmArgs' addend (kernels with a source only): logical tile-rows >= addend_first
  // add the source, rows from (tile-row - addend_first) * tile_m on; the source has
  // tiles_m - addend_first tile-rows (a coordinate there or beyond is outside it: TMA fills
  // zeros, reads nothing). Its tile-row s is read once addend_flags[group of s] >=
  // addend_flag_value.
  int addend_first = 0;
  uint32_t addend_flag_value = 0;
  const uint32_t* addend_flags = nullptr;
  // SignalingGemmArgs' addend_abandoned (nullptr: none): read by the epilogue warp after each
  // group's flag; once it has reached addend_flag_value, the group's tiles add a tile of
  // addend_nan (a descriptor of its own, SourceParams::nan) instead of their rows.
  const uint32_t* addend_abandoned = nullptr;
  const void* addend_nan = nullptr;
  // SignalingGemmArgs' tail output (kernels with a source only; nullptr: none): logical
  // tile-rows >= tail_first are stored into tail_out (tiles_m - tail_first tile-rows) instead
  // of D.
  void* tail_out = nullptr;
  int tail_first = 0;
};

// ---------------------------------------------------------------------------------------------
// Signaling epilogue.
//
// Store: CUTLASS's sm90 TMA warp-specialized epilogue (registers -> smem -> TMA store, issued by
// warp 0 of the consumer set), every tile. Batch 1: D is one [m, n] matrix and a tile goes to its
// physical tile-row (TMA clips the partial last tile at D's end). Batch > 1 with one group: D is
// [batch, m, n] (the group-major layout of one group), each batch clipped at its own m rows.
// Batch > 1 with groups: D is one [batch * m, n] matrix and a tile goes to its tile-row of the
// group-major layout, a whole tile inside its band: the launcher runs a last group whose rows
// are not whole tiles as a launch of its own (one group), so no tile can spill into the next
// band, and the kernel has one store path.
//
// Why the signal is correct (PTX memory model):
//  * A tile's global writes are performed by the async proxy on behalf of the issuing lanes of
//    warp 0. Each lane of warp 0 executes cp.async.bulk.wait_group N (the full-completion form,
//    not .read, which only says smem was read): when it returns, the writes of all but the
//    newest N of its bulk groups are complete and visible to that thread.
//    fence.proxy.async.global then orders those async-proxy writes with the thread's subsequent
//    generic-proxy operations, and __syncwarp orders every lane before lane 0.
//  * Lane 0 then performs ONE red.release.gpu.global.add.u32 on counters[group] (without a
//    source, the signal warp does, after the consumers' handoff; see "When"). A release is
//    cumulative: every write that happens-before it (the whole tile, via the steps above) is
//    visible at GPU scope before the counter update is. A consumer that observes the value with
//    an acquire load (spin kernel) or with cuStreamWaitValue32 followed by stream-ordered work
//    therefore sees the complete tiles. (The same shape as cutlass/barrier.h's arrive_inc.)
//
// When: a signal is a release at GPU scope, whose fence waits for the signalling thread's writes
// to reach L2, so a CTA adds up its consecutive tiles of one group and signals them with one add
// of the count when its next tile belongs to another group, at the start of that tile's epilogue
// (the stores are long complete by then, their wait is free), or in store_tail() at the end.
// Tiles run group by group, so a group completes no later than with per-tile signals (its last
// tile decides). Who issues the add:
//  * Ping-pong with a source: lane 0 of the warp group's warp 0, in store_tail() after every
//    tile, right after its store (the producer's epilogue warp loads the source there).
//  * Ping-pong without a source: store_tail() runs inside the warp groups' ordered epilogue turn
//    (CUTLASS's kernel lets the other warp group's epilogue start only after it), so whatever
//    the signal waits for there lengthens every tile's turn. The release is therefore not the
//    warp group's: warp 0 hands (group, count) over to the producer warp group's epilogue warp
//    (the signal warp; named barriers, see PingpongHandoff), which adds it. The stores'
//    completion must still be awaited by warp 0, which issued them: right after the store, in
//    store_tail(), where it hides behind the other warp group's mainloop at long K; but at short
//    K, where a turn is as long as that mainloop, it does not (8 signalling groups cost +18% of
//    the GEMM at 4096x4096x512 with the wait and the fence in the turn, +11% with the handoff
//    and the deferral below: docs/gemm_performance.md, "The producer's signals"). With
//    EpilogueParams::defer_signals (K of at most kDeferSignalsMaxKTiles k-tiles) a tile is
//    handed over one turn later, at the start of the warp group's next tile's store() (its
//    stores are complete by then: the wait is free), or in store_tail() if it is the warp
//    group's last tile; its signal comes up to one short mainloop later.
//  * Cooperative (without a source): both warp groups would wait for the fence, as no MMA runs
//    during a cooperative epilogue (+2.4-3.5% for fp8 at 4096x8192x2048). Warp 0 instead hands
//    (group, count) over through shared memory (SignalHandoff: two mbarriers, release/acquire at
//    CTA scope, so the handed-over writes happen-before what the receiver does next) to the
//    producer warp group's epilogue warp, idle without a source, whose add then releases them at
//    GPU scope (a release is cumulative). Measured: +0.0-0.3% (docs/gemm_performance.md,
//    "The producer's signals").
// ---------------------------------------------------------------------------------------------
// kSource: CUTLASS's epilogue with a source C (D = acc + C, C loaded by TMA in the producer's
// epilogue warp), for SignalingGemmArgs' addend, a [rows, n] matrix. Every tile loads it, at its
// own rows for the tiles that add it and outside it (TMA's zero fill, no memory read) for the
// others; the epilogue warp waits for the flag of the addend rows' group before loading a tile
// that adds them. (Adding it from the consumer warps' registers instead spilled registers in the
// ping-pong kernel, whose 192 accumulators per thread leave ~40.) The tiles of the tail output
// (SignalingGemmArgs::tail_out) are stored by a second CUTLASS epilogue object whose parameters
// hold the tail's TMA store descriptor, made for each such tile: its only state across tiles,
// the count of issued stores, starts at 0, as the kernel's own object's does after store_tail(),
// which the ping-pong kernel calls after every tile (the launcher allows no other kernel).
// With SignalingGemmArgs::addend_abandoned, the epilogue warp reads that word once it has seen a
// group's flag; if the call was released rather than sent the group's rows, it loads the
// group's tiles' source from addend_nan, one tile of NaNs, through a third descriptor (a third
// epilogue object, as the tail's stores use a second): D = acc + NaN, so those tiles' partial
// sums, and through the copies the next GPU's sums, read as failed. The consumer warps do
// nothing new, so the healthy path costs one more load per group and CTA on the epilogue warp.
//
// kScaled (the fp8 kernels): D = a_scale * b_scale * acc, the two scales device scalars read by
// CUTLASS's scalar broadcast (which multiplies its inputs), so the host never reads them.
template <class Element>
using ScaledAccumulator = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, Element, float,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90ScalarBroadcast<
        float, cute::Stride<cute::_0, cute::_0, cute::_0>, 2>,
    cutlass::epilogue::fusion::Sm90AccFetch>;

// kEpiStagesD (0: the builder's 2): how many epilogue subtiles' stores may be in flight. A
// subtile waits until the store kEpiStagesD subtiles back has left shared memory, and during a
// cooperative epilogue no MMA runs; each more costs one subtile of shared memory, which the
// mainloop's stage count gives back (GemmKernelConfig).
template <class Element, class TileShape, class ClusterShape, bool kPingpong, bool kSource,
          bool kScaled = false, int kEpiStagesD = 0>
struct TmaEpilogueInner {
  static_assert(!(kSource && kScaled), "no kernel both adds a source and scales");
  using Stride = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using Schedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                      cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using ElementC = std::conditional_t<kSource, Element, void>;
  using Fusion = std::conditional_t<
      kScaled, ScaledAccumulator<Element>,
      cutlass::epilogue::fusion::LinearCombination<Element, float, ElementC, float>>;
  // The builder's subtile and policy (what its CollectiveBuilder computes and passes to
  // Sm90TmaBuilderImpl), with kEpiStagesD stores in flight when set.
  using EpilogueTile = decltype(cutlass::epilogue::collective::detail::
                                    sm90_compute_tile_shape_or_override<
                                        Element, cutlass::epilogue::collective::EpilogueTileAuto,
                                        Schedule, TileShape>());
  using BuiltPolicy = decltype(cutlass::epilogue::collective::detail::sm90_get_tma_dispatch_policy<
                               TileShape, EpilogueTile, ElementC, Element, Schedule>());
  using Policy = cutlass::epilogue::Sm90TmaWarpSpecialized<
      BuiltPolicy::StagesC, kEpiStagesD != 0 ? kEpiStagesD : BuiltPolicy::StagesD,
      BuiltPolicy::FragmentSize, BuiltPolicy::ReuseSmemC, BuiltPolicy::DelayTmaStore>;
  using type = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      TileShape, EpilogueTile, float, float, ElementC, Stride, 8, Element, Stride, 8, Fusion,
      Policy>::CollectiveOp;
  // Without kEpiStagesD the epilogue is the builder's own, so a CUTLASS whose builder differs
  // fails here rather than changing those kernels.
  static_assert(kEpiStagesD != 0 ||
                std::is_same_v<type, typename cutlass::epilogue::collective::CollectiveBuilder<
                                         cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
                                         TileShape, ClusterShape,
                                         cutlass::epilogue::collective::EpilogueTileAuto, float,
                                         float, ElementC, Stride, 8, Element, Stride, 8,
                                         Schedule, Fusion>::CollectiveOp>,
                "the builder's epilogue differs from its policy rebuilt here");
};

// With a source, CUTLASS's builder shares C's shared memory with D (ReuseSmemC): a source
// subtile's load then waits for the store that frees its buffer, and the load latency lands on
// the ping-pong epilogue, which must fit in the other warp group's MMA. Measured on one H200 with
// 3 of 4 tiles reading a source (results/gemm_ring_probe_h200_2026-11-22_stages.log):
// +39 us per 8192x8192x2048 GEMM (~410 us) with the builder's epilogue, +14-18 us with C in 12
// buffers of its own (a whole tile ahead, one mainloop stage fewer), +4-11 us with 4 of its own
// (kSourceStagesC: the producer's epilogue warp loads up to 4 subtiles ahead of the consumer, as
// soon as they are read, not stored; the mainloop keeps its 5 stages).
inline constexpr int kSourceStagesC = 4;
template <class Element, class TileShape, class ClusterShape>
struct TmaEpilogueInner<Element, TileShape, ClusterShape, true, true, false, 0> {
  using Stride = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using Schedule = cutlass::epilogue::TmaWarpSpecialized;
  using EpilogueTile = decltype(cutlass::epilogue::collective::detail::
                                    sm90_compute_tile_shape_or_override<
                                        Element, cutlass::epilogue::collective::EpilogueTileAuto,
                                        Schedule, TileShape>());
  static constexpr int kEpiTiles =
      cute::size(cute::shape_div(cute::take<0, 2>(TileShape{}), EpilogueTile{}));
  using Policy = cutlass::epilogue::Sm90TmaWarpSpecialized<
      (kSourceStagesC < kEpiTiles ? kSourceStagesC : kEpiTiles), (kEpiTiles < 2 ? kEpiTiles : 2),
      cute::size(EpilogueTile{}) / 128, /*ReuseSmemC=*/false, /*DelayTmaStore=*/false>;
  using type = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      TileShape, EpilogueTile, float, float, Element, Stride, 8, Element, Stride, 8,
      cutlass::epilogue::fusion::LinearCombination<Element, float, Element, float>,
      Policy>::CollectiveOp;
};

template <class Element, class TileShape, class ClusterShape, bool kPingpong, bool kSource,
          bool kScaled = false, int kEpiStagesD = 0>
class SignalingTmaEpilogue
    : public TmaEpilogueInner<Element, TileShape, ClusterShape, kPingpong, kSource, kScaled,
                              kEpiStagesD>::type {
 public:
  using Inner = typename TmaEpilogueInner<Element, TileShape, ClusterShape, kPingpong, kSource,
                                          kScaled, kEpiStagesD>::type;
  using typename Inner::LoadPipeline;
  using typename Inner::LoadPipelineState;
  using typename Inner::StorePipeline;
  using typename Inner::StorePipelineState;

  // Kernels without a source hand their signals to the producer warp group's epilogue warp,
  // which CUTLASS's kernel runs when is_producer_load_needed() says so and which otherwise
  // idles: the tensor-core warps then never wait for the release's memory fence (see "When"
  // above). Cooperative: `handoff` carries one signal at a time from the consumers' warp 0 to
  // that warp. Ping-pong: PingpongHandoff.
  static constexpr bool kSignalWarp = !kSource;
  static constexpr bool kCoopHandoff = kSignalWarp && !kPingpong;
  static constexpr bool kPingpongHandoff = kSignalWarp && kPingpong;
  struct SignalHandoff {
    cutlass::arch::ClusterBarrier full;   // the consumers' warp 0 filled the fields below
    cutlass::arch::ClusterBarrier empty;  // the signal warp has read them
    int group;
    uint32_t count;
    int last;  // the consumers' final signal of this CTA
  };
  struct TensorStorageWithHandoff {
    typename Inner::TensorStorage inner;
    alignas(16) SignalHandoff handoff;
  };
  // Ping-pong: one slot per consumer warp group, each carrying one tile's signal (count 0 for a
  // tile outside D) from that warp group's warp 0 to the signal warp, which takes the CTA's
  // tiles in order, t = 0, 1, ..., from slot t % 2 (warp group t % 2 runs tile t). Two named
  // barriers per slot (no initialization, so nothing depends on when the kernel constructs this
  // object): warp 0 bar.arrive()s kFull after filling the slot and, from its second signal on,
  // bar.sync()s kEmpty first, which the signal warp arrives at once it has read the slot and a
  // later tile will use it. bar.arrive synchronizes with the bar.sync of its phase (CTA scope),
  // so the slot's contents and warp 0's completed stores happen-before the signal warp's
  // release, and a slot is never refilled before it is read.
  struct PingpongSlot {
    int group;
    uint32_t count;
  };
  struct TensorStorageWithSlots {
    typename Inner::TensorStorage inner;
    alignas(16) PingpongSlot slot[2];
  };
  using TensorStorage = std::conditional_t<
      kCoopHandoff, TensorStorageWithHandoff,
      std::conditional_t<kPingpongHandoff, TensorStorageWithSlots,
                         typename Inner::TensorStorage>>;
  using typename Inner::PipelineStorage;
  // What the mainloop's stage count carves out of shared memory (GemmKernelConfig).
  struct SharedStorage {
    TensorStorage tensors;
    PipelineStorage pipeline;
  };

  struct Arguments {
    typename Inner::Arguments inner;
    EpilogueParams signal;
  };
  struct NoExtras {};
  // kSource: the tail output's TMA store descriptor and the NaN tile's load descriptor, each as
  // the params of another epilogue object (unused ones stay default).
  struct SourceParams {
    typename Inner::Params tail;
    typename Inner::Params nan;
  };
  using ExtraParams = std::conditional_t<kSource, SourceParams, NoExtras>;
  struct Params {
    typename Inner::Params inner;
    EpilogueParams signal;
    uint32_t tma_transaction_bytes = 0;  // read by the kernel (epilogue load pipeline)
    ExtraParams extra;
  };

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileThreads = kPingpong ? 128 : 256;
  static constexpr int kFirstBarrier = 8;  // cutlass::arch::ReservedNamedBarriers::FirstUserBarrier
  // PingpongHandoff's named barriers: full 8 and 9, empty 10 and 11 (slot 0, 1).
  static constexpr int kSlotFullBarrier = kFirstBarrier;
  static constexpr int kSlotEmptyBarrier = kFirstBarrier + 2;

  // The NaN tile's problem shape (SignalingGemmArgs::addend_nan): one tile.
  CUTLASS_HOST_DEVICE static auto NanShape(int k) {
    return cute::make_shape(int(kTileM), int(kTileN), k, 1);
  }

  // D as the TMA store sees it (see "Store"): [batch, m, n] for batch > 1 with one group, else
  // one matrix of batch * m rows (L = 1).
  template <class ProblemShape>
  CUTLASS_HOST_DEVICE static auto StoreShape(ProblemShape const& ps, EpilogueParams const& sig) {
    const int m = int(cute::get<0>(ps)), batch = kSource ? 1 : int(cute::get<3>(ps));
    const bool natural = batch > 1 && sig.num_groups == 1;
    return cute::make_shape(natural ? m : m * batch, int(cute::get<1>(ps)), int(cute::get<2>(ps)),
                            natural ? batch : 1);
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& args,
                                        void* workspace) {
    Params p;
    p.inner = Inner::to_underlying_arguments(StoreShape(ps, args.signal), args.inner, workspace);
    if constexpr (kSource) {
      // The source's TMA descriptor covers the addend only ([addend rows, n]), not D.
      const EpilogueParams& sig = args.signal;
      auto source_shape = cute::make_shape((sig.tiles_m - sig.addend_first) * kTileM,
                                           int(cute::get<1>(ps)), int(cute::get<2>(ps)), 1);
      p.inner.tma_load_c =
          Inner::to_underlying_arguments(source_shape, args.inner, workspace).tma_load_c;
      if (sig.tail_out != nullptr) {  // the tail output as D: [tail rows, n]
        typename Inner::Arguments tail_args = args.inner;
        tail_args.ptr_D = static_cast<Element*>(sig.tail_out);
        auto tail_shape = cute::make_shape((sig.tiles_m - sig.tail_first) * kTileM,
                                           int(cute::get<1>(ps)), int(cute::get<2>(ps)), 1);
        p.extra.tail = Inner::to_underlying_arguments(tail_shape, tail_args, workspace);
      }
      if (sig.addend_abandoned != nullptr) {  // the NaN tile as C: [tile_m, tile_n]
        typename Inner::Arguments nan_args = args.inner;
        nan_args.ptr_C = static_cast<Element const*>(sig.addend_nan);
        nan_args.dC = cute::make_stride(int64_t(kTileN), cute::Int<1>{}, int64_t(kTileM) * kTileN);
        p.extra.nan = Inner::to_underlying_arguments(NanShape(int(cute::get<2>(ps))), nan_args,
                                                    workspace);
      }
    }
    p.signal = args.signal;
    p.tma_transaction_bytes = p.inner.tma_transaction_bytes;
    return p;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& ps, Arguments const& args) {
    return Inner::get_workspace_size(StoreShape(ps, args.signal), args.inner);
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const& ps, Arguments const& args,
                                              void* workspace, cudaStream_t stream,
                                              cutlass::CudaHostAdapter* adapter = nullptr) {
    return Inner::initialize_workspace(StoreShape(ps, args.signal), args.inner, workspace, stream,
                                       adapter);
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& ps, Arguments const& args) {
    return args.signal.d != nullptr &&
           Inner::can_implement(StoreShape(ps, args.signal), args.inner);
  }
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Inner::prefetch_tma_descriptors(p.inner);
  }

  CUTLASS_HOST_DEVICE SignalingTmaEpilogue(Params const& params, TensorStorage& shared)
      : Inner(params.inner, InnerStorage(shared)), p_(&params.signal),
        extra_params_(&params.extra), handoff_(HandoffOf(shared)), slots_(SlotsOf(shared)) {}

  // The cooperative kernel asks this once, in every thread, before it initializes its pipelines
  // and synchronizes the cluster (the ping-pong kernel asks twice, never from thread 0 again);
  // with signals, thread 0 initializes the handoff's barriers here, fenced as CUTLASS's
  // pipelines fence theirs, so the kernel's cluster synchronization publishes them.
  CUTLASS_DEVICE bool is_producer_load_needed() const {
    if constexpr (kPingpongHandoff) {
      return p_->counters != nullptr;
    } else if constexpr (kCoopHandoff) {
      if (p_->counters == nullptr) return false;
      if (threadIdx.x == 0) {
        handoff_->full.init(1);
        handoff_->empty.init(1);
        cutlass::arch::fence_barrier_init();
      }
      return true;
    } else {
      return Inner::is_producer_load_needed();
    }
  }

  // The producer's epilogue warp, once per tile. kSignalWarp: it notes that the consumers will
  // store tiles (cooperative: and so hand over a last signal); its signals wait for load_tail().
  // kSource: the tile's source rows are the addend's rows of its tile-row if it adds it (after
  // the addend's flag is set), else rows past the addend's end, which TMA fills with zeros
  // without reading memory. Without either, nothing calls it.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma>
  CUTLASS_DEVICE auto load(LoadPipeline load_pipeline, LoadPipelineState load_state,
                           ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape,
                           TileCoordMNKL tile_coord, TiledMma tiled_mma, int thread_idx,
                           TensorStorage& shared, int subtile_idx = -1) {
    using namespace cute;
    if constexpr (kSignalWarp) {
      saw_tile_ = true;
      return load_state;
    }
    EpilogueParams const& p = *p_;
    const int m_idx = logical_tile_row(int(get<0>(tile_coord)));
    const int addend_tiles = p.tiles_m - p.addend_first;
    int source_row = addend_tiles;  // outside the addend: zeros
    if (m_idx >= p.addend_first) {  // (no padding tiles: the launcher requires whole clusters)
      source_row = m_idx - p.addend_first;
      wait_for_addend(group_of(source_row));
      if constexpr (kSource) {
        if (addend_abandoned_) {  // the call was released: NaNs instead of rows that never came
          Inner nan(extra_params_->nan, InnerStorage(shared));
          return nan.load(load_pipeline, load_state, NanShape(int(get<2>(problem_shape))),
                          tile_shape, make_coord(0, 0, get<2>(tile_coord), 0), tiled_mma,
                          thread_idx, InnerStorage(shared), subtile_idx);
        }
      }
    }
    auto source_coord = make_coord(source_row, get<1>(tile_coord), get<2>(tile_coord), 0);
    auto source_shape = make_shape(addend_tiles * kTileM, int(get<1>(problem_shape)),
                                   int(get<2>(problem_shape)), 1);
    return Inner::load(load_pipeline, load_state, source_shape, tile_shape, source_coord,
                       tiled_mma, thread_idx, InnerStorage(shared), subtile_idx);
  }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine,
            class AccLayout, class TiledMma, class... Ts>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadPipelineState load_state,
                            StorePipeline store_pipeline, StorePipelineState store_state,
                            ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape,
                            TileCoordMNKL tile_coord,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma,
                            int thread_idx, TensorStorage& shared, Ts... rest) {
    using namespace cute;
    EpilogueParams const& p = *p_;
    auto result = cute::make_tuple(load_state, store_state);

    const int m_phys = int(get<0>(tile_coord));
    const int n_idx = int(get<1>(tile_coord));
    const int l_idx = int(get<3>(tile_coord));
    const bool valid = m_phys < p.tiles_m;  // (a rotation permutes [0, tiles_m))
    // Ping-pong without a source: the warp group's previous tile is signalled now, whatever this
    // one is (see "When"); otherwise pending tiles are signalled when the group changes.
    if constexpr (kPingpongHandoff) {
      if (has_pending_) hand_over_pending();
    }
    // The logical row and its group matter for signals, the group-major layout and the tail
    // output; a plain GEMM skips the lookup.
    int m_idx = m_phys, g = 0;
    if (valid && (kSource || p.counters != nullptr || p.batch > 1)) {  // (uniform)
      m_idx = logical_tile_row(m_phys);
      g = group_of(m_idx);
    }
    if (!kPingpongHandoff && valid && pending_count_ > 0 && g != pending_group_) {
      flush_signal();
    }
    auto shape = StoreShape(problem_shape, p);
    auto coord = make_coord(m_phys, n_idx, get<2>(tile_coord), 0);
    if (!kSource && p.batch > 1) {  // (the launcher gives a source batch 1 only)
      if (p.num_groups == 1) {
        get<3>(coord) = l_idx;
      } else {
        const int b0 = p.group_begin[g], rows = p.group_begin[g + 1] - b0;
        get<0>(coord) = valid ? p.batch * b0 + l_idx * rows + (m_idx - b0) : p.batch * p.tiles_m;
      }
    }
    // Every tile, even one past D's rows (a cluster's padding tile, whose coordinate then lies
    // past D's end, so that TMA writes none of it), runs CUTLASS's store, as the stock kernel
    // does: no branch around its barriers.
    Inner* target = this;
    if constexpr (kSource) {
      // One inlined store either way: the tail tile only swaps the object, shape and row.
      Inner tail(extra_params_->tail, InnerStorage(shared));
      if (p.tail_out != nullptr && m_idx >= p.tail_first) {
        target = &tail;
        get<0>(shape) = (p.tiles_m - p.tail_first) * kTileM;
        get<0>(coord) = m_idx - p.tail_first;
      }
      result = target->store(load_pipeline, load_state, store_pipeline, store_state, shape,
                             tile_shape, coord, accumulators, tiled_mma, thread_idx,
                             InnerStorage(shared), rest...);
    } else {
      result = Inner::store(load_pipeline, load_state, store_pipeline, store_state, shape,
                            tile_shape, coord, accumulators, tiled_mma, thread_idx,
                            InnerStorage(shared), rest...);
    }
    if (valid && p.counters != nullptr) {
      pending_group_ = g;
      ++pending_count_;
    }
    if constexpr (kPingpongHandoff) {
      has_pending_ = p.counters != nullptr;  // one signal per tile, count 0 outside D
    }
    return result;
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline load_pipeline, LoadPipelineState load_state,
                                 StorePipeline store_pipeline, StorePipelineState store_state) {
    if constexpr (kPingpongHandoff) {
      // Called after every tile (CUTLASS's ping-pong kernel). Deferred signals: the warp group's
      // last tile is handed over here, its earlier ones at the start of the next tile's store().
      auto result = Inner::store_tail(load_pipeline, load_state, store_pipeline, store_state);
      if (has_pending_) {
        const int tile = 2 * wg_tiles_ + (cutlass::canonical_warp_group_idx() - 1);
        if (!p_->defer_signals || tile + 2 >= CtaTiles()) hand_over_pending();
      }
      ++wg_tiles_;
      return result;
    } else {
      flush_signal(/*last=*/true);
      return Inner::store_tail(load_pipeline, load_state, store_pipeline, store_state);
    }
  }

  // The producer's epilogue warp after its last tile. kSignalWarp: lane 0 signals what the
  // consumers hand over, until their last handoff (there is one if this CTA had a tile: the
  // consumers then call store_tail()).
  CUTLASS_DEVICE auto load_tail(LoadPipeline load_pipeline, LoadPipelineState load_state) {
    if constexpr (kPingpongHandoff) {
      if (saw_tile_) run_pingpong_signal_warp();
      return load_state;
    } else if constexpr (kCoopHandoff) {
      if (saw_tile_ && cute::elect_one_sync()) run_signal_warp();
      return load_state;
    } else {
      return Inner::load_tail(load_pipeline, load_state);
    }
  }

 private:
  // Logical tile-row (what the group table counts) of a physical one; equal unless rotated.
  CUTLASS_DEVICE int logical_tile_row(int m_phys) const {
    EpilogueParams const& p = *p_;
    if (p.rotate == 0) return m_phys;
    const int m_base = m_phys / p.period * p.period;
    return m_phys - m_base >= p.rotate ? m_phys - p.rotate : m_phys + p.period - p.rotate;
  }

  // Every lane of the epilogue warp waits until the flag of group g of the addend has reached
  // the call's value (acquire at system scope: another GPU's stream memory operation wrote it
  // after its copy), then orders the generic proxy's view before its async-proxy (TMA) loads.
  // The flag is in this GPU's memory and usually set long before (the ring's partial sums land
  // about a band's time before this GPU reaches them); a CTA visits its tiles group by group,
  // so it checks each group's flag once.
  CUTLASS_DEVICE void wait_for_addend(int g) {
    if (g == addend_seen_group_) return;
    EpilogueParams const& p = *p_;
    while (true) {
      uint32_t seen;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(p.addend_flags + g)
                   : "memory");
      if (EpochReached(seen, p.addend_flag_value)) break;  // wrap-safe: epoch_compare.h
      __nanosleep(256);
    }
    if (p.addend_abandoned != nullptr) {
      // A release writes `abandoned` before the flags it releases (stream memory operations,
      // fenced in order): after the flag's acquire, this load sees a release's mark.
      uint32_t mark;
      asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(mark) : "l"(p.addend_abandoned)
                   : "memory");
      addend_abandoned_ = EpochReached(mark, p.addend_flag_value);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
    addend_seen_group_ = g;
  }

  // The group of a logical tile-row (GroupCursor: the tiles of a CTA visit the groups in order).
  CUTLASS_DEVICE int group_of(int m_idx) {
    return group_cursor_.find(p_->group_begin, p_->num_groups, m_idx);
  }

  // Signals the pending tiles now. All kTileThreads threads of the set call this together
  // (the pending state is uniform). Tiles written by TMA: warp 0 of the set issued their stores,
  // so all of its lanes wait until none of their bulk async-groups is pending (the
  // full-completion form, not .read), fence the async proxy against the generic proxy, and order
  // themselves before lane 0 (__syncwarp). Lane 0 then adds the count with release semantics at
  // GPU scope, or (kCoopHandoff) hands it to the signal warp, whose release is cumulative over
  // what lane 0's handoff made visible to it. The whole warp runs both, lane 0 acting through a
  // predicate inside the instruction: a branch on the lane, like one on the thread index, would
  // cost the compiler its proof that warps stay converged (IsSetWarp0). `last`: store_tail()'s
  // call, which a signal warp waits for even when nothing is pending.
  CUTLASS_DEVICE void flush_signal(bool last = false) {
    const bool hand_over_last = kCoopHandoff && last && p_->counters != nullptr;
    if (pending_count_ == 0 && !hand_over_last) return;
    if (IsSetWarp0()) {
      if (pending_count_ > 0) {
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __syncwarp();
      }
      if constexpr (kCoopHandoff) {
        hand_over(pending_group_, pending_count_, last);
      } else {
        signal(pending_group_, pending_count_, cutlass::canonical_lane_idx() == 0);
      }
    }
    pending_group_ = -1;
    pending_count_ = 0;
  }

  // Adds `count` to the group's counter (release, GPU scope) if `issue`: a predicate of the
  // instruction, not a branch, so that a whole warp can call it for one lane.
  CUTLASS_DEVICE void signal(int group, uint32_t count, bool issue = true) {
    uint32_t* ctr = p_->counters + group;
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t"
        "@p red.release.gpu.global.add.u32 [%0], %1;\n\t}"
        ::"l"(ctr), "r"(count), "r"(int(issue)) : "memory");
  }

  // Warp 0 of the consumers, all lanes: waits until the signal warp has read the previous
  // handoff (long done: it follows a whole tile's mainloop), fills the next one (every lane
  // writes the same values; __syncwarp orders them before lane 0) and lane 0 arrives (release,
  // CTA scope; a predicate, not a branch). The barrier expects one arrival per phase. A handoff
  // per barrier phase, strictly alternating, so neither side can run a phase ahead of the other.
  CUTLASS_DEVICE void hand_over(int group, uint32_t count, bool last) {
    SignalHandoff& h = *handoff_;
    if (handoffs_ > 0) h.empty.wait((handoffs_ - 1) & 1);
    h.group = group;
    h.count = count;
    h.last = last ? 1 : 0;
    __syncwarp();
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %1, 0;\n\t"
        "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n\t}"
        ::"r"(cute::cast_smem_ptr_to_uint(&h.full)), "r"(cutlass::canonical_lane_idx())
        : "memory");
    ++handoffs_;
  }

  // Lane 0 of the producer's epilogue warp: takes each handoff (acquire, CTA scope), frees it,
  // and adds its count (release, GPU scope), until the last.
  CUTLASS_DEVICE void run_signal_warp() {
    SignalHandoff& h = *handoff_;
    for (uint32_t k = 0;; ++k) {
      h.full.wait(k & 1);
      const int group = h.group;
      const uint32_t count = h.count;
      const bool last = h.last != 0;
      h.empty.arrive();
      if (count > 0) signal(group, count);
      if (last) return;
    }
  }

  // Whether this thread's warp is warp 0 of its set of kTileThreads (the warp that issued the
  // set's TMA stores): threadIdx.x % kTileThreads < 32, but from the warp index broadcast by a
  // shuffle, which the compiler knows to be uniform in the warp. With a predicate on the thread
  // index it cannot tell that the branch keeps warps converged, and the ping-pong kernels' main
  // loop, which follows it in the tile loop, then computes its operand descriptors per thread
  // and moves them to uniform registers before every MMA (about 50 more instructions per
  // k-tile of 128x128, and a warp sync).
  CUTLASS_DEVICE static bool IsSetWarp0() {
    return cutlass::canonical_warp_idx_sync() % (kTileThreads / cutlass::NumThreadsPerWarp) == 0;
  }

  // This CTA's tiles, as GroupOrderedScheduler hands them out without split K (the ping-pong
  // kernels).
  CUTLASS_DEVICE int CtaTiles() const {
    return GroupOrderedScheduler<cute::size<0>(ClusterShape{})>::CtaUnits(p_->units);
  }

  // Ping-pong: all kTileThreads threads of the warp group call this together (the pending state
  // is uniform). Every lane of warp 0 (which issued the TMA stores) waits until none of its bulk
  // async-groups is pending (full completion), fences the async proxy against the generic one,
  // waits for the slot to be free (not before its first signal) and fills it (every lane writes
  // the same values, as in hand_over); then the lanes arrive at the slot's full barrier
  // (PingpongHandoff).
  CUTLASS_DEVICE void hand_over_pending() {
    if (IsSetWarp0()) {
      const int slot = cutlass::canonical_warp_group_idx() - 1;
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
      if (handoffs_ > 0) {
        asm volatile("bar.sync %0, 64;" ::"r"(kSlotEmptyBarrier + slot) : "memory");
      }
      slots_[slot].group = pending_group_;
      slots_[slot].count = pending_count_;
      __syncwarp();  // bar.arrive is .aligned: the whole warp, converged
      asm volatile("bar.arrive %0, 64;" ::"r"(kSlotFullBarrier + slot) : "memory");
      ++handoffs_;
    }
    has_pending_ = false;
    pending_group_ = -1;
    pending_count_ = 0;
  }

  // Ping-pong: the producer's epilogue warp, all lanes, after its last tile. Takes the CTA's
  // tiles' signals in tile order (tile t from slot t % 2), frees a slot that a later tile will
  // use, and lane 0 adds each nonzero count (release, GPU scope).
  CUTLASS_DEVICE void run_pingpong_signal_warp() {
    const int tiles = CtaTiles();
    const bool lane0 = cute::elect_one_sync();
    for (int t = 0; t < tiles; ++t) {
      const int slot = t & 1;
      asm volatile("bar.sync %0, 64;" ::"r"(kSlotFullBarrier + slot) : "memory");
      const int group = slots_[slot].group;
      const uint32_t count = slots_[slot].count;
      if (t + 2 < tiles) {
        asm volatile("bar.arrive %0, 64;" ::"r"(kSlotEmptyBarrier + slot) : "memory");
      }
      if (lane0 && count > 0) signal(group, count);
      __syncwarp();  // converged again before the next (aligned) bar.sync
    }
  }

  CUTLASS_HOST_DEVICE static typename Inner::TensorStorage& InnerStorage(TensorStorage& shared) {
    if constexpr (kSignalWarp) {
      return shared.inner;
    } else {
      return shared;
    }
  }
  CUTLASS_HOST_DEVICE static SignalHandoff* HandoffOf(TensorStorage& shared) {
    if constexpr (kCoopHandoff) {
      return &shared.handoff;
    } else {
      return nullptr;
    }
  }
  CUTLASS_HOST_DEVICE static PingpongSlot* SlotsOf(TensorStorage& shared) {
    if constexpr (kPingpongHandoff) {
      return shared.slot;
    } else {
      return nullptr;
    }
  }

  EpilogueParams const* p_;
  ExtraParams const* extra_params_;
  SignalHandoff* handoff_;       // kCoopHandoff: in shared memory
  PingpongSlot* slots_;          // kPingpongHandoff: in shared memory
  uint32_t handoffs_ = 0;        // the consumers' warp 0 (ping-pong: each group's): handoffs
  int wg_tiles_ = 0;             // ping-pong consumers: tiles this warp group has stored
  bool has_pending_ = false;     // ping-pong consumers: a stored tile awaits its handoff
  bool saw_tile_ = false;        // the signal warp: this CTA's consumers store tiles
  int pending_group_ = -1;  // group of the tiles stored but not yet signalled
  uint32_t pending_count_ = 0;
  GroupCursor group_cursor_;     // group_of()'s last answer
  int addend_seen_group_ = -1;   // the addend group whose flag the epilogue warp saw set last
  bool addend_abandoned_ = false;  // ... and whether its call was released (abandoned) then
};

// ---------------------------------------------------------------------------------------------
// Kernel type from a config row. kConsumer: the consumer ("all-gather") kernel, whose mainloop
// waits for A's bands and whose scheduler visits groups in the host's band order.
// ElementOut_ (default: the input type) is D's type. fp8 inputs (one-byte Element_): B is read
// K-major ([n, k] row-major; fp8 wgmma takes both operands K-major from shared memory), and the
// epilogue scales by a_scale * b_scale. The builder then picks CUTLASS's fp8 mainloop
// (MainloopSm90TmaGmmaWarpSpecializedFP8), which adds the tensor cores' partial sums into fp32
// registers every kPromotionKTiles k-tiles: the FP8FastAccum schedules keep the whole K sum in the tensor
// cores' accumulator, whose fp8 additions keep fewer mantissa bits, so a long K loses accuracy.
// kFastAccum (fp8 only, opt-in): those schedules, with one accumulator per output element.
// kPromotionKTiles (accurate fp8 only): k-tiles of partial sums in the tensor cores' accumulator
// per addition into the fp32 one. Every addition waits for the MMAs in flight, so fewer
// additions stall the tensor cores less, at the cost of longer partial sums. The accurate
// kernels keep the builder's mainloop for their loads and run PromotingFp8Mainloop's mma()
// (fp8_promoting_mainloop.cuh: the same sums, no accumulator zeroed at a tile's start);
// kCutlassFp8Mma keeps CUTLASS's mma() (measure-only twins for side-by-side timing:
// csrc/kernels/gemm_configs.py); kFp8LateRelease gives PromotingFp8Mainloop CUTLASS's order of
// release and promotion (cooperative 128x128).
// kEpiStagesD: the epilogue's stores in flight (TmaEpilogueInner; 0: CUTLASS's builder's).
// ---------------------------------------------------------------------------------------------
template <class Element_, int kTM, int kTN, int kTK, int kCM, int kCN, bool kPingpong,
          bool kSource = false, bool kConsumer = false, class ElementOut_ = Element_,
          bool kFastAccum = false, int kPromotionKTiles = 1, int kEpiStagesD = 0,
          bool kCutlassFp8Mma = false, bool kFp8LateRelease = false>
struct GemmKernelConfig {
  static_assert(kCN == 1, "clusters along N are not supported by the group scheduler");
  static_assert(!(kSource && kConsumer), "no kernel both adds a source and waits for bands");
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static_assert(!kFp8 || !kSource, "fp8 kernels have no source form");
  static constexpr int kAlignIn = 16 / int(sizeof(Element));  // elements in 16 bytes
  using TileShape = cute::Shape<cute::Int<kTM>, cute::Int<kTN>, cute::Int<kTK>>;
  using ClusterShape = cute::Shape<cute::Int<kCM>, cute::Int<kCN>, cute::_1>;
  using StrideA = cute::Stride<int64_t, cute::Int<1>, int64_t>;          // x[m,k], batch m*k
  using StrideB = std::conditional_t<kFp8,
                                     cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>,  // w[n,k]
                                     cute::Stride<cute::Int<1>, int64_t, cute::Int<0>>>; // w[k,n]
  using Epilogue =
      SignalingTmaEpilogue<ElementOut, TileShape, ClusterShape, kPingpong, kSource, kFp8,
                           kEpiStagesD>;
  static constexpr bool kHasSource = kSource;
  static constexpr bool kIsConsumer = kConsumer;
  static_assert(!kFastAccum || kFp8, "fast accumulation is an fp8 schedule");
  static_assert(kPromotionKTiles >= 1 && (kPromotionKTiles == 1 || (kFp8 && !kFastAccum)),
                "the promotion interval is the accurate fp8 mainloop's");
  static constexpr bool kPromotes = kFp8 && !kFastAccum;
  static constexpr int kPromotionKTilesValue = kPromotionKTiles;
  using PreciseSchedule =
      std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using FastAccumSchedule =
      std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum>;
  using Schedule = std::conditional_t<kFastAccum, FastAccumSchedule, PreciseSchedule>;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, StrideA, kAlignIn, Element,
      StrideB, kAlignIn, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  static_assert(!kCutlassFp8Mma || kPromotes, "the choice of mma() is the accurate fp8 one's");
  static_assert(!kFp8LateRelease || (kPromotes && !kCutlassFp8Mma),
                "the release order is PromotingFp8Mainloop's");
  using PromotingMainloop = std::conditional_t<
      kPromotes && !kCutlassFp8Mma,
      PromotingFp8Mainloop<BuiltMainloop, kPromotionKTiles, kFp8LateRelease>, BuiltMainloop>;
  using Mainloop =
      std::conditional_t<kConsumer, BandWaitMainloop<PromotingMainloop>, PromotingMainloop>;
  // Split K (SignalingGemmArgs::k_splits) in the cooperative kernels without a source or a
  // consumer mainloop: the ones whose CUTLASS kernel calls the scheduler's fixup.
  static constexpr bool kSplitK = !kPingpong && !kSource && !kConsumer;
  using SchedulerTag = std::conditional_t<
      kConsumer, OrderedGroupSchedulerTag,
      std::conditional_t<kSplitK, SplitKGroupSchedulerTag, GroupSchedulerTag>>;
  using Table = std::conditional_t<kConsumer, OrderedGroupTable, GroupTable>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, SchedulerTag>;
  static constexpr int kTileM = kTM, kTileN = kTN, kTileK = kTK, kClusterM = kCM;
};

// Per (config, device) one-time state: attribute set and the co-resident cluster limit.
template <class Cfg>
struct KernelState {
  static constexpr int kMaxDevices = 64;
  std::atomic<int> max_clusters[kMaxDevices];  // 0: not loaded yet
};
template <class Cfg>
KernelState<Cfg>& GetKernelState() {
  static KernelState<Cfg> state{};
  return state;
}

// Launch configuration of a GEMM kernel on `grid`: a cluster launch of kCM CTAs along M, but a
// 1x1 cluster launches as a plain grid, as CUTLASS's own adapter does (measured on H200,
// results/gemm_probe_h200_2026-11-21_6cd201e.log: the same ping-pong 128x128 kernel ran 9-15%
// slower with a cluster attribute of 1). `attr` must outlive the returned config.
template <class Kernel, int kCM>
cudaLaunchConfig_t GemmLaunchConfig(dim3 grid, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = Kernel::get_block_shape();
  cfg.dynamicSmemBytes = Kernel::SharedStorageSize;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = kCM;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = kCM > 1 ? 1 : 0;
  return cfg;
}

// Clusters of kCM CTAs that can be resident at once on the current device: the persistent
// grid's cap (for kCM == 1, CTAs). The kernel's shared-memory attribute must be set already.
template <class Kernel, int kCM>
cudaError_t MaxResidentClusters(int* clusters) {
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = GemmLaunchConfig<Kernel, kCM>(dim3(kCM, 1, 1), &attr);
  cfg.numAttrs = 1;  // the query counts clusters, so it always names their size
  return cudaOccupancyMaxActiveClusters(clusters, &cutlass::device_kernel<Kernel>, &cfg);
}

template <class Cfg>
cudaError_t LoadGemmImpl(int device, std::string* error) {
  using Kernel = typename Cfg::Kernel;
  auto& st = GetKernelState<Cfg>();
  if (device < 0 || device >= KernelState<Cfg>::kMaxDevices) {
    if (error) *error = "device ordinal out of range";
    return cudaErrorInvalidDevice;
  }
  if (st.max_clusters[device].load(std::memory_order_acquire) > 0) return cudaSuccess;
  auto* fn = &cutlass::device_kernel<Kernel>;
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, fn);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(Kernel::SharedStorageSize));
  }
  int clusters = 0;
  if (e == cudaSuccess) e = MaxResidentClusters<Kernel, Cfg::kClusterM>(&clusters);
  if (e != cudaSuccess) {
    if (error) *error = std::string("loading GEMM kernel failed: ") + cudaGetErrorString(e);
    return e;
  }
  if (clusters < 1) {
    if (error) *error = "GEMM kernel cannot be resident on this device";
    return cudaErrorInvalidConfiguration;
  }
  st.max_clusters[device].store(clusters, std::memory_order_release);
  return cudaSuccess;
}

// Ping-pong kernels defer each tile's signal to the warp group's next tile when K has at most
// this many k-tiles (SignalingTmaEpilogue, "When"): there a tile's mainloop is short, so waiting
// for its stores in its epilogue turn costs more than the signal's delay of one mainloop.
inline constexpr int kDeferSignalsMaxKTiles = 16;

template <class Cfg>
cudaError_t RunGemmImpl(const GemmRun& run, cudaStream_t stream, std::string* error) {
  using Kernel = typename Cfg::Kernel;
  using Element = typename Cfg::Element;
  using ElementOut = typename Cfg::ElementOut;
  constexpr int kTM = Cfg::kTileM, kTN = Cfg::kTileN, kCM = Cfg::kClusterM;
  // Tile-rows per raster chunk within a group: a wave's B columns stay hot in L2
  // (group_tile_scheduler.cuh).
  constexpr int kRasterSwizzle = 8;
  const SignalingGemmArgs& a = run.args;

  cudaError_t e = LoadGemmImpl<Cfg>(run.device, error);
  if (e != cudaSuccess) return e;
  const int max_clusters = GetKernelState<Cfg>().max_clusters[run.device].load();

  const int tiles_m = (a.m + kTM - 1) / kTM;
  const int tiles_n = (a.n + kTN - 1) / kTN;
  typename Cfg::Table table;
  table.num_groups = a.num_groups;
  table.tiles_n = tiles_n;
  table.batch = a.batch;
  table.swizzle = kRasterSwizzle;
  table.tiles_m = tiles_m;
  table.rotate = a.rotate_tile_rows;
  table.period = a.rotate_period_tile_rows > 0 ? a.rotate_period_tile_rows : tiles_m;
  table.k_tiles = (a.k + Cfg::kTileK - 1) / Cfg::kTileK;
  table.unit_start[0] = 0;
  for (int g = 0; g <= a.num_groups; ++g) {
    table.sgroup_begin[g] = (a.group_begin[g] + kCM - 1) / kCM;
  }
  // Visit positions: groups in table order, or for a consumer the bands in band_order, each
  // band's groups in ascending order (the launcher checked that no group spans two bands; an
  // empty group sits in the band of its first tile-row, or the last band).
  int order[kMaxGemmGroups];
  for (int g = 0; g < a.num_groups; ++g) order[g] = g;
  if constexpr (Cfg::kIsConsumer) {
    const int band_tiles = a.band_rows / kTM;
    const int num_bands = a.m / a.band_rows;
    int pos = 0;
    for (int s = 0; s < num_bands; ++s) {
      for (int g = 0; g < a.num_groups; ++g) {
        const int band = a.group_begin[g] / band_tiles;
        if ((band < num_bands ? band : num_bands - 1) == a.band_order[s]) order[pos++] = g;
      }
    }
    for (int p = 0; p < a.num_groups; ++p) table.group_order[p] = order[p];
  }
  for (int p = 0; p < a.num_groups; ++p) {
    const int g = order[p];
    const int srows = table.sgroup_begin[g + 1] - table.sgroup_begin[g];
    table.unit_start[p + 1] = table.unit_start[p] + a.batch * srows * tiles_n;
  }

  EpilogueParams epi;
  epi.d = a.d;
  epi.counters = a.counters;
  epi.m = a.m;
  epi.n = a.n;
  epi.batch = a.batch;
  epi.tiles_m = tiles_m;
  epi.rotate = a.rotate_tile_rows;
  epi.period = table.period;
  epi.num_groups = a.num_groups;
  for (int g = 0; g <= a.num_groups; ++g) epi.group_begin[g] = a.group_begin[g];
  epi.units = table.unit_start[a.num_groups];
  epi.defer_signals = table.k_tiles <= kDeferSignalsMaxKTiles;
  if constexpr (Cfg::kHasSource) {
    epi.addend_first = a.addend_first_tile_row;
    epi.addend_flag_value = a.addend_flag_value;
    epi.addend_flags = a.addend_flags;
    epi.addend_abandoned = a.addend_abandoned;
    epi.addend_nan = a.addend_nan;
    epi.tail_out = a.tail_out;
    epi.tail_first = a.tail_first_tile_row;
  }

  int budget = a.sm_budget > 0 && a.sm_budget < run.device_sms ? a.sm_budget : run.device_sms;
  int clusters = budget / kCM;
  if (clusters > max_clusters) clusters = max_clusters;
  if (clusters < 1) {
    if (error) *error = "sm_budget is smaller than one cluster of this config";
    return cudaErrorInvalidValue;
  }
  if constexpr (Cfg::kSplitK) {  // (LaunchSignalingGemm refuses k_splits > 1 elsewhere)
    // The full waves run whole; the last partial wave's cluster tiles (all of them with fewer
    // tiles than clusters) are split. No partial wave: nothing to split.
    const int tiles = table.unit_start[table.num_groups];
    const int tail = tiles % clusters;
    if (a.k_splits > 1 && tail > 0) {
      const long long slots = static_cast<long long>(tail) * kCM;
      if (a.split_flag_words < slots ||
          a.split_partial_floats < slots * (a.k_splits - 1) * kTM * kTN) {
        if (error) {
          *error = "split K: the flags and partials given are too small for the " +
                   std::to_string(slots) + " tiles of the last partial wave on this device (" +
                   std::to_string(clusters) + " resident clusters): the program was traced "
                   "for a GPU with fewer SMs (fo_jax sizes them by the tracing GPU's SM "
                   "count); trace it on this GPU, or pass OverlapConfig(k_splits=1)";
        }
        return cudaErrorInvalidValue;
      }
      table.splits = a.k_splits;
      table.dp_units = tiles - tail;
    }
  }

  typename Kernel::Arguments args{};
  args.mode = a.batch > 1 ? cutlass::gemm::GemmUniversalMode::kBatched
                          : cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = cute::make_shape(a.m, a.n, a.k, a.batch);
  args.mainloop.ptr_A = reinterpret_cast<Element const*>(a.a);
  const int64_t a_batch_rows = run.a_batch_rows > 0 ? run.a_batch_rows : a.m;
  args.mainloop.dA = cute::make_stride(int64_t(a.k), cute::Int<1>{}, a_batch_rows * a.k);
  args.mainloop.ptr_B = reinterpret_cast<Element const*>(a.b);
  if constexpr (Cfg::kFp8) {
    args.mainloop.dB = cute::make_stride(int64_t(a.k), cute::Int<1>{}, cute::Int<0>{});
  } else {
    args.mainloop.dB = cute::make_stride(cute::Int<1>{}, int64_t(a.n), cute::Int<0>{});
  }
  if constexpr (Cfg::kPromotes) {
    // In MMA instructions (CUTLASS's unit): a k-tile of tile_k takes tile_k / 32 fp8 wgmmas.
    args.mainloop.mma_promotion_interval =
        uint32_t(Cfg::kPromotionKTilesValue * (Cfg::kTileK / 32));
  }
  if constexpr (Cfg::kIsConsumer) {
    args.mainloop.band_flags = a.wait_flags;
    args.mainloop.flag_value = a.wait_flag_value;
    args.mainloop.band_tiles = a.band_rows / kTM;
  }
  args.epilogue.inner.ptr_C = nullptr;
  if constexpr (Cfg::kHasSource) {
    args.epilogue.inner.ptr_C = reinterpret_cast<Element const*>(a.addend);
    args.epilogue.inner.thread.alpha = 1.0f;
    args.epilogue.inner.thread.beta = 1.0f;
  }
  if constexpr (Cfg::kFp8) {
    // ScaledAccumulator's arguments: {scalar broadcast, accumulator fetch, multiply}; a null
    // pointer reads the scalar beside it instead.
    args.epilogue.inner.thread = {{{1.0f, 1.0f}, {a.a_scale, a.b_scale}, {}}, {}, {}};
  }
  args.epilogue.inner.ptr_D = reinterpret_cast<ElementOut*>(a.d);
  // D's batch stride, read when D is [batch, m, n] (SignalingTmaEpilogue::StoreShape).
  args.epilogue.inner.dD = cute::make_stride(int64_t(a.n), cute::Int<1>{}, int64_t(a.m) * a.n);
  args.epilogue.inner.dC = args.epilogue.inner.dD;
  args.epilogue.signal = epi;
  args.hw_info.device_id = run.device;
  args.hw_info.sm_count = clusters * kCM;
  args.scheduler.table = &table;
  args.scheduler.partials = a.split_partials;
  args.scheduler.split_flags = a.split_flags;

  if (!Kernel::can_implement(args)) {
    if (error) *error = "CUTLASS cannot implement this problem (alignment?)";
    return cudaErrorInvalidValue;
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);

  cudaLaunchAttribute attr_cluster;
  cudaLaunchConfig_t cfg = GemmLaunchConfig<Kernel, kCM>(Kernel::get_grid_shape(params),
                                                         &attr_cluster);
  cfg.stream = stream;
  e = ZeroGemmCounters(a, stream, error);
  if (e != cudaSuccess) return e;
  e = cudaLaunchKernelEx(&cfg, &cutlass::device_kernel<Kernel>, params);
  if (e != cudaSuccess && error) {
    *error = std::string("GEMM launch failed: ") + cudaGetErrorString(e);
  }
  return e;
}

}  // namespace fo_jax::detail
