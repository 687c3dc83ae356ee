// XLA FFI handler of the overlapped GEMM + collective (target fo_jax_overlapped_matmul_v2).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxOverlappedMatmulFfi);
