"""The device-run scripts (dev/lease/) start every step: dev/lease/dry_run_cpu.sh runs
multi_gpu_runs.sh's test steps against a stand-in nvidia-smi on this machine. A lent multi-GPU
machine can be withdrawn between two calls, so a script error found there may cost the window;
here it costs a test."""

import os
import shutil
import subprocess
import sys

import pytest

import fo_jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "dev", "lease", "dry_run_cpu.sh")


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
@pytest.mark.skipif(not os.path.exists(SCRIPT), reason="dev/ is not part of an installed package")
def test_multi_gpu_runs_start_every_test_step(tmp_path):
    where = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))  # this fo_jax
    # CPU only, also on a GPU machine: the steps must start, not run the multi-GPU tests.
    # The scripts call `python3`: this interpreter (a virtual environment need not be active).
    env = dict(os.environ, OUT=str(tmp_path / "out"), STEPS="overlap-tests reliability",
               JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
               PATH=os.pathsep.join((os.path.dirname(sys.executable), os.environ["PATH"])),
               PYTHONPATH=os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p))
    env.pop("FO_JAX_REQUIRE_GPU", None)
    p = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "dry run: every step started" in out, out[-4000:]
    summary = next((tmp_path / "out").glob("summary_*.txt")).read_text()
    # Each step ran pytest over its files (without GPUs they fail on FO_JAX_REQUIRE_GPU=1).
    for step in ("overlap-tests", "reliability"):
        assert f"{step}: rc 1 " in summary and "failed" in summary, summary
