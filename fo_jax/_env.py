"""Every environment variable fo_jax reads, in one place (docs/configuration.md lists them).

Options that shape a call's plan are `OverlapConfig` fields, never environment variables: a
field is part of jit's cache key, an environment variable is not. What remains here are
process-wide switches. The one exception read elsewhere is CUDA_DEVICE_MAX_CONNECTIONS, which
`import fo_jax` sets before CUDA starts (fo_jax/_hw_queues.py). The compiled module reads no
environment variable: it receives what it needs from here (fo_jax/_cuda.py).
"""

from __future__ import annotations

import os

FORCE_REFERENCE = "FO_JAX_FORCE_REFERENCE"
COMM_TIMEOUT_S = "FO_JAX_COMM_TIMEOUT_S"
DEFAULT_COMM_TIMEOUT_S = 600.0


def force_reference() -> bool:
    """FO_JAX_FORCE_REFERENCE=1: every call takes the XLA reference path (like
    OverlapConfig(force_reference=True) on every call). Read at trace time."""
    return os.environ.get(FORCE_REFERENCE, "") == "1"


def comm_timeout_s() -> float:
    """FO_JAX_COMM_TIMEOUT_S: seconds after which the NCCL transport's progress watchdog fails
    a group whose call has not completed (another rank failed or stopped calling) and aborts its
    communicators; 0 turns the watchdog off. Default 600; a value that is not a number >= 0
    keeps the default. Read once, when the CUDA module is loaded."""
    text = os.environ.get(COMM_TIMEOUT_S, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_COMM_TIMEOUT_S
    return value if value >= 0 else DEFAULT_COMM_TIMEOUT_S


def cache_home() -> str:
    """XDG_CACHE_HOME, else ~/.cache: where the tuning cache lives (fo_jax/tuning/cache.py)."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def source_commit() -> str:
    """FO_JAX_COMMIT: the commit that benchmark results record, for a source tree without its
    git directory (a copy on another machine); "" when unset (then fo_jax asks git)."""
    return os.environ.get("FO_JAX_COMMIT", "")


def stall_attach_s() -> float:
    """PROBE_ATTACH_S: seconds a stalled process waits, after its stall report, before it
    exits, so that a debugger can attach (fo_jax/_diagnostics.py); default 0."""
    try:
        return max(0.0, float(os.environ.get("PROBE_ATTACH_S", "0") or 0))
    except ValueError:
        return 0.0
