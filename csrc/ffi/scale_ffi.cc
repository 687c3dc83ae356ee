// fo_jax_scale_ffi: buffers -> pointers -> LaunchScale. The smallest real handler; it proves the
// FFI chain on a GPU and is used by the GPU smoke test.
#include "ffi/scale_ffi.h"

#include "comm/status.h"
#include "ffi/ffi_status.h"
#include "kernels/scale.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace fo_jax {
namespace {

ffi::Error ScaleImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     float alpha) {
  ScaleDtype dtype;
  switch (x.element_type()) {
    case ffi::DataType::F32: dtype = ScaleDtype::kF32; break;
    case ffi::DataType::BF16: dtype = ScaleDtype::kBF16; break;
    case ffi::DataType::F16: dtype = ScaleDtype::kF16; break;
    default: return ffi::Error::InvalidArgument("fo_jax_scale_ffi: dtype must be f32, bf16 or f16");
  }
  if (y->element_type() != x.element_type() || y->element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("fo_jax_scale_ffi: output must match the input");
  }
  return ToFfiError(CudaStatus(LaunchScale(stream, dtype, x.untyped_data(), y->untyped_data(),
                                            static_cast<int64_t>(x.element_count()), alpha),
                                "LaunchScale"),
                    "fo_jax_scale_ffi");
}

}  // namespace
}  // namespace fo_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxScaleFfi, fo_jax::ScaleImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // x
                                  .Ret<ffi::AnyBuffer>()                     // y
                                  .Attr<float>("alpha"));                    // scale factor
