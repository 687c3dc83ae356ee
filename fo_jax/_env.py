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
DEFAULT_COMM_TIMEOUT_S = 0.0


def force_reference() -> bool:
    """FO_JAX_FORCE_REFERENCE=1: every call takes the XLA reference path (like
    OverlapConfig(force_reference=True) on every call). Read at trace time."""
    return os.environ.get(FORCE_REFERENCE, "") == "1"


def comm_timeout_s() -> float:
    """FO_JAX_COMM_TIMEOUT_S (opt-in fail-fast): seconds after which the progress watchdog fails
    a group whose call has not completed (another rank failed or stopped calling). The NCCL
    transport's communicators are aborted; the copy-engine transport's waits are released (its
    all-gather's copy threads give up on a missing peer after the same time), and a call still
    stuck as long again ends the process with exit status 70. The waiting call returns with
    undefined output and the next call raises. Default 0: no timeout, a paused rank is waited
    for as XLA's own collectives wait (a known failure of a rank still ends the wait:
    fo_jax/_failure_watch.py). A value that is not a number >= 0 keeps the default. Read once,
    when the CUDA module is loaded."""
    text = os.environ.get(COMM_TIMEOUT_S, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_COMM_TIMEOUT_S
    return value if value >= 0 else DEFAULT_COMM_TIMEOUT_S


PLAN_TIMEOUT_S = "FO_JAX_PLAN_TIMEOUT_S"
DEFAULT_PLAN_TIMEOUT_S = 120.0
TEST_EPOCH_START = "FO_JAX_TEST_EPOCH_START"
TEST_FAIL = "FO_JAX_TEST_FAIL"
TEST_FAIL_STAGES = ("alloc", "graph", "launch", "copy", "setup", "stop")


def plan_timeout_s() -> float:
    """FO_JAX_PLAN_TIMEOUT_S: with several JAX processes, how long an overlapped call's lowering
    waits for the other processes of its group to publish their plans (fo_jax/_bootstrap.py,
    plan agreement) before it raises; default 120: the skew between processes reaching the same
    lowering, not a compile time (a wait is logged after 10 s). Read at lowering time."""
    try:
        value = float(os.environ.get(PLAN_TIMEOUT_S, ""))
    except ValueError:
        return DEFAULT_PLAN_TIMEOUT_S
    return value if value > 0 else DEFAULT_PLAN_TIMEOUT_S


def test_epoch_start() -> int:
    """FO_JAX_TEST_EPOCH_START (tests only): the 32-bit epoch at which every copy-engine state
    created afterwards starts counting its calls, e.g. 4294967288 (2^32 - 8) to run calls across
    the wrap (docs/design.md, "Flags and epochs"); unset: 0. Read once, when the CUDA module is
    loaded. A value that is not an integer in [0, 2^32) raises."""
    text = os.environ.get(TEST_EPOCH_START, "")
    if not text:
        return 0
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise ValueError(f"{TEST_EPOCH_START}={text!r}: expected an integer in [0, 2**32)")
    return value


def test_fail() -> tuple:
    """FO_JAX_TEST_FAIL=<stage>:<rank> (tests only): make that rank of every fo_jax group fail at
    that stage, as the real failure would: "alloc", the copy-engine receive-buffer allocation;
    "graph", the copy-engine call's copy-graph build (after the address exchange); "launch", the
    call's GEMM launch (either transport); "copy", the copy thread's enqueueing of a copy-engine
    call; "setup", creating the group's copy-engine state (its first copy-engine call); "stop",
    every copy-engine call of that rank enqueues nothing and returns (to its peers, a rank that
    stopped calling: the progress watchdog's case). Unset: ("", -1). Read once, when the CUDA
    module is loaded. A malformed value raises."""
    text = os.environ.get(TEST_FAIL, "")
    if not text:
        return ("", -1)
    stage, _, rank = text.partition(":")
    if stage not in TEST_FAIL_STAGES or not rank.isdigit():
        raise ValueError(f"{TEST_FAIL}={text!r}: expected <stage>:<rank> with stage one of "
                         f"{TEST_FAIL_STAGES}")
    return (stage, int(rank))


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
