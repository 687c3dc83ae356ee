// XLA FFI handlers of the overlapped GEMM + collective (targets fo_jax_overlapped_matmul_v2 and,
// for float8_e4m3fn operands with their scales, fo_jax_overlapped_matmul_fp8_v1).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxOverlappedMatmulFfi);
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxOverlappedMatmulFp8Ffi);
