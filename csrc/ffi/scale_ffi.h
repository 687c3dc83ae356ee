// XLA FFI handler for the smoke op y = alpha * x (target fo_jax_scale_ffi).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(FoJaxScaleFfi);
