// XLA FFI handlers of the signaling GEMM alone: fo_jax_gemm_v2 (fo_jax.matmul and the GEMM
// tests: group table, batch layout, counters, SM budget) and fo_jax_gemm_into_v2 (the same GEMM
// writing into a caller-provided, aliased buffer, so that tests can poison it).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmFfi);
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmIntoFfi);
// fp8 (float8_e4m3fn operands, the weight K-major [n, k], two f32 scalar scales, bf16 output):
// fo_jax_gemm_fp8_v1 and its aliased test form fo_jax_gemm_fp8_into_v1.
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmFp8Ffi);
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmFp8IntoFfi);
// Split K (fo_jax.matmul on few tiles and long K): fo_jax_gemm_split_k_v1 and
// fo_jax_gemm_fp8_split_k_v1, the same GEMMs with a k_splits attribute, the split flags after
// the group counters in the counters result, and a third result for the partial sums;
// fo_jax_gemm_split_k_into_v1 writes into an aliased buffer (tests).
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmSplitKFfi);
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmSplitKIntoFfi);
XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxGemmFp8SplitKFfi);
