"""The device-run scripts (dev/lease/) start every step: dev/lease/dry_run_cpu.sh runs
multi_gpu_runs.sh's test steps against a stand-in nvidia-smi on this machine. A lent multi-GPU
machine can be withdrawn between two calls, so a script error found there may cost the window;
here it costs a test."""

import os
import re
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


SPLIT = os.path.join(ROOT, "dev", "lease", "split_gpus.sh")


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
@pytest.mark.skipif(not os.path.exists(SPLIT), reason="dev/ is not part of an installed package")
def test_split_gpus_starts_one_sweep_per_gpu(tmp_path):
    # A stand-in nvidia-smi; SKIP_BUILD=1 wants an install folder, which the installed fo_jax
    # stands in for (an empty /tmp/fo/fo_jax, as dev/lease/dry_run_cpu.sh makes, imports nothing).
    os.makedirs("/tmp/fo/fo_jax", exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/usr/bin/env bash\necho "NVIDIA H200, 143771 MiB, 0.0 (dry run)"\n')
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), STEPS="sweep", SWEEP_TIMEOUT="120", FO_JAX_COMMIT="dry",
               SHAPES_0="256x512x512", SHAPES_1="512x512x512", SWEEP_ARGS="--dtype bfloat16",
               TAG="_dry", JAX_PLATFORMS="cpu",
               PATH=os.pathsep.join((str(bin_dir), os.path.dirname(sys.executable),
                                     os.environ["PATH"])))
    p = subprocess.run(["bash", SPLIT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    text = p.stdout + p.stderr
    assert p.returncode == 0 and "kept 0 result files and 2 logs" in text, text[-4000:]
    for i in (0, 1):
        log = (out / f"g{i}.log").read_text()
        # Without a GPU the sweep stops at its first check: it started, on its own GPU.
        assert "== [" in log and "sweep" in log and "needs a CUDA GPU" in log, log
    assert sorted(f.name for f in out.iterdir()) == ["g0.log", "g1.log"]
    # Its processes wrote under a folder of this run only, removed at the end: a fixed folder
    # let this test, run on a device machine beside a real split run, delete that run's rows.
    work = re.search(r"== work folder (\S+)", text)
    assert work and re.fullmatch(r"/tmp/split\.\w{6}", work.group(1)), text[-4000:]
    assert not os.path.exists(work.group(1))
