"""Shared benchmark plumbing: timing (the anchors' method), result rows, output files.

Timing: `reps` back-to-back calls of a jitted function, one block_until_ready at the end, time
divided by `reps`; repeated `trials` times; the median is reported. This is the method of
../shared/anchors (median of 5 x 20 calls), so numbers are comparable with those baselines.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from typing import Callable, Sequence

import jax


def commit() -> str:
    env = os.environ.get("FO_JAX_COMMIT")
    if env:
        return env
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.check_output(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                                       text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_info(devices: Sequence) -> dict:
    return {"device": devices[0].device_kind, "num_devices": len(devices),
            "date": datetime.date.today().isoformat(), "commit": commit()}


def time_ms(f: Callable, *args, reps: int = 20, trials: int = 5, warmup: int = 3) -> float:
    """Median over `trials` of the mean time of `reps` back-to-back calls, in milliseconds."""
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    samples = []
    for _ in range(trials):
        t0 = time.perf_counter()
        outs = [f(*args) for _ in range(reps)]
        jax.block_until_ready(outs)
        samples.append((time.perf_counter() - t0) * 1e3 / reps)
    samples.sort()
    return samples[len(samples) // 2]


class Results:
    """Collects rows; writes JSON Lines and a markdown table."""

    def __init__(self, base: dict):
        self.base = base
        self.rows: list = []

    def add(self, **row) -> dict:
        full = {**self.base, **row}
        self.rows.append(full)
        print(json.dumps(full), flush=True)
        return full

    def write_jsonl(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            for r in self.rows:
                fh.write(json.dumps(r) + "\n")

    def write_markdown(self, path: str, table: str) -> None:
        with open(path, "w") as fh:
            fh.write(table)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"
