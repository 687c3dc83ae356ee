// fo_jax_overlapped_matmul_v2: one call = zero counters, signaling GEMM on XLA's stream,
// counter-gated NCCL per group on the comm stream, join; or, with the copy-engine transport,
// the GEMM in destination-band order and counter-gated copies into the peers' memory plus a band
// sum, whose last pass, for an all-reduce, also stores the summed band into every peer's output
// (comm/peer_transport.h). The plan (one struct attribute, validated once) says everything the
// call does; the mesh table says which rank of which tensor-parallel group this device is; the
// communicator is created on first use.
#include "ffi/overlap_ffi.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>

#include "comm/call_timeline.h"
#include "comm/comm_registry.h"
#include "comm/gated_collectives.h"
#include "comm/gemm_plan.h"
#include "comm/overlap_plan.h"
#include "comm/peer_transport.h"
#include "comm/status.h"
#include "ffi/ffi_status.h"
#include "ffi/plan_attrs.h"
#include "kernels/signaling_gemm.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace fo_jax {
namespace {

constexpr char kTarget[] = "fo_jax_overlapped_matmul_v2";

Status Overlap(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer w,
               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
               ffi::Result<ffi::Buffer<ffi::U32>> counters, const OverlapPlanAttr& plan_attr,
               const MeshAttr& mesh, ffi::Span<const uint8_t> unique_ids) {
  const int64_t host_enter_ns = TimelineNowNs();
  OverlapShape shape;
  FO_JAX_RETURN_IF_ERROR(GemmDtypeOf(x.element_type(), &shape.dtype));
  if (w.element_type() != x.element_type() || out->element_type() != x.element_type()) {
    return Status::InvalidArgument("x, w and the output must all be bf16 or all f16");
  }
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0]) {
    return Status::InvalidArgument("operands must be x[M,K] @ w[K,N]");
  }
  shape.m = xd[0];
  shape.k = xd[1];
  shape.n = wd[1];
  OverlapPlan plan;
  FO_JAX_RETURN_IF_ERROR(DecodeOverlapPlan(plan_attr, &plan));
  FO_JAX_RETURN_IF_ERROR(ValidateOverlapPlan(plan, shape));
  const bool rs = plan.collective == Collective::kReduceScatter;
  const bool copy_engine = plan.transport == Transport::kCopyEngine;
  const int nranks = plan.axis_size;
  if (out->element_count() != static_cast<size_t>(OutputRows(plan, shape) * shape.n) ||
      (rs && workspace->element_count() != static_cast<size_t>(shape.m * shape.n)) ||
      counters->element_count() != static_cast<size_t>(plan.gemm.num_groups)) {
    return Status::InvalidArgument("result sizes do not match the plan");
  }

  MeshPlace me;
  FO_JAX_RETURN_IF_ERROR(FindInMesh(mesh, device, &me));
  if (me.rank < 0 || me.rank >= nranks || me.group < 0 ||
      unique_ids.size() < static_cast<size_t>(me.group + 1) * NCCL_UNIQUE_ID_BYTES) {
    return Status::InvalidArgument("bad rank/group/unique id table");
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_ids.begin() + me.group * NCCL_UNIQUE_ID_BYTES,
              NCCL_UNIQUE_ID_BYTES);

  FO_JAX_RETURN_IF_ERROR(LoadGemmKernelsOnce(device));
  CommOptions options;
  options.max_ctas = plan.nccl_max_ctas;
  std::string msg;
  CommState* state = GetOrCreateCommState(device, id, nranks, me.rank, options, &msg);
  if (state == nullptr) return Status::Internal(msg);

  // A failed group (comm/comm_registry.h): the call still runs, so that no other rank waits for
  // this one, and then reports the failure; unless this rank's communicator cannot run the NCCL
  // transport's collectives, in which case the group's local communicators are aborted.
  std::unique_lock<std::timed_mutex> lock(state->mu);
  const std::string failure = CommGroupFailure(*state);
  if (state->aborted) {
    return Status::Internal(failure + "; this process's communicators of the group were "
                            "aborted after it: restart the process");
  }
  if (!failure.empty() && !copy_engine && !CommUsable(*state)) {
    lock.unlock();
    AbortCommGroup(*state);
    return Status::Internal(failure + "; aborted this process's communicators of the group "
                            "(their pending collectives end): restart the process");
  }
  auto finish = [&failure]() {
    if (failure.empty()) return Status::Ok();
    return Status::Internal(failure + " (the call ran so that the group's other ranks do not "
                            "wait for this one; the group stays failed: restart the process)");
  };

  // NCCL reduce-scatter: batch = P bands written group-major (docs/design.md, "Layouts"). Copy
  // engine: one batch over all M rows in natural order, visited by destination band.
  SignalingGemmArgs args = OverlapGemmArgs(plan, shape, me.rank);
  args.a = x.untyped_data();
  args.b = w.untyped_data();
  args.d = rs ? workspace->untyped_data() : out->untyped_data();
  args.sm_budget = ResolveSmBudget(plan.gemm.sm_budget);
  args.counters = counters->typed_data();
  PeerCollectiveArgs peer;
  if (copy_engine) {
    // The output is rounds x P chunks in visit order (round h visits the chunks of its P bands
    // rotated, so each round's own chunk comes last: OverlapGemmArgs); the groups refine the
    // chunks (a chunk may be several groups).
    const GemmTileConfig& c = GetGemmConfig(plan.gemm.config);
    peer.dtype = args.dtype;
    peer.all_reduce = !rs;
    peer.workspace = args.d;  // reduce-scatter: the workspace; all-reduce: the output itself
    peer.out = out->untyped_data();
    peer.band_elems = static_cast<size_t>(shape.m / nranks * shape.n);
    peer.counters = args.counters;
    for (int g = 0; g < args.num_groups; ++g) {
      peer.expected[g] = static_cast<uint32_t>(ExpectedGroupCount(args, g));
    }
    SetPeerGroups(peer, plan, static_cast<size_t>(c.tile_m) * static_cast<size_t>(shape.n));
    const size_t band_bytes = peer.band_elems * 2;
    msg = PreparePeerTransport(*state, (nranks - 1) * band_bytes);
    if (!msg.empty()) return Status::Internal(msg);
    // The ring's partial sums, added by the GEMM's epilogue (their address is known only now:
    // the receive buffer may just have grown), and its own band, stored into the output.
    SetGemmRing(*state, peer, plan.tiles_chunk, args);
    // Every copy graph the call needs, before its GEMM is launched (peer_transport.h says why).
    msg = EnsurePeerCopyGraphs(*state, peer);
    if (!msg.empty()) return Status::Internal("copy-engine transport: " + msg);
  }

  // Stream order on XLA's stream: zero counters -> inputs_ready -> GEMM, the first two issued by
  // the launcher right before the kernel, after its host-side setup (measured: zeroing first
  // left the GPU idle ~20 us while the host built the GEMM's parameters). The gated waits are
  // enqueued after the GEMM launch (never before the producer: docs/design.md).
  args.zero_counters_on_launch = true;
  args.after_zero_event = copy_engine ? NextPeerInputsEvent(*state) : state->inputs_ready;
  if (copy_engine && BeginTimelineCall(*state, host_enter_ns)) {
    RecordTimelineHost(*state, kHostPrepared);
    RecordTimelineMark(*state, kXlaStart, stream);
  }
  cudaError_t err = LaunchSignalingGemm(stream, args, &msg);
  if (err != cudaSuccess) return LaunchStatus(err, "GEMM launch", msg);
  if (copy_engine) {
    RecordTimelineHost(*state, kHostGemmLaunched);
    err = EnqueuePeerCollective(*state, stream, peer, &msg);
    EndTimelineCall(*state);
    if (err != cudaSuccess) return Status::Internal("copy-engine transport: " + msg);
    const std::string copy_failure = PeerCopyFailure(*state);
    if (!copy_failure.empty()) {
      return Status::Internal(copy_failure + " (this call ran so that the group's other ranks "
                              "do not wait for this one; its result and every later call's are "
                              "undefined: restart the process)");
    }
    return finish();
  }
  const ncclDataType_t nccl_dt = shape.dtype == GemmDtype::kBF16 ? ncclBfloat16 : ncclFloat16;
  err = EnqueueGatedCollectives(*state, stream, plan.collective, nccl_dt, args.d,
                                out->untyped_data(), 2, args.counters,
                                CollectiveSpans(args, plan.collective), &msg);
  if (err != cudaSuccess) return Status::Internal(msg);
  err = NoteNcclCall(*state, stream);
  if (err != cudaSuccess) return CudaStatus(err, "recording the call's progress event");
  return finish();
}

ffi::Error OverlapImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                       ffi::Result<ffi::Buffer<ffi::U32>> counters, OverlapPlanAttr plan,
                       MeshAttr mesh, ffi::Span<const uint8_t> unique_ids) {
  return ToFfiError(
      Overlap(stream, device, x, w, out, workspace, counters, plan, mesh, unique_ids), kTarget);
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
        .Attr<fo_jax::OverlapPlanAttr>("plan")           // _plan.OverlapPlan
        .Attr<fo_jax::MeshAttr>("mesh")                  // the mesh table
        .Attr<ffi::Span<const uint8_t>>("unique_ids"));  // 128 bytes per group
