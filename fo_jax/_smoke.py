"""The smoke op that proves the FFI chain on a GPU (csrc -> nanobind -> register_ffi_target ->
ffi_call); not part of the public API."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fo_jax import _cuda


def _scale_reference(x, alpha):
    return (x.astype(jnp.float32) * np.float32(alpha)).astype(x.dtype)


def _scale_cuda(x, alpha):
    _cuda.register_targets()
    call = jax.ffi.ffi_call("fo_jax_scale_ffi", jax.ShapeDtypeStruct(x.shape, x.dtype),
                            vmap_method="broadcast_all")
    return call(x, alpha=np.float32(alpha))


def scale(x: jax.Array, alpha: float) -> jax.Array:
    """alpha * x computed in float32 and returned in x's dtype (f32, bf16 or f16).

    On CUDA this runs fo_jax's own kernel through the XLA FFI (target `fo_jax_scale_ffi`);
    elsewhere it runs the same arithmetic with XLA ops.
    """
    x = jnp.asarray(x)
    if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise TypeError(
            f"fo_jax._smoke.scale: dtype must be float32, bfloat16 or float16, got {x.dtype}")
    alpha = float(alpha)
    if not _cuda.module_available():
        return _scale_reference(x, alpha)
    return jax.lax.platform_dependent(
        x, cuda=lambda v: _scale_cuda(v, alpha), default=lambda v: _scale_reference(v, alpha))
