"""The package imports everywhere; the CUDA module, when built, registers its FFI targets."""

import pytest

import fo_jax
from fo_jax import _cuda


def test_import_and_public_api():
    for name in ("overlapped_matmul", "matmul", "describe", "OverlapConfig", "build_info"):
        assert hasattr(fo_jax, name)
    assert all(hasattr(fo_jax, name) for name in fo_jax.__all__)
    assert isinstance(fo_jax.__version__, str) and fo_jax.build_info()["version"] == \
        fo_jax.__version__


def test_cuda_module_registers_targets_when_built():
    if not fo_jax.cuda_module_available():
        pytest.skip(f"CUDA module not built here: {_cuda.unavailable_reason()}")
    names = _cuda.register_targets()
    assert "fo_jax_scale_ffi" in names


def test_timeline_bindings_when_built():
    """The diagnostics timeline (csrc/comm/call_timeline.h) is callable from Python: its mark names,
    arming and disarming, a read that returns one row per recorded call (none here: no call ran
    since arming), and a refusal of a negative call count."""
    if not fo_jax.cuda_module_available():
        pytest.skip(f"CUDA module not built here: {_cuda.unavailable_reason()}")
    mod = _cuda.module()
    marks = mod.timeline_marks()
    assert marks[:5] == ["host_enter", "host_prepared", "host_gemm_launched",
                         "host_copies_enqueued", "host_exit"]
    assert "gemm_end" in marks and "copy_sent0" in marks and len(set(marks)) == len(marks)
    assert "copy_go0" in marks and "copy_done7" in marks  # each copy's start and end
    assert "host_copies_issued" in marks  # the copy thread's end of enqueueing
    with pytest.raises(ValueError):
        mod.timeline_start(-1)
    mod.timeline_start(4)
    try:
        assert mod.timeline_read(mod.timeline_now_ns()) == []
    finally:
        mod.timeline_start(0)
