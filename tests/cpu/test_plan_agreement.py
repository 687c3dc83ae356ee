"""Plan agreement between two real JAX processes on CPU (tests/workers/plan_agreement_worker.py):
each lowers an overlapped call for the "cuda" platform over a mesh of one CPU device per
process, which checks through JAX's distributed key-value store that both run the same plan.
Equal plans pass; when one process plans differently (another OverlapConfig, as another
tuning-cache entry would give) both raise, naming the differing field, within the timeout."""

import os
import socket
import subprocess
import sys

import pytest

import fo_jax

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="CUDA module not built here (no nvcc at install time)")

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers",
                      "plan_agreement_worker.py")


def _run(groups_by_process, timeout_s=120):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))  # this fo_jax
    env = dict(os.environ, JAX_PLATFORMS="cpu", FO_JAX_PLAN_TIMEOUT_S="30",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    n = len(groups_by_process)
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(n), str(port), "cpu",
                               str(g)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for i, g in enumerate(groups_by_process)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a plan-agreement process hung (killed after {timeout_s} s)")
        outs.append(out)
    return outs


def test_processes_with_equal_plans_agree():
    for i, out in enumerate(_run([2, 2])):
        assert f"PLAN AGREED {i}" in out, out[-3000:]


def test_processes_with_different_plans_both_raise():
    outs = _run([2, 4])
    for i, out in enumerate(outs):
        assert f"RAISED {i} ValueError" in out, out[-3000:]
        assert "plan mismatch" in out and "gemm.group_begin" in out, out[-3000:]
        assert f"process {1 - i}" in out, out[-3000:]
