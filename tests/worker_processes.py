"""Waiting for the worker processes that GPU tests launch, with a hang made readable: past the
limit every process still running gets SIGABRT, on which Python's faulthandler (PYTHONFAULTHANDLER=1
in the workers' environment: with_stack_dumps) prints every thread's stack, and the test fails
with each process's last output."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Sequence

import pytest

# FO_JAX_TEST_PROCESS_TIMEOUT_S shortens (or lengthens) every limit given here alike, e.g. on a
# short GPU lease: a hang then costs that long, and its report still comes back.
_LIMIT_ENV = "FO_JAX_TEST_PROCESS_TIMEOUT_S"


def with_stack_dumps(env: dict) -> dict:
    """`env` with faulthandler on, so that SIGABRT prints the worker's Python stacks."""
    return dict(env, PYTHONFAULTHANDLER="1")


def limit_s(default_s: float) -> float:
    """The limit to wait: FO_JAX_TEST_PROCESS_TIMEOUT_S if set, else `default_s`."""
    return float(os.environ.get(_LIMIT_ENV, default_s))


def wait_all(procs: Sequence[subprocess.Popen], default_s: float, hang: str) -> list:
    """(returncode, output) of each process once all have ended; fails the test with `hang`,
    every process's last output and its Python stacks if they take longer than limit_s."""
    limit = limit_s(default_s)
    deadline = time.monotonic() + limit
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{hang} (stopped after {limit:.0f} s)\n{stop_and_report(procs)}")
        outs.append((p.returncode, out))
    return outs


def stop_and_report(procs: Sequence[subprocess.Popen], grace_s: float = 20.0) -> str:
    """Ends every process still running (SIGABRT first, SIGKILL after `grace_s`) and returns
    each one's last output."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGABRT)
    reports = []
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        reports.append(f"---- process {i} (exit {p.returncode}):\n{(out or '')[-6000:]}")
    return "\n".join(reports)
