// fo_jax_overlapped_matmul_v2: decode the plan (one struct attribute), the operands and this
// device's place in the mesh (an all-gather's x is this rank's [M/P, K] and its second result the
// gathered [M, K]), run an OverlapCall (comm/overlap_call.h: prepare, then enqueue on
// XLA's stream) and map its status.
#include "ffi/overlap_ffi.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "comm/call_timeline.h"
#include "comm/overlap_call.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "ffi/ffi_status.h"
#include "ffi/plan_attrs.h"
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
  // A call cannot be captured into a CUDA graph: each one advances host-side state that its GPU
  // work matches (the communicator's epoch, the copy worker's event ring, receive buffers grown
  // and exchanged with the peers), so a replayed capture would wait for flags of an epoch that
  // no peer writes again and hang. XLA does not put the handler in its command buffers (it
  // declares no ffi::Traits::kCmdBufferCompatible); this rejects a capture that the user or a
  // framework starts around XLA's stream. The plain GEMM (fo_jax.matmul, gemm_ffi.cc) keeps no
  // such state and stays capturable.
  FO_JAX_RETURN_IF_ERROR(RejectStreamCapture(stream, "fo_jax.overlapped_matmul"));
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
  if (plan.collective == Collective::kAllGather) {
    // The GEMM's rows are the gathered x's; the second result is the gathered x itself.
    shape.m *= plan.axis_size;
    if (workspace->element_type() != x.element_type()) {
      return Status::InvalidArgument("the gathered x must have x's dtype");
    }
  }

  MeshPlace me;
  FO_JAX_RETURN_IF_ERROR(FindInMesh(mesh, device, &me));
  if (me.group < 0 ||
      unique_ids.size() < static_cast<size_t>(me.group + 1) * NCCL_UNIQUE_ID_BYTES) {
    return Status::InvalidArgument("bad group/unique id table");
  }
  OverlapPlace place;
  place.device = device;
  place.rank = me.rank;
  std::memcpy(place.id.internal, unique_ids.begin() + me.group * NCCL_UNIQUE_ID_BYTES,
              NCCL_UNIQUE_ID_BYTES);

  OverlapBuffers buffers;
  buffers.x = x.untyped_data();
  buffers.w = w.untyped_data();
  buffers.out = out->untyped_data();
  buffers.out_elems = out->element_count();
  buffers.workspace = workspace->untyped_data();
  buffers.workspace_elems = workspace->element_count();
  buffers.counters = counters->typed_data();
  buffers.counters_elems = counters->element_count();

  OverlapCall call(plan, shape, buffers, place, host_enter_ns);
  FO_JAX_RETURN_IF_ERROR(call.Prepare());
  return call.Enqueue(stream);
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

// No ffi::Traits::kCmdBufferCompatible: XLA must run every call live (see Overlap).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    FoJaxOverlappedMatmulFfi, fo_jax::OverlapImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>()        // XLA's stream
        .Ctx<ffi::DeviceOrdinal>()                       // local device ordinal
        .Arg<ffi::AnyBuffer>()                           // x [M, K]
        .Arg<ffi::AnyBuffer>()                           // w [K, N]
        .Ret<ffi::AnyBuffer>()                           // out [M/P or M, N]
        .Ret<ffi::AnyBuffer>()                           // workspace [M, N] (reduce-scatter)
                                                         // or the gathered x [M, K] (all-gather)
        .Ret<ffi::Buffer<ffi::U32>>()                    // counters [G] (all-gather: flags)
        .Attr<fo_jax::OverlapPlanAttr>("plan")           // _plan.OverlapPlan
        .Attr<fo_jax::MeshAttr>("mesh")                  // the mesh table
        .Attr<ffi::Span<const uint8_t>>("unique_ids"));  // 128 bytes per group
