// XLA FFI handler for the overlapped GEMM + collective (target fo_jax_overlapped_matmul_ffi).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxOverlappedMatmulFfi);
