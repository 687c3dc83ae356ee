"""The one-process-per-GPU failure workers end with leave_together (tests/workers/
leave_together.py): every process exits with status 0 although they finish at different times and
process 0, which serves JAX's coordination service, finishes first. (With a fixed linger instead,
process 0 left while the others still ran and JAX terminated them: exit status -6 at TP=4.) Run on
CPU processes with tests/workers/leave_order_worker.py, which finish 1.5 s apart."""

import os
import subprocess
import sys
import time

import pytest

from conftest import cpu_worker_env, free_port

NPROC = 3
# Past leave_together's own 120 s limit and process 0's 3 s after the others.
DEADLINE_S = 180


def test_every_process_leaves_cleanly_when_process_0_finishes_first():
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers",
                          "leave_order_worker.py")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, worker, str(i), str(NPROC), port],
                              env=cpu_worker_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(NPROC)]
    # One deadline for all; a process still running then is killed, and the failure shows every
    # process's output (a bare TimeoutExpired shows none).
    deadline = time.monotonic() + DEADLINE_S
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    except subprocess.TimeoutExpired:
        for p in procs[len(outs):]:
            p.kill()
            outs.append(p.communicate()[0])
        pytest.fail(f"a worker was still running after {DEADLINE_S} s:\n" + "\n".join(
            f"--- process {i} (exit status {p.returncode}):\n{out[-3000:]}"
            for i, (p, out) in enumerate(zip(procs, outs))))
    finally:
        for p in procs:
            p.kill()
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert f"WORKER OK process {i}" in out, out[-3000:]
        assert p.returncode == 0, f"process {i}: exit status {p.returncode}:\n{out[-3000:]}"
