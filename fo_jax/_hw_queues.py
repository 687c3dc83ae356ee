"""Enough CUDA hardware queues for the copy-engine transport (docs/troubleshooting.md, "Hardware
queues").

CUDA maps a context's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8) and
reads the variable when the driver is initialised (cuInit; setting it later has no effect, as
measured on 4x H200). A queue runs in order, so an operation that waits holds up whatever another
stream enqueued behind it in the same queue. fo_jax's streams wait for other GPUs (flags, events);
when XLA enqueues a transfer that one of those GPUs needs (the next call's input, resharded from
another GPU) into such a queue after the wait, nothing moves again. This stalled the 4-GPU tests in
about half the runs at 8 queues and in none at 32.

So `import fo_jax` asks for 32 queues (CUDA's maximum) when the variable is unset and nothing in
the process has initialised the CUDA driver yet (JAX does when it first uses a GPU). A value the
user set is kept; the copy-engine transport then warns once if it is below 32, as it does when
the driver was initialised before fo_jax was imported.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Optional

VAR = "CUDA_DEVICE_MAX_CONNECTIONS"
WANTED = 32

# How the variable came to be: "set" (by fo_jax at import), "user" (already set), "late" (the
# driver was initialised before the import: its queues are whatever the variable said then).
_origin: Optional[str] = None
_warned = False


def _driver_initialized() -> bool:
    """Whether cuInit has run in this process. cuCtxGetCurrent returns CUDA_ERROR_NOT_INITIALIZED
    (3) before it and initialises nothing; loading libcuda does not initialise it either. No
    driver library: nothing can have initialised it."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    ctx = ctypes.c_void_p()
    return lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 3


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # an unknown JAX: assume the worst, set nothing
        return True


def request_at_import() -> None:
    """Sets CUDA_DEVICE_MAX_CONNECTIONS=32 if unset and the CUDA driver is not initialised yet
    (and, on a machine without one, no JAX backend exists yet)."""
    global _origin
    if _origin is not None:
        return
    if os.environ.get(VAR, "") != "":
        _origin = "user"
    elif _driver_initialized() or _backends_initialized():
        _origin = "late"
    else:
        os.environ[VAR] = str(WANTED)
        _origin = "set"


def problem() -> Optional[str]:
    """Why this process's GPU contexts may have fewer than 32 hardware queues, or None."""
    if _origin == "set":
        return None
    if _origin == "late":
        value = f"={os.environ[VAR]}" if os.environ.get(VAR) else " unset (8 queues)"
        return (f"the CUDA driver was initialised (e.g. JAX used a GPU) before fo_jax was "
                f"imported, with {VAR}{value}")
    value = os.environ.get(VAR, "")
    if value.isdigit() and int(value) >= WANTED:
        return None
    return f"{VAR}={value} is below {WANTED}"


def status() -> str:
    """One line: the variable, how it came to be, and whether the queues suffice."""
    return f"{VAR}={os.environ.get(VAR, '')} ({_origin}; {problem() or 'enough hardware queues'})"


def caution(fn: str) -> str:
    """For a call that takes the copy-engine transport: "" with enough queues, else a caution to
    append to the path's reason, and (once per process) a RuntimeWarning saying what to do."""
    global _warned
    reason = problem()
    if reason is None:
        return ""
    if not _warned:
        _warned = True
        warnings.warn(
            f"{fn}: {reason}. The copy-engine transport's waits can then hold up XLA's transfers "
            f"that another GPU needs, and calls may stall (docs/troubleshooting.md, 'Hardware "
            f"queues'). Import "
            f"fo_jax before JAX first uses a GPU, or set {VAR}={WANTED} before starting Python, "
            f"or use OverlapConfig(transport='nccl').", RuntimeWarning, stacklevel=3)
    return f"; caution: {reason} (docs/troubleshooting.md, 'Hardware queues')"
