// fo_jax_overlapped_matmul_ffi: one call = zero counters, signaling GEMM on XLA's stream,
// counter-gated NCCL per group on the comm stream, join; or, with the copy-engine transport,
// the GEMM in destination-band order and counter-gated copies into the peers' memory plus a band
// sum, whose last pass, for an all-reduce, also stores the summed band into every peer's output
// (comm/peer_transport.h). The mesh table attributes say which rank of which tensor-parallel
// group this device is; the communicator is created on first use.
#include "ffi/overlap_ffi.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>

#include "comm/call_timeline.h"
#include "comm/comm_registry.h"
#include "comm/gated_collectives.h"
#include "comm/peer_transport.h"
#include "ffi/ffi_status.h"
#include "ffi/gemm_plan.h"
#include "kernels/signaling_gemm.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace fo_jax {
namespace {

struct MeshEntry {
  int rank = -1;
  int group = -1;
};

// This device's rank and group from the mesh table (one row per mesh device); "" or a message.
std::string FindSelf(int32_t process, int32_t device, ffi::Span<const int32_t> procs,
                     ffi::Span<const int32_t> locals, ffi::Span<const int32_t> ranks,
                     ffi::Span<const int32_t> groups, MeshEntry* self) {
  if (procs.size() != locals.size() || procs.size() != ranks.size() ||
      procs.size() != groups.size()) {
    return "mesh table columns differ in length";
  }
  for (size_t i = 0; i < procs.size(); ++i) {
    if (procs[i] == process && locals[i] == device) {
      *self = MeshEntry{ranks[i], groups[i]};
      return "";
    }
  }
  return "this device (process " + std::to_string(process) + ", ordinal " +
         std::to_string(device) + ") is not in the mesh the call was lowered for";
}

ffi::Error OverlapImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                       ffi::Result<ffi::Buffer<ffi::U32>> counters, int32_t collective,
                       int32_t config, ffi::Span<const int32_t> group_begin, int32_t sm_budget,
                       int32_t nccl_max_ctas, bool spin_wait, int32_t transport,
                       int32_t rounds, int32_t sum_split, int32_t copy_options,
                       int32_t ring, int32_t nranks, int32_t process,
                       ffi::Span<const int32_t> mesh_process, ffi::Span<const int32_t> mesh_local,
                       ffi::Span<const int32_t> mesh_rank, ffi::Span<const int32_t> mesh_group,
                       ffi::Span<const uint8_t> unique_ids) {
  const int64_t host_enter_ns = TimelineNowNs();
  const auto dt = x.element_type();
  if ((dt != ffi::DataType::BF16 && dt != ffi::DataType::F16) || w.element_type() != dt ||
      out->element_type() != dt) {
    return ffi::Error::InvalidArgument("fo_jax_overlapped_matmul_ffi: bf16 or f16 operands");
  }
  if (collective != 0 && collective != 1) return ffi::Error::InvalidArgument("collective");
  const Collective kind = collective == 0 ? Collective::kReduceScatter : Collective::kAllReduce;
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0] || nranks < 1) {
    return ffi::Error::InvalidArgument("fo_jax_overlapped_matmul_ffi: x[M,K] @ w[K,N]");
  }
  const int64_t M = xd[0], K = xd[1], N = wd[1];
  const bool rs = kind == Collective::kReduceScatter;
  if (rs && M % nranks) return ffi::Error::InvalidArgument("M not divisible by the axis size");
  const int64_t out_rows = rs ? M / nranks : M;
  if (out->element_count() != static_cast<size_t>(out_rows * N) ||
      (rs && workspace->element_count() != static_cast<size_t>(M * N))) {
    return ffi::Error::InvalidArgument("fo_jax_overlapped_matmul_ffi: result sizes");
  }

  MeshEntry me;
  std::string msg = FindSelf(process, device, mesh_process, mesh_local, mesh_rank, mesh_group, &me);
  if (!msg.empty()) return ffi::Error::InvalidArgument("fo_jax: " + msg);
  if (me.rank < 0 || me.rank >= nranks || me.group < 0 ||
      unique_ids.size() < static_cast<size_t>(me.group + 1) * NCCL_UNIQUE_ID_BYTES) {
    return ffi::Error::InvalidArgument("fo_jax: bad rank/group/unique id table");
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_ids.begin() + me.group * NCCL_UNIQUE_ID_BYTES,
              NCCL_UNIQUE_ID_BYTES);

  msg = LoadGemmKernelsOnce(device);
  if (!msg.empty()) return ffi::Error::Internal("fo_jax: " + msg);
  CommOptions options;
  options.max_ctas = nccl_max_ctas;
  CommState* state = GetOrCreateCommState(device, id, nranks, me.rank, options, &msg);
  if (state == nullptr) return ffi::Error::Internal("fo_jax: " + msg);
  if (transport != 0 && transport != 1) return ffi::Error::InvalidArgument("transport");
  const bool copy_engine = transport == 1;

  // A failed group (comm/comm_registry.h): the call still runs, so that no other rank waits for
  // this one, and then reports the failure; unless this rank's communicator cannot run the NCCL
  // transport's collectives, in which case the group's local communicators are aborted.
  std::unique_lock<std::timed_mutex> lock(state->mu);
  const std::string failure = CommGroupFailure(*state);
  if (state->aborted) {
    return ffi::Error::Internal("fo_jax: " + failure + "; this process's communicators of the "
                                "group were aborted after it: restart the process");
  }
  if (!failure.empty() && !copy_engine && !CommUsable(*state)) {
    lock.unlock();
    AbortCommGroup(*state);
    return ffi::Error::Internal("fo_jax: " + failure + "; aborted this process's communicators "
                                "of the group (their pending collectives end): restart the process");
  }
  auto finish = [&failure]() {
    if (failure.empty()) return ffi::Error::Success();
    return ffi::Error::Internal("fo_jax: " + failure + " (the call ran so that the group's other "
                                "ranks do not wait for this one; the group stays failed: restart "
                                "the process)");
  };
  if (copy_engine && M % nranks) {
    return ffi::Error::InvalidArgument("fo_jax: copy-engine transport: M not divisible by P");
  }

  SignalingGemmArgs args;
  args.dtype = dt == ffi::DataType::BF16 ? GemmDtype::kBF16 : GemmDtype::kF16;
  // NCCL reduce-scatter: batch = P bands written group-major (DESIGN.md). Copy engine: one
  // batch over all M rows in natural order, visited by destination band (rotation below).
  args.batch = rs && !copy_engine ? nranks : 1;
  args.m = static_cast<int>(M / args.batch);
  args.n = static_cast<int>(N);
  args.k = static_cast<int>(K);
  args.a = x.untyped_data();
  args.b = w.untyped_data();
  args.d = rs ? workspace->untyped_data() : out->untyped_data();
  args.sm_budget = ResolveSmBudget(sm_budget);
  args.config = config;
  msg = SetGroups(args, group_begin.begin(), group_begin.size());
  if (!msg.empty()) return ffi::Error::InvalidArgument("fo_jax_overlapped_matmul_ffi: " + msg);
  if (counters->element_count() != static_cast<size_t>(args.num_groups)) {
    return ffi::Error::InvalidArgument("fo_jax: counters must have one entry per group");
  }
  args.counters = counters->typed_data();
  PeerCollectiveArgs peer;
  if (copy_engine) {
    // The output is rounds x P chunks in visit order (round h visits the chunks of its P bands
    // rotated, logical chunk j being the physical chunk (rank + 1 + j) % P, so each round's own
    // chunk comes last); the groups refine the chunks (a chunk may be several groups).
    const int cfg = config >= 0 ? config
                                : SelectGemmConfig(args.dtype, args.m, args.n, args.k, 1,
                                                   args.sm_budget);
    const GemmTileConfig& c = GetGemmConfig(cfg);
    const int64_t band_rows = M / nranks;
    const int H = rounds;
    const int64_t unit = int64_t(c.tile_m) * c.cluster_m;
    bool ok = nranks <= kMaxPeerRanks && H >= 1 && (H == 1 || !rs) && band_rows > 0 &&
              band_rows % (H * unit) == 0;
    const int tiles_chunk = ok ? static_cast<int>(band_rows / H / c.tile_m) : 0;
    for (int g = 0; ok && g <= args.num_groups; ++g) ok = args.group_begin[g] % c.cluster_m == 0;
    if (!ok) {
      return ffi::Error::InvalidArgument(
          "fo_jax: the copy-engine transport needs groups of whole clusters, M / P a multiple "
          "of rounds * tile_m * cluster_m of config " + std::string(c.name) +
          ", and rounds > 1 only for an all-reduce");
    }
    args.config = cfg;
    args.rotate_tile_rows = ((me.rank + 1) % nranks) * tiles_chunk;
    args.rotate_period_tile_rows = H > 1 ? nranks * tiles_chunk : 0;
    peer.dtype = args.dtype;
    peer.all_reduce = !rs;
    peer.workspace = args.d;  // reduce-scatter: the workspace; all-reduce: the output itself
    peer.out = out->untyped_data();
    peer.band_elems = static_cast<size_t>(band_rows * N);
    peer.counters = args.counters;
    for (int g = 0; g < args.num_groups; ++g) {
      peer.expected[g] = static_cast<uint32_t>(ExpectedGroupCount(args, g));
    }
    peer.rounds = H;
    msg = SetPeerGroups(peer, nranks, args.group_begin, args.num_groups, tiles_chunk,
                        static_cast<size_t>(c.tile_m) * static_cast<size_t>(N));
    if (!msg.empty()) return ffi::Error::InvalidArgument("fo_jax: copy-engine transport: " + msg);
    if (sum_split < 0 || sum_split > 2 || copy_options < 0 || copy_options > 3 ||
        (ring != 0 && ring != 1)) {
      return ffi::Error::InvalidArgument(
          "fo_jax: copy-engine transport: bad sum_split / copy_options / ring");
    }
    peer.sum_split = static_cast<PeerCollectiveArgs::SumSplit>(sum_split);
    peer.flag_stream = (copy_options & 1) != 0;
    peer.acks_first = (copy_options & 2) != 0;
    peer.ring = ring == 1;
    const size_t band_bytes = peer.band_elems * 2;
    msg = PreparePeerTransport(*state, (nranks - 1) * band_bytes);
    if (!msg.empty()) return ffi::Error::Internal("fo_jax: " + msg);
    // The ring's partial sums, added by the GEMM's epilogue (their address is known only now:
    // the receive buffer may just have grown), and its own band, stored into the output.
    msg = SetGemmRing(*state, peer, tiles_chunk, args);
    if (!msg.empty()) return ffi::Error::InvalidArgument("fo_jax: copy-engine transport: " + msg);
    // Every copy graph the call needs, before its GEMM is launched (peer_transport.h says why).
    msg = EnsurePeerCopyGraphs(*state, peer);
    if (!msg.empty()) return ffi::Error::Internal("fo_jax: copy-engine transport: " + msg);
  }

  // Stream order on XLA's stream: zero counters -> inputs_ready -> GEMM, the first two issued by
  // the launcher right before the kernel, after its host-side setup (measured: zeroing first
  // left the GPU idle ~20 us while the host built the GEMM's parameters). The gated waits are
  // enqueued after the GEMM launch (never before the producer: DESIGN.md).
  args.zero_counters_on_launch = true;
  args.after_zero_event = copy_engine ? NextPeerInputsEvent(*state) : state->inputs_ready;
  if (copy_engine && BeginTimelineCall(*state, host_enter_ns)) {
    RecordTimelineHost(*state, kHostPrepared);
    RecordTimelineMark(*state, kXlaStart, stream);
  }
  cudaError_t err = LaunchSignalingGemm(stream, args, &msg);
  if (err != cudaSuccess) return ffi::Error::Internal("fo_jax: GEMM launch: " + msg);
  if (copy_engine) {
    RecordTimelineHost(*state, kHostGemmLaunched);
    err = EnqueuePeerCollective(*state, stream, peer, &msg);
    EndTimelineCall(*state);
    if (err != cudaSuccess) return ffi::Error::Internal("fo_jax: copy-engine transport: " + msg);
    const std::string copy_failure = PeerCopyFailure(*state);
    if (!copy_failure.empty()) {
      return ffi::Error::Internal("fo_jax: " + copy_failure + " (this call ran so that the "
                                  "group's other ranks do not wait for this one; its result and "
                                  "every later call's are undefined: restart the process)");
    }
    return finish();
  }
  const ncclDataType_t nccl_dt = dt == ffi::DataType::BF16 ? ncclBfloat16 : ncclFloat16;
  err = EnqueueGatedCollectives(*state, stream, kind, nccl_dt, args.d, out->untyped_data(), 2,
                                args.counters, CollectiveSpans(args, kind), spin_wait, &msg);
  if (err != cudaSuccess) return ffi::Error::Internal("fo_jax: " + msg);
  err = NoteNcclCall(*state, stream);
  if (err != cudaSuccess) return ffi::Error::Internal("fo_jax: recording the call's progress event");
  return finish();
}

}  // namespace
}  // namespace fo_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    FoJaxOverlappedMatmulFfi, fo_jax::OverlapImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>()        // XLA's stream
        .Ctx<ffi::DeviceOrdinal>()                       // local device ordinal
        .Arg<ffi::AnyBuffer>()                           // x [M, K]
        .Arg<ffi::AnyBuffer>()                           // w [K, N]
        .Ret<ffi::AnyBuffer>()                           // out [M/P or M, N]
        .Ret<ffi::AnyBuffer>()                           // workspace [M, N] (reduce-scatter)
        .Ret<ffi::Buffer<ffi::U32>>()                    // counters [G]
        .Attr<int32_t>("collective")                     // 0 reduce-scatter, 1 all-reduce
        .Attr<int32_t>("config")                         // GEMM config index
        .Attr<ffi::Span<const int32_t>>("group_begin")   // tile-row group boundaries
        .Attr<int32_t>("sm_budget")                      // GEMM SMs (0: all)
        .Attr<int32_t>("nccl_max_ctas")                  // NCCL CTA bound (0: default)
        .Attr<bool>("spin_wait")                         // NCCL transport: spin kernel gates
        .Attr<int32_t>("transport")                      // 0 NCCL, 1 copy engine
        .Attr<int32_t>("rounds")                         // copy-engine all-reduce rounds
        .Attr<int32_t>("sum_split")                      // copy engine: 0 one pass, 1 bands,
                                                         //   2 rows (PeerCollectiveArgs)
        .Attr<int32_t>("copy_options")                   // copy engine: 1 flag stream,
                                                         //   2 acks first
        .Attr<int32_t>("ring")                           // copy engine: 1 ring reduce-scatter
        .Attr<int32_t>("nranks")                         // axis size
        .Attr<int32_t>("process")                        // this process's index
        .Attr<ffi::Span<const int32_t>>("mesh_process")  // per mesh device: process index
        .Attr<ffi::Span<const int32_t>>("mesh_local")    //   local hardware id (ordinal)
        .Attr<ffi::Span<const int32_t>>("mesh_rank")     //   rank along the axis
        .Attr<ffi::Span<const int32_t>>("mesh_group")    //   tensor-parallel group index
        .Attr<ffi::Span<const uint8_t>>("unique_ids"));  // 128 bytes per group
