// fo_jax_overlapped_matmul_v2 and fo_jax_overlapped_matmul_fp8_v1: decode the plan (one struct
// attribute), the operands and this device's place in the mesh (an all-gather's x is this rank's
// [M/P, K] and its second result the gathered [M, K]), run an OverlapCall (comm/overlap_call.h:
// prepare, then enqueue on XLA's stream) and map its status. The fp8 target takes x[M, K] and
// w[N, K] (K-major, as the fp8 kernel reads it) float8_e4m3fn and their two float32 scales; its
// results are bf16 and its collective runs on them (OverlapShape::out_dtype). The call names its
// group's NCCL unique id by a token (comm/group_ids.h), so its HLO is the same in every run.
#include "ffi/overlap_ffi.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "comm/call_timeline.h"
#include "comm/group_ids.h"
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
constexpr char kFp8Target[] = "fo_jax_overlapped_matmul_fp8_v1";

// fp8 scales: the two f32 device scalars; nullptr for bf16/f16 calls.
struct Scales {
  const float* x = nullptr;
  const float* w = nullptr;
};

Status Overlap(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer w,
               const Scales* scales, ffi::Result<ffi::AnyBuffer> out,
               ffi::Result<ffi::AnyBuffer> workspace,
               ffi::Result<ffi::Buffer<ffi::U32>> counters, const OverlapPlanAttr& plan_attr,
               const MeshAttr& mesh, ffi::Span<const uint8_t> group_tokens) {
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
  const bool fp8 = scales != nullptr;
  auto xd = x.dimensions(), wd = w.dimensions();
  if (fp8) {
    if (shape.dtype != GemmDtype::kE4M3 || w.element_type() != x.element_type() ||
        out->element_type() != ffi::DataType::BF16) {
      return Status::InvalidArgument("x and w must be float8_e4m3fn and the output bf16");
    }
    if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1]) {
      return Status::InvalidArgument("operands must be x[M,K] and w[N,K] (K-major)");
    }
    shape.n = wd[0];
  } else {
    if (shape.dtype == GemmDtype::kE4M3) {
      return Status::InvalidArgument("fp8 operands go through " + std::string(kFp8Target));
    }
    if (w.element_type() != x.element_type() || out->element_type() != x.element_type()) {
      return Status::InvalidArgument("x, w and the output must all be bf16 or all f16");
    }
    if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0]) {
      return Status::InvalidArgument("operands must be x[M,K] @ w[K,N]");
    }
    shape.n = wd[1];
  }
  shape.m = xd[0];
  shape.k = xd[1];
  OverlapPlan plan;
  FO_JAX_RETURN_IF_ERROR(DecodeOverlapPlan(plan_attr, &plan));
  if (plan.collective == Collective::kAllGather) {
    // The GEMM's rows are the gathered x's; the second result is the gathered x itself.
    shape.m *= plan.axis_size;
    if (workspace->element_type() != x.element_type()) {
      return Status::InvalidArgument("the gathered x must have x's dtype");
    }
  } else if (workspace->element_type() != out->element_type()) {
    return Status::InvalidArgument("the workspace must have the output's dtype");
  }

  MeshPlace me;
  FO_JAX_RETURN_IF_ERROR(FindInMesh(mesh, device, &me));
  static_assert(kGroupUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
  if (me.group < 0 ||
      group_tokens.size() < static_cast<size_t>(me.group + 1) * kGroupTokenBytes) {
    return Status::InvalidArgument("bad group/token table");
  }
  OverlapPlace place;
  place.device = device;
  place.rank = me.rank;
  if (!FindGroupUniqueId(group_tokens.begin() + me.group * kGroupTokenBytes,
                         place.id.internal)) {
    return Status::InvalidArgument(
        "no NCCL unique id is registered in this process for the call's tensor-parallel group: "
        "an overlapped call runs only in a process that lowered it (jax.jit lowers it before "
        "each compilation, also when the persistent compilation cache then hits; an exported "
        "or deserialized executable was not lowered here)");
  }

  OverlapBuffers buffers;
  buffers.x = x.untyped_data();
  buffers.w = w.untyped_data();
  if (fp8) {
    buffers.x_scale = scales->x;
    buffers.w_scale = scales->w;
  }
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
                       MeshAttr mesh, ffi::Span<const uint8_t> group_tokens) {
  return ToFfiError(
      Overlap(stream, device, x, w, nullptr, out, workspace, counters, plan, mesh, group_tokens),
      kTarget);
}

ffi::Error OverlapFp8Impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                          ffi::AnyBuffer w, ffi::Buffer<ffi::F32> x_scale,
                          ffi::Buffer<ffi::F32> w_scale, ffi::Result<ffi::AnyBuffer> out,
                          ffi::Result<ffi::AnyBuffer> workspace,
                          ffi::Result<ffi::Buffer<ffi::U32>> counters, OverlapPlanAttr plan,
                          MeshAttr mesh, ffi::Span<const uint8_t> group_tokens) {
  if (x_scale.element_count() != 1 || w_scale.element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(kFp8Target) +
                                       ": the scales must be f32 scalars");
  }
  const Scales scales{x_scale.typed_data(), w_scale.typed_data()};
  return ToFfiError(
      Overlap(stream, device, x, w, &scales, out, workspace, counters, plan, mesh, group_tokens),
      kFp8Target);
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
        .Ret<ffi::Buffer<ffi::U32>>()                    // [G]: the all-gather's flags (else unused)
        .Attr<fo_jax::OverlapPlanAttr>("plan")           // _plan.OverlapPlan
        .Attr<fo_jax::MeshAttr>("mesh")                  // the mesh table
        .Attr<ffi::Span<const uint8_t>>("group_tokens"));  // 32 bytes per group

// The fp8 form: the same call with the two scales after the operands (no command buffers either).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    FoJaxOverlappedMatmulFp8Ffi, fo_jax::OverlapFp8Impl,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>()        // XLA's stream
        .Ctx<ffi::DeviceOrdinal>()                       // local device ordinal
        .Arg<ffi::AnyBuffer>()                           // x [M, K] e4m3
        .Arg<ffi::AnyBuffer>()                           // w [N, K] e4m3 (K-major)
        .Arg<ffi::Buffer<ffi::F32>>()                    // x_scale []
        .Arg<ffi::Buffer<ffi::F32>>()                    // w_scale []
        .Ret<ffi::AnyBuffer>()                           // out [M/P or M, N] bf16
        .Ret<ffi::AnyBuffer>()                           // workspace [M, N] bf16 (reduce-scatter)
        .Ret<ffi::Buffer<ffi::U32>>()                    // [G]: as above
        .Attr<fo_jax::OverlapPlanAttr>("plan")           // _plan.OverlapPlan
        .Attr<fo_jax::MeshAttr>("mesh")                  // the mesh table
        .Attr<ffi::Span<const uint8_t>>("group_tokens"));  // 32 bytes per group
