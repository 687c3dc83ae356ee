"""Plan agreement between two real JAX processes on CPU (tests/workers/plan_agreement_worker.py):
each lowers an overlapped call for the "cuda" platform over a mesh of one CPU device per
process, which checks through JAX's distributed key-value store that both run the same plan.
Equal plans pass, also when one process lowers more overlapped calls than the other (an extra
call of its own, or the shared call twice): the check names each call by what the program fixes
alike on every process, not by how many calls a process lowered. When one process plans the
shared call differently (another tuning-cache entry) both raise, naming the differing field."""

import os
import subprocess
import sys

import pytest

import fo_jax
from conftest import cpu_worker_env, free_port

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="CUDA module not built here (no nvcc at install time)")

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers",
                      "plan_agreement_worker.py")


PLAN_TIMEOUT_S = 30


def _run(groups_by_process, scenarios=None, timeout_s=120):
    port = free_port()
    env = cpu_worker_env(FO_JAX_PLAN_TIMEOUT_S=str(PLAN_TIMEOUT_S))
    n = len(groups_by_process)
    scenarios = scenarios or ["plain"] * n
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(n), str(port), "cpu",
                               str(g), scenarios[i]], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for i, g in enumerate(groups_by_process)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            texts = outs + [q.communicate()[0] or "" for q in procs[len(outs):]]
            report = "\n".join(f"--- process {i} (exit {q.returncode}):\n{text[-2000:]}"
                               for i, (q, text) in enumerate(zip(procs, texts)))
            pytest.fail(f"a plan-agreement process hung (killed after {timeout_s} s):\n{report}")
        outs.append(out)
    return outs


def _checks(out):
    """(agreement checks, seconds) that a worker's lowerings took."""
    line = next(x for x in out.splitlines() if x.startswith("CHECKS "))
    _, checks, _, seconds = line.split()
    return int(checks), float(seconds)


def test_processes_with_equal_plans_agree():
    for i, out in enumerate(_run([2, 2])):
        assert f"PLAN AGREED {i}" in out, out[-3000:]
        assert _checks(out)[0] == 1, out[-3000:]


@pytest.mark.parametrize("extra", [0, 1])
def test_an_extra_call_on_one_process_neither_mismatches_nor_waits(extra):
    """One process first lowers an overlapped call of other rows that the other never lowers
    (a `.lower()` for inspection): the shared call still agrees, and nobody waits for the
    timeout for the extra one."""
    outs = _run([2, 2], ["extra" if i == extra else "plain" for i in range(2)])
    for i, out in enumerate(outs):
        assert f"PLAN AGREED {i}" in out, out[-3000:]
        checks, seconds = _checks(out)
        assert checks == (2 if i == extra else 1), out[-3000:]
        assert seconds < PLAN_TIMEOUT_S / 2, out[-3000:]


def test_the_same_call_lowered_twice_on_one_process_agrees():
    outs = _run([2, 2], ["twice", "plain"])
    for i, out in enumerate(outs):
        assert f"PLAN AGREED {i}" in out, out[-3000:]
        checks, seconds = _checks(out)
        assert checks == (2 if i == 0 else 1), out[-3000:]
        assert seconds < PLAN_TIMEOUT_S / 2, out[-3000:]


def test_processes_with_different_plans_both_raise():
    """The shared call planned with another tuning-cache entry on process 1: both raise,
    naming the differing field and the other process."""
    outs = _run([2, 4])
    for i, out in enumerate(outs):
        assert f"RAISED {i} ValueError" in out, out[-3000:]
        assert "plan mismatch" in out and "gemm.group_begin" in out, out[-3000:]
        assert f"process {1 - i}" in out, out[-3000:]
