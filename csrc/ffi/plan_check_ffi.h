// XLA FFI handler fo_jax_check_overlap_plan, for the CPU platform: decodes an overlap plan and a
// mesh table exactly as the overlap handler does, validates the plan with the same function and
// writes what the handler would derive from them for one device, so that the host side of a call
// (its attributes' encoding, the plan's validation, the GEMM arguments it gives) is tested on
// machines without GPUs.
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxCheckOverlapPlanFfi);
