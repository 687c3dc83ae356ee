// See registrations.h.
#include "ffi/registrations.h"

#include "ffi/gemm_ffi.h"
#include "ffi/overlap_ffi.h"
#include "ffi/plan_check_ffi.h"
#include "ffi/scale_ffi.h"

namespace fo_jax {

std::vector<std::pair<std::string, void*>> FfiHandlers() {
  return {
      {"fo_jax_scale_ffi", reinterpret_cast<void*>(FoJaxScaleFfi)},
      {"fo_jax_gemm_v2", reinterpret_cast<void*>(FoJaxGemmFfi)},
      {"fo_jax_gemm_into_v2", reinterpret_cast<void*>(FoJaxGemmIntoFfi)},
      {"fo_jax_gemm_fp8_v1", reinterpret_cast<void*>(FoJaxGemmFp8Ffi)},
      {"fo_jax_gemm_fp8_into_v1", reinterpret_cast<void*>(FoJaxGemmFp8IntoFfi)},
      {"fo_jax_gemm_split_k_v1", reinterpret_cast<void*>(FoJaxGemmSplitKFfi)},
      {"fo_jax_gemm_split_k_into_v1", reinterpret_cast<void*>(FoJaxGemmSplitKIntoFfi)},
      {"fo_jax_gemm_fp8_split_k_v1", reinterpret_cast<void*>(FoJaxGemmFp8SplitKFfi)},
      {"fo_jax_overlapped_matmul_v2", reinterpret_cast<void*>(FoJaxOverlappedMatmulFfi)},
      {"fo_jax_overlapped_matmul_fp8_v1", reinterpret_cast<void*>(FoJaxOverlappedMatmulFp8Ffi)},
  };
}

std::vector<std::pair<std::string, void*>> CpuFfiHandlers() {
  return {{"fo_jax_check_overlap_plan", reinterpret_cast<void*>(FoJaxCheckOverlapPlanFfi)}};
}

}  // namespace fo_jax
