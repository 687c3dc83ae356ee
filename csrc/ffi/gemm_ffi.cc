// fo_jax_gemm_v2 and fo_jax_gemm_fp8_v1 (and their split-K forms): decode the plan, check it
// against the buffers, launch the GEMM on XLA's stream, map the status.
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
constexpr char kFp8Target[] = "fo_jax_gemm_fp8_v1";
constexpr char kSplitKTarget[] = "fo_jax_gemm_split_k_v1";
constexpr char kFp8SplitKTarget[] = "fo_jax_gemm_fp8_split_k_v1";

// Split K (SignalingGemmArgs::k_splits > 1): the partial sums' buffer; the flag words follow
// the group counters in the counters result, so the one zeroing of that result covers both.
struct SplitK {
  int k_splits = 1;
  float* partials = nullptr;
  size_t partial_floats = 0;
};

// fp8 scales: the two f32 scalars, nullptr for bf16/f16.
struct Scales {
  const float* a = nullptr;
  const float* b = nullptr;
};

// bf16/f16: a[B*m, k] @ b[k, n], d of the same dtype. fp8 (scales given): a[B*m, k] and b[n, k]
// (the weight K-major) float8_e4m3fn, d bf16.
Status Gemm(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
            const Scales* scales, ffi::Result<ffi::AnyBuffer> d,
            ffi::Result<ffi::Buffer<ffi::U32>> counters, const GemmPlanAttr& plan_attr,
            bool signal, const SplitK& split = SplitK{}) {
  GemmDtype dtype;
  FO_JAX_RETURN_IF_ERROR(GemmDtypeOf(a.element_type(), &dtype));
  const bool fp8 = scales != nullptr;
  auto ad = a.dimensions(), bd = b.dimensions(), dd = d->dimensions();
  int64_t n = 0;
  if (fp8) {
    if (dtype != GemmDtype::kE4M3 || b.element_type() != a.element_type() ||
        d->element_type() != ffi::DataType::BF16) {
      return Status::InvalidArgument("a, b must be float8_e4m3fn and d bf16");
    }
    if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2 || ad[1] != bd[1] ||
        dd[0] != ad[0] || dd[1] != bd[0]) {
      return Status::InvalidArgument("shapes must be a[B*m,k] b[n,k] d[B*m,n]");
    }
    n = bd[0];
  } else {
    if (dtype == GemmDtype::kE4M3) {
      return Status::InvalidArgument("fp8 operands go through " + std::string(kFp8Target));
    }
    if (b.element_type() != a.element_type() || d->element_type() != a.element_type()) {
      return Status::InvalidArgument("a, b, d must all be bf16 or all f16");
    }
    if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2 || ad[1] != bd[0] ||
        dd[0] != ad[0] || dd[1] != bd[1]) {
      return Status::InvalidArgument("shapes must be a[B*m,k] b[k,n] d[B*m,n]");
    }
    n = bd[1];
  }
  GemmPlan plan;
  FO_JAX_RETURN_IF_ERROR(DecodeGemmPlan(plan_attr, &plan));
  FO_JAX_RETURN_IF_ERROR(ValidateGemmPlan(plan, ad[0], n, ad[1]));
  FO_JAX_RETURN_IF_ERROR(ValidateGemmPlanDtype(plan, dtype, ad[1]));
  SignalingGemmArgs args = GemmArgsOf(plan, dtype, ad[0], n, ad[1]);
  args.k_splits = split.k_splits;
  const bool split_k = split.k_splits > 1;
  const size_t groups = static_cast<size_t>(plan.num_groups);
  if (split_k ? counters->element_count() < groups : counters->element_count() != groups) {
    return Status::InvalidArgument(
        std::string("counters must have one entry per group") +
        (split_k ? ", then the split flags (fo_jax/_plan.py, split_k_sizes)" : ""));
  }
  FO_JAX_RETURN_IF_ERROR(LoadGemmKernelsOnce(device));
  args.a = a.untyped_data();
  args.b = b.untyped_data();
  args.d = d->untyped_data();
  if (fp8) {
    args.a_scale = scales->a;
    args.b_scale = scales->b;
  }
  args.sm_budget = ResolveSmBudget(plan.sm_budget);
  if (split_k) {
    // Split K: the flags must be zero when the kernel starts, so the whole result (counters and
    // flags) is zeroed first; the kernel leaves the flags zero. The launcher checks the sizes
    // against what this device's last partial wave needs.
    args.split_partials = split.partials;
    args.split_partial_floats = static_cast<long long>(split.partial_floats);
    args.split_flags = counters->typed_data() + plan.num_groups;
    args.split_flag_words = static_cast<long long>(counters->element_count() - groups);
    if (signal) args.counters = counters->typed_data();
    FO_JAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemsetAsync(counters->typed_data(), 0,
                        counters->element_count() * sizeof(uint32_t), stream),
        "zeroing the counters"));
    std::string msg;
    return LaunchStatus(LaunchSignalingGemm(stream, args, &msg), "GEMM", msg);
  }
  // Counters are zeroed by the launcher right before the kernel (no GPU idle time while the host
  // builds the kernel's parameters). Without signals the counters result is left unwritten: the
  // Python entries never return it (fo_jax/_cuda_ops.py, _d_and_counters), and zeroing it took a
  // memset of about 0.8 us per call, a tenth of a small GEMM.
  if (signal) {
    args.counters = counters->typed_data();
    args.zero_counters_on_launch = true;
  }
  std::string msg;
  return LaunchStatus(LaunchSignalingGemm(stream, args, &msg), "GEMM", msg);
}

// The aliased test entries' check: d_init (an operand) must be d's buffer, so that elements the
// kernel does not write keep their poison value.
ffi::Error NotAliased(const ffi::AnyBuffer& d_init, ffi::Result<ffi::AnyBuffer>& d,
                      const char* target) {
  if (d_init.untyped_data() == d->untyped_data()) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string(target) + ": d_init must be aliased to d");
}

// The fp8 GEMM of target `target` (unsplit or split): the scales must be f32 scalars.
ffi::Error GemmFp8Call(const char* target, cudaStream_t stream, int32_t device,
                       ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Buffer<ffi::F32> a_scale,
                       ffi::Buffer<ffi::F32> b_scale, ffi::Result<ffi::AnyBuffer> d,
                       ffi::Result<ffi::Buffer<ffi::U32>> counters, const GemmPlanAttr& plan,
                       bool signal, const SplitK& split) {
  if (a_scale.element_count() != 1 || b_scale.element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(target) + ": the scales must be f32 scalars");
  }
  const Scales scales{a_scale.typed_data(), b_scale.typed_data()};
  return ToFfiError(Gemm(stream, device, a, b, &scales, d, counters, plan, signal, split), target);
}

SplitK SplitKOf(int32_t k_splits, ffi::Result<ffi::Buffer<ffi::F32>>& partials) {
  return SplitK{k_splits, partials->typed_data(), partials->element_count()};
}

ffi::Error GemmImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::Buffer<ffi::U32>> counters,
                    GemmPlanAttr plan, bool signal) {
  return ToFfiError(Gemm(stream, device, a, b, nullptr, d, counters, plan, signal), kTarget);
}

// Test entry: d_init is aliased to d by the caller (input_output_aliases), so elements the kernel
// does not write keep their poison value.
ffi::Error GemmIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::AnyBuffer d_init, ffi::Result<ffi::AnyBuffer> d,
                        ffi::Result<ffi::Buffer<ffi::U32>> counters, GemmPlanAttr plan,
                        bool signal) {
  if (ffi::Error e = NotAliased(d_init, d, "fo_jax_gemm_into_v2"); e.failure()) return e;
  return ToFfiError(Gemm(stream, device, a, b, nullptr, d, counters, plan, signal),
                    "fo_jax_gemm_into_v2");
}

ffi::Error GemmFp8Impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                       ffi::Buffer<ffi::F32> a_scale, ffi::Buffer<ffi::F32> b_scale,
                       ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::Buffer<ffi::U32>> counters,
                       GemmPlanAttr plan, bool signal) {
  return GemmFp8Call(kFp8Target, stream, device, a, b, a_scale, b_scale, d, counters, plan,
                     signal, SplitK{});
}

// The fp8 GEMM writing into d_init (aliased to d), for tests that poison the output.
ffi::Error GemmFp8IntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a,
                           ffi::AnyBuffer b, ffi::Buffer<ffi::F32> a_scale,
                           ffi::Buffer<ffi::F32> b_scale, ffi::AnyBuffer d_init,
                           ffi::Result<ffi::AnyBuffer> d,
                           ffi::Result<ffi::Buffer<ffi::U32>> counters, GemmPlanAttr plan,
                           bool signal) {
  if (ffi::Error e = NotAliased(d_init, d, "fo_jax_gemm_fp8_into_v1"); e.failure()) return e;
  return GemmFp8Impl(stream, device, a, b, a_scale, b_scale, d, counters, plan, signal);
}

ffi::Error GemmSplitKImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a,
                          ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d,
                          ffi::Result<ffi::Buffer<ffi::U32>> counters,
                          ffi::Result<ffi::Buffer<ffi::F32>> partials, GemmPlanAttr plan,
                          bool signal, int32_t k_splits) {
  return ToFfiError(Gemm(stream, device, a, b, nullptr, d, counters, plan, signal,
                         SplitKOf(k_splits, partials)),
                    kSplitKTarget);
}

// The split-K GEMM writing into d_init (aliased to d), for tests that poison the output.
ffi::Error GemmSplitKIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a,
                              ffi::AnyBuffer b, ffi::AnyBuffer d_init,
                              ffi::Result<ffi::AnyBuffer> d,
                              ffi::Result<ffi::Buffer<ffi::U32>> counters,
                              ffi::Result<ffi::Buffer<ffi::F32>> partials, GemmPlanAttr plan,
                              bool signal, int32_t k_splits) {
  if (ffi::Error e = NotAliased(d_init, d, "fo_jax_gemm_split_k_into_v1"); e.failure()) return e;
  return ToFfiError(Gemm(stream, device, a, b, nullptr, d, counters, plan, signal,
                         SplitKOf(k_splits, partials)),
                    "fo_jax_gemm_split_k_into_v1");
}

ffi::Error GemmFp8SplitKImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a,
                             ffi::AnyBuffer b, ffi::Buffer<ffi::F32> a_scale,
                             ffi::Buffer<ffi::F32> b_scale, ffi::Result<ffi::AnyBuffer> d,
                             ffi::Result<ffi::Buffer<ffi::U32>> counters,
                             ffi::Result<ffi::Buffer<ffi::F32>> partials, GemmPlanAttr plan,
                             bool signal, int32_t k_splits) {
  return GemmFp8Call(kFp8SplitKTarget, stream, device, a, b, a_scale, b_scale, d, counters, plan,
                     signal, SplitKOf(k_splits, partials));
}

}  // namespace
}  // namespace fo_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmSplitKFfi, fo_jax::GemmSplitKImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k]
                                  .Arg<ffi::AnyBuffer>()                     // b [k, n]
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n]
                                  .Ret<ffi::Buffer<ffi::U32>>()  // counters [G] + flags [tiles]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // partials (any contents)
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal")                      // bump counters
                                  .Attr<int32_t>("k_splits"));               // > 1

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmSplitKIntoFfi, fo_jax::GemmSplitKIntoImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k]
                                  .Arg<ffi::AnyBuffer>()                     // b [k, n]
                                  .Arg<ffi::AnyBuffer>()                     // d_init (aliased)
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n]
                                  .Ret<ffi::Buffer<ffi::U32>>()  // counters [G] + flags [tiles]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // partials (any contents)
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal")                      // bump counters
                                  .Attr<int32_t>("k_splits"));               // > 1

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmFp8SplitKFfi, fo_jax::GemmFp8SplitKImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k] e4m3
                                  .Arg<ffi::AnyBuffer>()                     // b [n, k] e4m3
                                  .Arg<ffi::Buffer<ffi::F32>>()              // a_scale []
                                  .Arg<ffi::Buffer<ffi::F32>>()              // b_scale []
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n] bf16
                                  .Ret<ffi::Buffer<ffi::U32>>()  // counters [G] + flags [tiles]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // partials (any contents)
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal")                      // bump counters
                                  .Attr<int32_t>("k_splits"));               // > 1

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmFp8Ffi, fo_jax::GemmFp8Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k] e4m3
                                  .Arg<ffi::AnyBuffer>()                     // b [n, k] e4m3
                                  .Arg<ffi::Buffer<ffi::F32>>()              // a_scale []
                                  .Arg<ffi::Buffer<ffi::F32>>()              // b_scale []
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n] bf16
                                  .Ret<ffi::Buffer<ffi::U32>>()              // counters [G]
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal"));                    // bump counters

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxGemmFp8IntoFfi, fo_jax::GemmFp8IntoImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // device
                                  .Arg<ffi::AnyBuffer>()                     // a [B*m, k] e4m3
                                  .Arg<ffi::AnyBuffer>()                     // b [n, k] e4m3
                                  .Arg<ffi::Buffer<ffi::F32>>()              // a_scale []
                                  .Arg<ffi::Buffer<ffi::F32>>()              // b_scale []
                                  .Arg<ffi::AnyBuffer>()                     // d_init (aliased)
                                  .Ret<ffi::AnyBuffer>()                     // d [B*m, n] bf16
                                  .Ret<ffi::Buffer<ffi::U32>>()              // counters [G]
                                  .Attr<fo_jax::GemmPlanAttr>("plan")        // _plan.GemmPlan
                                  .Attr<bool>("signal"));                    // bump counters
