// fo_jax_gemm_v2: decode the plan, check it against the buffers, launch the GEMM on XLA's
// stream, map the status.
#include "ffi/gemm_ffi.h"

#include <cuda_runtime.h>

#include <string>

#include "comm/gemm_plan.h"
#include "comm/status.h"
#include "ffi/ffi_status.h"
#include "ffi/plan_attrs.h"
#include "kernels/signaling_gemm.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace fo_jax {
namespace {

constexpr char kTarget[] = "fo_jax_gemm_v2";

Status Gemm(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
            ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::Buffer<ffi::U32>> counters,
            const GemmPlanAttr& plan_attr, bool signal) {
  GemmDtype dtype;
  FO_JAX_RETURN_IF_ERROR(GemmDtypeOf(a.element_type(), &dtype));
  if (b.element_type() != a.element_type() || d->element_type() != a.element_type()) {
    return Status::InvalidArgument("a, b, d must all be bf16 or all f16");
  }
  auto ad = a.dimensions(), bd = b.dimensions(), dd = d->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2 || ad[1] != bd[0] || dd[0] != ad[0] ||
      dd[1] != bd[1]) {
    return Status::InvalidArgument("shapes must be a[B*m,k] b[k,n] d[B*m,n]");
  }
  GemmPlan plan;
  FO_JAX_RETURN_IF_ERROR(DecodeGemmPlan(plan_attr, &plan));
  FO_JAX_RETURN_IF_ERROR(ValidateGemmPlan(plan, ad[0], bd[1], ad[1]));
  if (counters->element_count() != static_cast<size_t>(plan.num_groups)) {
    return Status::InvalidArgument("counters must have one entry per group");
  }
  FO_JAX_RETURN_IF_ERROR(LoadGemmKernelsOnce(device));
  SignalingGemmArgs args = GemmArgsOf(plan, dtype, ad[0], bd[1], ad[1]);
  args.a = a.untyped_data();
  args.b = b.untyped_data();
  args.d = d->untyped_data();
  args.sm_budget = ResolveSmBudget(plan.sm_budget);
  // Counters are zeroed by the launcher right before the kernel (no GPU idle time while the host
  // builds the kernel's parameters); without signals they are zeroed after it (defined output).
  if (signal) {
    args.counters = counters->typed_data();
    args.zero_counters_on_launch = true;
  }
  std::string msg;
  FO_JAX_RETURN_IF_ERROR(LaunchStatus(LaunchSignalingGemm(stream, args, &msg), "GEMM", msg));
  if (!signal) {
    FO_JAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemsetAsync(counters->typed_data(), 0, args.num_groups * sizeof(uint32_t), stream),
        "zeroing the counters"));
  }
  return Status::Ok();
}

ffi::Error GemmImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::Buffer<ffi::U32>> counters,
                    GemmPlanAttr plan, bool signal) {
  return ToFfiError(Gemm(stream, device, a, b, d, counters, plan, signal), kTarget);
}

// Test entry: d_init is aliased to d by the caller (input_output_aliases), so elements the kernel
// does not write keep their poison value.
ffi::Error GemmIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::AnyBuffer d_init, ffi::Result<ffi::AnyBuffer> d,
                        ffi::Result<ffi::Buffer<ffi::U32>> counters, GemmPlanAttr plan,
                        bool signal) {
  if (d_init.untyped_data() != d->untyped_data()) {
    return ffi::Error::InvalidArgument("fo_jax_gemm_into_v2: d_init must be aliased to d");
  }
  return ToFfiError(Gemm(stream, device, a, b, d, counters, plan, signal),
                    "fo_jax_gemm_into_v2");
}

}  // namespace
}  // namespace fo_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmFfi, fo_jax::GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k]
                                  .Arg<ffi::AnyBuffer>()                     // b [k, n]
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // counters [G]
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal"));                    // bump counters

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmIntoFfi, fo_jax::GemmIntoImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k]
                                  .Arg<ffi::AnyBuffer>()                     // b [k, n]
                                  .Arg<ffi::AnyBuffer>()                     // d_init (aliased)
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // counters [G]
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal"));                    // bump counters
