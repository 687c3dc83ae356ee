"""fo_jax's GEMM choice tables (fo_jax/_gemm_choice.py), one module per GPU model.

Each module is written by dev/fit_gemm_table.py from a sweep of one GPU model
(benchmarks/bench_gemm_sweep.py --configs all) and named after it (`module_name`); its DEVICE
is the model's name as JAX reports it (`device_kind`). The same kernels run on every Hopper GPU,
but their speeds relative to each other and to XLA's dot differ between models (memory
bandwidth, clocks), so each model that has been swept gets its own table. A GPU without one uses
DEFAULT_DEVICE's.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from types import ModuleType
from typing import Optional

DEFAULT_DEVICE = "NVIDIA H100 80GB HBM3"


def module_name(device: str) -> str:
    """The module that holds `device`'s table: 'NVIDIA H200' -> 'nvidia_h200'."""
    return re.sub(r"[^0-9a-z]+", "_", device.lower()).strip("_")


@functools.lru_cache(maxsize=None)
def tables() -> dict:
    """{device: table module} of every table in this package."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        out[mod.DEVICE] = mod
    return out


def for_device(device: Optional[str]) -> ModuleType:
    """The table fitted on `device` (a JAX device_kind), else DEFAULT_DEVICE's."""
    found = tables()
    return found.get(device) or found[DEFAULT_DEVICE]
