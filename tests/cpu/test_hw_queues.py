"""`import fo_jax` asks CUDA for 32 hardware queues (fo_jax/_hw_queues.py): set
when unset and no JAX backend exists yet, a user's value kept, and the copy-engine transport
warns once when the queues may be fewer. Each case runs in a fresh interpreter (the variable is
read once per process); CPU only."""

import os
import subprocess
import sys

import pytest

import fo_jax

# The subprocesses import the fo_jax this process imported (a source tree or an install).
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))

REPORT = """
import os, warnings
{before}
import fo_jax
from fo_jax import _hw_queues as h
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    h.caution("fn")
    h.caution("fn")
print(repr((os.environ.get(h.VAR), h._origin, h.problem(), [str(w.message) for w in caught])))
"""


def _run(before: str = "", value=None):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    if value is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = value
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", REPORT.format(before=before)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 (our own repr)


def test_import_sets_32_when_unset():
    value, origin, problem, warned = _run()
    assert (value, origin, problem, warned) == ("32", "set", None, [])


@pytest.mark.parametrize("value,ok", [("8", False), ("1", False), ("32", True)])
def test_user_value_is_kept(value, ok):
    got, origin, problem, warned = _run(value=value)
    assert (got, origin) == (value, "user")
    if ok:
        assert problem is None and warned == []
    else:
        assert "below 32" in problem
        assert len(warned) == 1 and "transport='nccl'" in warned[0], warned  # once


def test_backend_before_import_warns():
    value, origin, problem, warned = _run(before="import jax; jax.devices()")
    assert value is None and origin == "late"
    assert "before fo_jax was imported" in problem
    assert len(warned) == 1 and "CUDA_DEVICE_MAX_CONNECTIONS=32" in warned[0], warned
