"""GPU smoke test: fo_jax's own kernel runs through csrc -> nanobind -> register_ffi_target ->
ffi_call on a real GPU and computes the right numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from fo_jax import _smoke
from conftest import gpu_devices_or_skip

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_scale_ffi_on_gpu(dtype):
    (dev,) = gpu_devices_or_skip(1)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    rng = np.random.default_rng(0)
    x = jax.device_put(jnp.asarray(rng.standard_normal(100_003), dtype), dev)
    f = jax.jit(lambda v: _smoke.scale(v, 1.75))
    hlo = f.lower(x).as_text()
    assert "fo_jax_scale_ffi" in hlo, "the CUDA lowering did not use the FFI target"
    out = f(x)
    assert out.dtype == jnp.dtype(dtype) and out.devices() == {dev}
    ref = (np.asarray(x, np.float32) * np.float32(1.75)).astype(np.asarray(x).dtype)
    np.testing.assert_array_equal(np.asarray(out), ref)
