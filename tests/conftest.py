"""Test setup: 8 host CPU devices for the multi-device reference tests, and GPU gating.

XLA_FLAGS must be set before jax is imported anywhere, so this runs first. GPU tests carry the
`gpu` marker and skip with a reason when GPUs are missing; FO_JAX_REQUIRE_GPU=1 turns that skip
into a failure (for runs on GPU machines).
"""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

jax.config.update("jax_enable_x64", False)


def cpu_devices(n: int):
    devs = jax.devices("cpu")
    if len(devs) < n:
        flags = os.environ.get("XLA_FLAGS")
        pytest.skip(f"needs {n} CPU devices, have {len(devs)} (XLA_FLAGS={flags})")
    return devs[:n]


def cpu_mesh(shape, names) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(cpu_devices(n)).reshape(shape), names)


def gpus() -> list:
    """The CUDA devices JAX sees (none without any)."""
    try:
        return [d for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        return []


def gpu_devices_or_skip(n: int = 1):
    """The first n CUDA devices, or skip (fail under FO_JAX_REQUIRE_GPU=1) with the reason."""
    devs = gpus()
    if len(devs) < n:
        reason = f"needs {n} CUDA GPU(s), found {len(devs)}"
        if os.environ.get("FO_JAX_REQUIRE_GPU") == "1":
            pytest.fail(f"FO_JAX_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    return devs[:n]


# Diagnostics for hangs on the device machine (tools/hang_probe.sh): with FO_JAX_TEST_STALL_S set,
# a test running longer than that prints fo_jax's per-GPU protocol state and every Python
# thread's stack, then "STALLED <pid>" (the wrapper attaches a debugger), and the process exits.
_stall_s = float(os.environ.get("FO_JAX_TEST_STALL_S", "0") or 0)
_current = {"name": None, "since": 0.0}


def pytest_runtest_setup(item):
    _current["name"], _current["since"] = item.nodeid, __import__("time").time()


if _stall_s > 0:
    import faulthandler
    import threading
    import time

    def _stall_watch():
        while True:
            time.sleep(1.0)
            name, since = _current["name"], _current["since"]
            if name is None or time.time() - since < _stall_s:
                continue
            print(f"\nSTALL: {name} running for {_stall_s:.0f} s", flush=True)

            def states():
                try:
                    from fo_jax import _cuda

                    for line in _cuda.module().debug_comm_states():
                        print("  state:", line, flush=True)
                except Exception as e:  # diagnostics only
                    print("  state: unavailable:", e, flush=True)

            t = threading.Thread(target=states, daemon=True)
            t.start()
            t.join(20)
            faulthandler.dump_traceback(all_threads=True)
            print(f"STALLED {os.getpid()}", flush=True)
            time.sleep(float(os.environ.get("PROBE_ATTACH_S", "0")))
            os._exit(3)

    threading.Thread(target=_stall_watch, daemon=True).start()
