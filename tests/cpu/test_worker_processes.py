"""tests/worker_processes.py, which the GPU tests wait for their worker processes with: outputs
come back in launch order, and a process that hangs fails the test with every process's last
output and the hung one's Python stack (faulthandler on SIGABRT), not a bare timeout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from worker_processes import limit_s, wait_all, with_stack_dumps


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=with_stack_dumps(dict(os.environ)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_outputs_in_launch_order(monkeypatch):
    monkeypatch.delenv("FO_JAX_TEST_PROCESS_TIMEOUT_S", raising=False)
    procs = [_start("print('first')"), _start("import sys; print('second'); sys.exit(3)")]
    assert wait_all(procs, 60, "hung") == [(0, "first\n"), (3, "second\n")]


def test_a_hang_reports_every_process_and_the_stack(monkeypatch):
    monkeypatch.delenv("FO_JAX_TEST_PROCESS_TIMEOUT_S", raising=False)
    hanging = ("import time\nprint('before the hang', flush=True)\n"
               "def stuck_here():\n    time.sleep(120)\nstuck_here()\n")
    procs = [_start("print('done')"), _start(hanging)]
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_all(procs, 3, "a worker hung")
    message = str(failed.value)
    assert message.startswith("a worker hung (stopped after 3 s)"), message
    assert "---- process 0 (exit 0):\ndone" in message, message
    assert "---- process 1 (exit -6):\nbefore the hang" in message, message
    assert "in stuck_here" in message, message  # faulthandler's stack of the hung process
    assert all(p.poll() is not None for p in procs)


def test_the_limit_follows_the_environment(monkeypatch):
    monkeypatch.setenv("FO_JAX_TEST_PROCESS_TIMEOUT_S", "90")
    assert limit_s(240) == 90.0
    monkeypatch.delenv("FO_JAX_TEST_PROCESS_TIMEOUT_S")
    assert limit_s(240) == 240.0
