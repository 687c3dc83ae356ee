// The Python extension fo_jax._fo_jax_cuda: hands the FFI handler capsules to Python, nothing
// else. Python registers them with jax.ffi.register_ffi_target (fo_jax/_cuda.py).
#include <nanobind/nanobind.h>

#include "ffi/scale_ffi.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule EncapsulateFfiHandler(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_fo_jax_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["fo_jax_scale_ffi"] = EncapsulateFfiHandler(FoJaxScaleFfi);
    return d;
  });
}
