// The XLA FFI handlers of this library by target name, for the nanobind module to hand to
// Python (jax.ffi.register_ffi_target). Free of XLA headers: only the ffi layer sees those.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fo_jax {

// (target name, XLA_FFI_Handler* as void*) for every CUDA handler.
std::vector<std::pair<std::string, void*>> FfiHandlers();

// The same for the handlers of the CPU platform (fo_jax_check_overlap_plan).
std::vector<std::pair<std::string, void*>> CpuFfiHandlers();

}  // namespace fo_jax
