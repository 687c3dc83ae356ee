"""Test setup: 8 host CPU devices for the multi-device reference tests, and GPU gating.

XLA_FLAGS must be set before jax is imported anywhere, so this runs first. GPU tests carry the
`gpu` marker and skip with a reason when GPUs are missing; FO_JAX_REQUIRE_GPU=1 turns that skip
into a failure (for runs on GPU machines).
"""

import importlib.util
import os
import socket
import sys
import types

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import fo_jax  # noqa: E402  (before any device use: it asks CUDA for 32 hardware queues)
from fo_jax import _hw_queues  # noqa: E402

jax.config.update("jax_enable_x64", False)

# FO_JAX_TEST_DEVICE_KIND names the GPU model whose GEMM choice table the planner reads, in place
# of the first GPU's (or, without GPUs, the default model's): tests/cpu/test_every_gemm_table.py
# runs the planning tests under each committed table, as they run on that model's machines.
_device_kind = os.environ.get("FO_JAX_TEST_DEVICE_KIND")
if _device_kind:
    from fo_jax import _gemm_choice, _gemm_tables  # noqa: E402

    if _device_kind not in _gemm_tables.tables():
        raise ValueError(f"FO_JAX_TEST_DEVICE_KIND={_device_kind!r} has no GEMM table; the "
                         f"tables: {sorted(_gemm_tables.tables())}")
    _gemm_choice.device_kind = lambda: _device_kind


def pytest_report_header(config):
    lines = ["fo_jax: " + _hw_queues.status()]
    if _device_kind:
        lines.append(f"fo_jax: GEMM choice table of {_device_kind} (FO_JAX_TEST_DEVICE_KIND)")
    return lines


def gemm_config_table() -> types.ModuleType:
    """csrc/kernels/gemm_configs.py, the kernel table and its generator (plain Python, no build)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc",
                        "kernels", "gemm_configs.py")
    spec = importlib.util.spec_from_file_location("gemm_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dev_script(name: str) -> types.ModuleType:
    """dev/NAME.py as a module (dev/ is not a package; its scripts import their neighbours)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "dev"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def cpu_devices(n: int):
    devs = jax.devices("cpu")
    if len(devs) < n:
        flags = os.environ.get("XLA_FLAGS")
        pytest.skip(f"needs {n} CPU devices, have {len(devs)} (XLA_FLAGS={flags})")
    return devs[:n]


def use_gemm_table(monkeypatch, model=None, points=None, threshold=0.98):
    """Installs a GEMM choice table (fo_jax/_gemm_tables' module layout) as this GPU model's
    for the test; returns it."""
    from fo_jax import _gemm_choice  # noqa: PLC0415

    fake = types.SimpleNamespace(DEVICE="test GPU", MODEL=model or {}, XLA_POINTS=points or {},
                                 XLA_THRESHOLD=threshold)
    monkeypatch.setattr(_gemm_choice, "table", lambda: fake)
    return fake


def cpu_mesh(shape, names) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(cpu_devices(n)).reshape(shape), names)


def free_port() -> int:
    """A TCP port free on this host now, for a worker's jax.distributed coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_worker_env(**extra) -> dict:
    """The environment of a worker process on CPU: one CPU device (no XLA_FLAGS) and the fo_jax
    this process imported (not another one installed)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    env.pop("XLA_FLAGS", None)
    return env


def gpus() -> list:
    """The CUDA devices JAX sees (none without any)."""
    try:
        return [d for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        return []


def gpu_devices_or_skip(n: int = 1):
    """The first n CUDA devices, or skip with the reason. FO_JAX_REQUIRE_GPU=1 turns the skip
    into a failure where GPUs are missing altogether (no GPU, or a GPU but no CUDA module); a
    test that needs more GPUs than the machine has still skips (a 1-GPU machine runs the 1-GPU
    tests and skips the multi-GPU ones)."""
    devs = gpus()
    required = os.environ.get("FO_JAX_REQUIRE_GPU") == "1"
    if len(devs) < n:
        reason = f"needs {n} CUDA GPU(s), found {len(devs)}"
        if required and not devs:
            pytest.fail(f"FO_JAX_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    if required and not fo_jax.cuda_module_available():
        from fo_jax import _cuda

        pytest.fail(f"FO_JAX_REQUIRE_GPU=1: GPUs present but the CUDA module is not available: "
                    f"{_cuda.unavailable_reason()}")
    return devs[:n]


def tp_or_skip() -> int:
    """The tensor-parallel size of the multi-GPU tests: 4 where there are 4 or more GPUs, else 2;
    skips (or fails: FO_JAX_REQUIRE_GPU=1) as gpu_devices_or_skip(2) with fewer. (That returns
    the first two devices only: it does not count them.)"""
    gpu_devices_or_skip(2)
    return 4 if len(gpus()) >= 4 else 2


# Diagnostics for hangs on the device machine (tools/hang_probe.sh): with FO_JAX_TEST_STALL_S set,
# a test running longer than that prints fo_jax's per-GPU protocol state and every Python
# thread's stack, then "STALLED <pid>" (the wrapper attaches a debugger), and the process exits.
_current_test = [None]


def pytest_runtest_setup(item):
    _current_test[0] = item.nodeid


def pytest_configure(config):
    stall_s = float(os.environ.get("FO_JAX_TEST_STALL_S", "0") or 0)
    if stall_s > 0:
        from fo_jax import _diagnostics

        capture = config.pluginmanager.getplugin("capturemanager")  # the report must be seen
        _diagnostics.watch_for_stall(
            lambda: _current_test[0], stall_s, lambda: f"{_current_test[0]} still running",
            before_report=lambda: capture and capture.suspend_global_capture(in_=False))
