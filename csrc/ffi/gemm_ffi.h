// XLA FFI handler for the signaling GEMM alone (target fo_jax_gemm_ffi): fo_jax.matmul and the
// GEMM tests (group table, batch/remap layout, counters, SM budget).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmFfi);
// The same GEMM writing into a caller-provided (aliased, e.g. poisoned) buffer: target
// fo_jax_gemm_into_ffi, used by tests to prove every output element is written.
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmIntoFfi);
