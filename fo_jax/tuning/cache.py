"""The on-disk tuning cache: ($XDG_CACHE_HOME or ~/.cache)/fo_jax/tuning.json.

Two sections: "entries" (chosen configuration per GPU model, NCCL version, per-GPU shape, dtype,
collective and TP size) and "comm" (fitted NCCL curves, reused across shapes). Writes are atomic
(temporary file + os.replace) under a lock file; an unreadable file reads as empty.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from typing import Optional

from fo_jax import _env

log = logging.getLogger("fo_jax")

# 2: GEMM default tile became ping-pong 128x192 (entries measured with the old kernels are stale).
VERSION = 2
_memo: dict = {}  # path -> ((mtime_ns, size), data): trace-time lookups read the file once


def cache_path() -> str:
    """Path of the tuning cache file (it may not exist yet)."""
    return os.path.join(_env.cache_home(), "fo_jax", "tuning.json")


def dtype_name(dtype) -> str:
    import jax.numpy as jnp  # noqa: PLC0415 (keeps this module light)

    return jnp.dtype(dtype).name


def nccl_version() -> str:
    """NCCL version of fo_jax's CUDA module, or "unknown" when the module cannot be loaded."""
    try:
        from fo_jax import _cuda  # noqa: PLC0415

        if not _cuda.module_available():
            return "unknown"
        return str(int(_cuda.module().nccl_version()))
    except Exception:  # noqa: BLE001 (a lookup must never fail a trace)
        return "unknown"


def entry_key(device_kind: str, nccl: str, collective: str, m: int, n: int, k: int, dtype,
              tp: int) -> str:
    return f"{device_kind}|nccl{nccl}|{dtype_name(dtype)}|{collective}|tp{int(tp)}|" \
           f"{int(m)}x{int(n)}x{int(k)}"


def comm_key(device_kind: str, nccl: str, collective: str, tp: int, nccl_max_ctas: int) -> str:
    return f"{device_kind}|nccl{nccl}|{collective}|tp{int(tp)}|ctas{int(nccl_max_ctas)}"


def _empty() -> dict:
    return {"version": VERSION, "entries": {}, "comm": {}}


def load(path: Optional[str] = None) -> dict:
    """The cache's content; an empty cache if the file is missing, corrupt or of another version."""
    path = path or cache_path()
    try:
        st = os.stat(path)
    except OSError:
        return _empty()
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _memo.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        with open(path) as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version') if isinstance(data, dict) else '?'}")
        for section in ("entries", "comm"):
            if not isinstance(data.get(section), dict):
                raise ValueError(f"missing section {section!r}")
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        log.warning("fo_jax: ignoring unreadable tuning cache %s (%s)", path, e)
        data = _empty()
    _memo[path] = (stamp, data)
    return data


@contextlib.contextmanager
def _locked(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a") as fh:
        try:
            import fcntl  # noqa: PLC0415 (POSIX only)

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:
            pass
        yield


def update(section: str, key: str, value: dict, path: Optional[str] = None) -> str:
    """Sets data[section][key] = value and writes the file atomically; returns its path."""
    path = path or cache_path()
    with _locked(path):
        _memo.pop(path, None)
        data = load(path)
        data = {**data, section: {**data[section], key: value}}
        fd, tmp = tempfile.mkstemp(prefix=".tuning.", suffix=".json", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _memo.pop(path, None)
    return path


def get(section: str, key: str, path: Optional[str] = None) -> Optional[dict]:
    value = load(path)[section].get(key)
    return value if isinstance(value, dict) else None


def lookup(device_kind: str, collective: str, m: int, n: int, k: int, dtype,
           tp: int) -> Optional[dict]:
    """The tuned configuration for this call, or None if it was never tuned here.

    Args:
      device_kind: jax `Device.device_kind` of the GPUs (e.g. "NVIDIA H200").
      collective: "reduce_scatter" or "all_reduce".
      m, n, k: per-GPU shape x[m, k] @ w[k, n] (m: rows before the reduce-scatter).
      dtype: operand dtype.
      tp: number of devices in the collective.

    Returns:
      {"num_groups", "sms_for_nccl", "nccl_max_ctas"} or None. Never raises.
    """
    try:
        key = entry_key(device_kind, nccl_version(), collective, m, n, k, dtype, tp)
        entry = get("entries", key)
        if entry is None:
            return None
        out = {name: int(entry[name]) for name in ("num_groups", "sms_for_nccl", "nccl_max_ctas")}
        if min(out.values()) < 1:
            return None
        return out
    except Exception as e:  # noqa: BLE001 (trace-time lookup: fall back to the heuristic)
        log.warning("fo_jax: tuning cache lookup failed (%s); using the default heuristic", e)
        return None
