"""Where `python -m fo_jax.bench` measures, decided from the GPU count and the flags, and what it
tells the user about that choice.

With 2+ GPUs it times the overlap over TP of them; with 1 GPU (or --tp 1) the single-GPU rows
(fo_jax.matmul against XLA's dot, and overlapped_matmul over a 1-device mesh); with none, the
same methods on host CPU devices, which measure XLA on the CPU and nothing of fo_jax's kernels,
so the choice is said loudly and recorded in every row. --require-gpu turns every such
fallback into an error.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Optional

CPU_HOST_DEVICES = 8  # host devices the CPU fallback asks XLA for (XLA_FLAGS)
CPU_FLAG = f"--xla_force_host_platform_device_count={CPU_HOST_DEVICES}"


class SelectionError(Exception):
    """The flags cannot be met on this machine; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Selection:
    platform: str  # "gpu" or "cpu"
    tp: int  # devices measured on (the "tp" mesh axis)
    num_gpus: int  # CUDA GPUs found
    message: str  # told to the user on stderr before measuring ("" for a plain multi-GPU run)
    note: Optional[str]  # recorded in every row and the report when the numbers need a caveat

    @property
    def single(self) -> bool:
        """The single-GPU rows (no collective to overlap) rather than the overlap rows."""
        return self.tp == 1


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def select(num_gpus: int, tp: Optional[int], require_gpu: bool, cuda_module: bool,
           cuda_reason: str = "") -> Selection:
    """Decides the platform and TP; SelectionError when the flags cannot be met."""
    if tp is not None and tp < 1:
        raise SelectionError(f"fo_jax.bench: --tp {tp}: TP must be 1 or more")
    if num_gpus == 0:
        if require_gpu:
            raise SelectionError(
                "fo_jax.bench: --require-gpu, but JAX sees no CUDA GPU (the overlap rows need 2+ "
                "GPUs, the single-GPU rows 1). Check `python -m fo_jax.info`.")
        tp = CPU_HOST_DEVICES if tp is None else tp
        if tp > CPU_HOST_DEVICES:
            raise SelectionError(f"fo_jax.bench: --tp {tp}: no GPUs, and the CPU fallback has "
                                 f"{CPU_HOST_DEVICES} host devices")
        note = (f"reference path on CPU: no GPUs found, every method ran XLA on "
                f"{_plural(tp, 'host CPU device')}; these times are not GPU measurements")
        message = (f"fo_jax.bench: found 0 CUDA GPUs: the overlap rows need 2+ GPUs, the "
                   f"single-GPU rows 1. Measuring on {_plural(tp, 'host CPU device')} instead "
                   "(--require-gpu makes this an error).")
        return Selection("cpu", tp, 0, message, note)
    if require_gpu and not cuda_module:
        raise SelectionError(f"fo_jax.bench: --require-gpu, but fo_jax's CUDA module is missing: "
                             f"{cuda_reason}")
    if tp is None:
        tp = num_gpus
    if tp > num_gpus:
        raise SelectionError(f"fo_jax.bench: --tp {tp}: only {_plural(num_gpus, 'local CUDA GPU')}"
                             f"; pass --tp {num_gpus} or less")
    message = ""
    if tp == 1:
        found = ("found 1 CUDA GPU: the overlap rows need 2+ GPUs (TP = the local GPU count, or "
                 "--tp)" if num_gpus == 1 else f"--tp 1 (of {num_gpus} GPUs)")
        message = (f"fo_jax.bench: {found}. Timing the single-GPU rows instead: fo_jax.matmul "
                   "against XLA's dot, and overlapped_matmul over a 1-device mesh against x @ w "
                   "+ the collective.")
    note = None
    if not cuda_module:
        note = (f"fo_jax's CUDA module is missing ({cuda_reason}): the fo_jax rows ran the XLA "
                "reference path")
    return Selection("gpu", tp, num_gpus, message, note)


def count_gpus_in_subprocess(timeout_s: int = 180) -> Optional[int]:
    """The CUDA GPUs JAX sees, asked in a child process so that this one has not touched a GPU
    yet (JAX reserves most of a GPU's memory when it first uses it). None if the child fails."""
    code = ("import jax\n"
            "try:\n    n = sum(d.platform == 'gpu' for d in jax.devices())\n"
            "except RuntimeError:\n    n = 0\n"
            "print('FO_JAX_GPUS', n)")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in p.stdout.splitlines():
        if line.startswith("FO_JAX_GPUS "):
            return int(line.split()[1])
    return None


def add_cpu_flag() -> None:
    """Asks XLA for the CPU fallback's host devices. Must happen before JAX creates its backends
    (importing jax does not); harmless with GPUs: it only sizes the host platform."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + CPU_FLAG).strip()
