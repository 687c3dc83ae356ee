"""The planning tests under every committed GEMM choice table.

The planner reads the choice table of the GPU model it runs on (fo_jax/_gemm_tables), so the
planning tests that pass on a machine without GPUs (the default model's table) can fail on
another model's machine, where a fitted model picks other rows. This runs them once more per
other table, in a pytest of their own with FO_JAX_TEST_DEVICE_KIND naming the model
(tests/conftest.py), so that CI, which has no GPU, sees what each model's machine would.
"""

import os
import subprocess
import sys

import pytest
from conftest import cpu_worker_env

import fo_jax
from fo_jax import _gemm_choice, _gemm_tables

# The files whose tests plan real calls through the table (fo_jax._plan, _gemm_choice).
PLANNING_TESTS = (
    "test_all_gather_overlap.py", "test_cuda_lowering.py", "test_fp8.py",
    "test_fp8_fast_accumulation.py", "test_fp8_overlap.py", "test_fp8_xla_dot.py",
    "test_gemm_choice.py", "test_matmul_xla_dot.py", "test_plan_golden.py", "test_planning.py",
    "test_split_k.py", "test_tuning.py",
)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def other_tables():
    """The committed tables but the one this process's planner reads."""
    return sorted(set(_gemm_tables.tables()) - {_gemm_choice.table().DEVICE})


def run_pytest(device: str, tests, timeout: float) -> subprocess.CompletedProcess:
    """pytest on `tests` (under tests/cpu) with `device`'s table, on CPU devices only, with the
    fo_jax this process imported."""
    env = cpu_worker_env(FO_JAX_TEST_DEVICE_KIND=device)
    env.pop("FO_JAX_REQUIRE_GPU", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider",
                           "--rootdir", ROOT, "-c", os.path.join(ROOT, "pyproject.toml"),
                           *(os.path.join(HERE, t) for t in tests)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_the_planning_tests_exist():
    missing = [f for f in PLANNING_TESTS if not os.path.exists(os.path.join(HERE, f))]
    assert not missing, f"renamed or removed: {missing}; update PLANNING_TESTS"


def test_an_unknown_device_kind_is_refused():
    r = run_pytest("NVIDIA H999", ["test_every_gemm_table.py::test_the_planning_tests_exist"],
                   timeout=300)
    assert r.returncode != 0
    assert "FO_JAX_TEST_DEVICE_KIND='NVIDIA H999' has no GEMM table" in r.stdout + r.stderr


@pytest.mark.skipif(not fo_jax.cuda_module_available(),
                    reason="the compiled CUDA module is not built here (the planning tests that "
                           "read a table need it)")
@pytest.mark.parametrize("device", other_tables())
def test_planning_tests_pass_under_the_table_of(device):
    print(f"running {len(PLANNING_TESTS)} planning test files under the table of {device} "
          "(a few minutes on 2 cores)", flush=True)
    r = run_pytest(device, PLANNING_TESTS, timeout=1800)
    assert r.returncode == 0, (f"planning tests under the table of {device} failed:\n"
                               + r.stdout[-6000:] + r.stderr[-2000:])
    assert f"GEMM choice table of {device}" in r.stdout, r.stdout[:2000]
