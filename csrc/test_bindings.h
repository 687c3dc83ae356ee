// The extension's bindings for tests (and the consumer GEMM benchmark): the one-GPU checks of
// comm/ (each runs a piece of the transport against a reference and reports what it found),
// pure functions the CPU tests compare with their tables (band order, failed-call releases,
// peer routes), and the test hooks (FO_JAX_TEST_*). fo_jax_module.cc binds the product and
// calls BindTestBindings; nothing here is needed to run an overlapped call.
#pragma once

#include <nanobind/nanobind.h>

namespace fo_jax {

void BindTestBindings(nanobind::module_& m);

}  // namespace fo_jax
