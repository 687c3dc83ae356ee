"""The failure workers' call loop: each call timed and reported as "CALL <i> RAISED <seconds>
<first line of the error>" (and "MESSAGE <i> <error>") or "CALL <i> RETURNED <seconds>
nan_shards=<k>/<n>" (how many of the result's device shards hold a NaN: a failed call's band sums
write NaNs), the lines the reliability tests parse (tests/gpu/overlap/test_reliability_gpu.py)."""

import time

import jax
import numpy as np


def nan_shards(result) -> str:
    """"<k>/<n>": of the n device shards of the arrays in `result`, k hold a NaN."""
    shards = [sh for leaf in jax.tree_util.tree_leaves(result) for sh in leaf.addressable_shards]
    bad = sum(bool(np.isnan(np.asarray(sh.data, dtype=np.float32)).any()) for sh in shards)
    return f"{bad}/{len(shards)}"


def report_calls(f, args: tuple, calls: int, pause_s: float = 0.0,
                 raise_errors: bool = False, first: int = 0) -> None:
    """Runs f(*args) `calls` times, blocking on each, waiting `pause_s` seconds after each;
    `raise_errors`: a call's exception is re-raised after its report; `first`: the number of the
    first call in the reports."""
    for call in range(first, first + calls):
        start = time.perf_counter()
        try:
            result = jax.block_until_ready(f(*args))
            seconds = time.perf_counter() - start
            print(f"CALL {call} RETURNED {seconds:.1f} nan_shards={nan_shards(result)}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 (the expected failure, reported)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"CALL {call} RAISED {time.perf_counter() - start:.1f} {first}", flush=True)
            print(f"MESSAGE {call} {e}", flush=True)
            if raise_errors:
                raise
        time.sleep(pause_s)
