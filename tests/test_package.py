"""The package imports everywhere; the CUDA module, when built, registers its FFI targets."""

import pytest

import fo_jax
from fo_jax import _cuda


def test_import_and_public_api():
    for name in ("overlapped_matmul", "matmul", "describe", "OverlapConfig"):
        assert hasattr(fo_jax, name)


def test_cuda_module_registers_targets_when_built():
    if not fo_jax.cuda_module_available():
        pytest.skip(f"CUDA module not built here: {_cuda.unavailable_reason()}")
    names = _cuda.register_targets()
    assert "fo_jax_scale_ffi" in names
