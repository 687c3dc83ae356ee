// XLA FFI handler fo_jax_check_overlap_plan, for the CPU platform: decodes an overlap plan
// exactly as the overlap handler does, validates it with the same function and writes what the
// handler would derive from it, so that the host side of the plan (its encoding, its
// validation, the GEMM arguments it gives) is tested on machines without GPUs.
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxCheckOverlapPlanFfi);
