// fo_jax_gemm_ffi: buffers -> SignalingGemmArgs -> LaunchSignalingGemm on XLA's stream.
#include "ffi/gemm_ffi.h"

#include <cuda_runtime.h>

#include <string>

#include "ffi/ffi_status.h"
#include "ffi/gemm_plan.h"
#include "kernels/signaling_gemm.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace fo_jax {
namespace {

ffi::Error GemmImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::Buffer<ffi::U32>> counters,
                    int32_t config, int32_t batch, ffi::Span<const int32_t> group_begin,
                    int32_t sm_budget, bool signal) {
  const auto dt = a.element_type();
  if ((dt != ffi::DataType::BF16 && dt != ffi::DataType::F16) || b.element_type() != dt ||
      d->element_type() != dt) {
    return ffi::Error::InvalidArgument("fo_jax_gemm_ffi: a, b, d must all be bf16 or all f16");
  }
  auto ad = a.dimensions(), bd = b.dimensions(), dd = d->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2 || batch < 1 || ad[0] % batch ||
      ad[1] != bd[0] || dd[0] != ad[0] || dd[1] != bd[1]) {
    return ffi::Error::InvalidArgument("fo_jax_gemm_ffi: shapes must be a[B*m,k] b[k,n] d[B*m,n]");
  }
  std::string msg = LoadGemmKernelsOnce(device);
  if (!msg.empty()) return ffi::Error::Internal("fo_jax_gemm_ffi: " + msg);
  SignalingGemmArgs args;
  args.dtype = dt == ffi::DataType::BF16 ? GemmDtype::kBF16 : GemmDtype::kF16;
  args.m = static_cast<int>(ad[0] / batch);
  args.n = static_cast<int>(bd[1]);
  args.k = static_cast<int>(ad[1]);
  args.batch = batch;
  args.a = a.untyped_data();
  args.b = b.untyped_data();
  args.d = d->untyped_data();
  args.sm_budget = ResolveSmBudget(sm_budget);
  args.config = config;
  msg = SetGroups(args, group_begin.begin(), group_begin.size());
  if (!msg.empty()) return ffi::Error::InvalidArgument("fo_jax_gemm_ffi: " + msg);
  if (counters->element_count() != static_cast<size_t>(args.num_groups)) {
    return ffi::Error::InvalidArgument("fo_jax_gemm_ffi: counters must have one entry per group");
  }
  // Counters are zeroed by the launcher right before the kernel (no GPU idle time while the host
  // builds the kernel's parameters); without signals they are zeroed after it (defined output).
  if (signal) {
    args.counters = counters->typed_data();
    args.zero_counters_on_launch = true;
  }
  cudaError_t err = LaunchSignalingGemm(stream, args, &msg);
  if (err != cudaSuccess) {
    return ffi::Error::Internal("fo_jax_gemm_ffi: " + msg + " (" + cudaGetErrorString(err) + ")");
  }
  if (!signal) {
    FO_JAX_RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(counters->typed_data(), 0, args.num_groups * sizeof(uint32_t), stream));
  }
  return ffi::Error::Success();
}

// Test entry: d_init is aliased to d by the caller (input_output_aliases), so elements the kernel
// does not write keep their poison value.
ffi::Error GemmIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::AnyBuffer d_init, ffi::Result<ffi::AnyBuffer> d,
                        ffi::Result<ffi::Buffer<ffi::U32>> counters, int32_t config, int32_t batch,
                        ffi::Span<const int32_t> group_begin, int32_t sm_budget, bool signal) {
  if (d_init.untyped_data() != d->untyped_data()) {
    return ffi::Error::InvalidArgument("fo_jax_gemm_into_ffi: d_init must be aliased to d");
  }
  return GemmImpl(stream, device, a, b, d, counters, config, batch, group_begin, sm_budget,
                  signal);
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
                                  .Attr<int32_t>("config")                   // table index
                                  .Attr<int32_t>("batch")                    // B (remap if > 1)
                                  .Attr<ffi::Span<const int32_t>>("group_begin")  // tile rows
                                  .Attr<int32_t>("sm_budget")                // 0: all SMs
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
                                  .Attr<int32_t>("config")                   // table index
                                  .Attr<int32_t>("batch")                    // B (remap if > 1)
                                  .Attr<ffi::Span<const int32_t>>("group_begin")  // tile rows
                                  .Attr<int32_t>("sm_budget")                // 0: all SMs
                                  .Attr<bool>("signal"));                    // bump counters
