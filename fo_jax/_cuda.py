"""Loading the CUDA extension and registering its FFI targets with XLA.

fo_jax imports without the extension (CPU-only builds, machines without CUDA); only a call that
needs CUDA asks for it, and then gets an actionable error if it is missing. On a machine with CUDA
GPUs a missing extension is a mistake worth one warning (the first call that asks for it): every
call would quietly take the reference path, correct but without overlap.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import warnings
from typing import Optional

import jax

log = logging.getLogger("fo_jax")


def _preload_nccl() -> None:
    # The extension links libnccl.so.2 from the nvidia-nccl-cu13 wheel. Its rpath finds the wheel
    # in a normal site-packages layout; loading it here by full path also covers --target installs
    # and editable builds. JAX's CUDA plugin loads the same file, so the process keeps one NCCL.
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "lib", "libnccl.so.2")
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return


@functools.lru_cache(maxsize=None)
def _load() -> tuple[Optional[object], str]:
    """Imports fo_jax._fo_jax_cuda once; returns (module or None, reason if None)."""
    from fo_jax._version import build_info  # noqa: PLC0415

    try:
        _preload_nccl()
        from fo_jax import _fo_jax_cuda  # noqa: PLC0415 (optional compiled module)
    except ImportError as e:
        if build_info()["cuda_built"] is False:
            return None, (
                "this fo_jax is a CPU-only build: it was built without its CUDA module (no nvcc "
                "13.x found, or FO_JAX_CUDA=OFF). Fix: put nvcc 13.x on PATH and reinstall: "
                "pip install --force-reinstall --no-deps . (README.md, 'Install')")
        return None, (
            f"the CUDA module fo_jax._fo_jax_cuda could not be imported ({e}). Fix: rebuild fo_jax "
            "with nvcc 13.x on PATH: pip install --force-reinstall --no-deps . (README.md, "
            "'Install')")
    except OSError as e:
        return None, f"loading libnccl.so.2 failed ({e}); pip install nvidia-nccl-cu13"
    from fo_jax import _env  # noqa: PLC0415

    _fo_jax_cuda.set_comm_timeout_s(_env.comm_timeout_s())  # the module reads no environment
    _fo_jax_cuda.set_test_hooks(_env.test_epoch_start(), *_env.test_fail())  # unset: none
    return _fo_jax_cuda, ""


_warned_missing = False


def module_available(warn: bool = True) -> bool:
    """Whether the extension loads. If not and CUDA GPUs are present, warns once per process
    (unless warn=False: tools that report the reason themselves)."""
    global _warned_missing
    mod, reason = _load()
    if mod is None and warn and not _warned_missing and gpu_devices():
        _warned_missing = True
        warnings.warn(f"fo_jax: CUDA GPUs are present but {reason}. Until then every fo_jax call "
                      "takes the XLA reference path (correct results, no overlap).",
                      RuntimeWarning, stacklevel=3)
    return mod is not None


def unavailable_reason() -> str:
    return _load()[1]


def module():
    """The compiled extension; RuntimeError with the reason if it is not available."""
    mod, reason = _load()
    if mod is None:
        raise RuntimeError(f"fo_jax: {reason}")
    return mod


@functools.lru_cache(maxsize=None)
def register_targets() -> tuple[str, ...]:
    """Registers every FFI handler of the extension for the CUDA platform (idempotent)."""
    names = []
    for name, capsule in module().registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
        names.append(name)
    log.debug("fo_jax: registered FFI targets %s", names)
    return tuple(sorted(names))


def gpu_devices() -> list:
    """The CUDA devices JAX sees (empty if none or no CUDA plugin)."""
    try:
        return [d for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        return []
