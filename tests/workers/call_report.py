"""The failure workers' call loop: each call timed and reported as "CALL <i> RAISED <seconds>
<first line of the error>" (and "MESSAGE <i> <error>") or "CALL <i> RETURNED <seconds>
nan_shards=<k>/<n>" (how many of the result's device shards hold a NaN: a failed call's band sums
write NaNs), followed, where the worker gives the expected result, by " shards=<s0>,<s1>,..."
(per GPU in device order: "nan", "ok" (within bfloat16 rounding of the float64 reference) or
"wrong"), the lines the reliability tests parse (tests/gpu/overlap/test_reliability_gpu.py)."""

import time

import jax
import numpy as np


def nan_shards(result) -> str:
    """"<k>/<n>": of the n device shards of the arrays in `result`, k hold a NaN."""
    shards = [sh for leaf in jax.tree_util.tree_leaves(result) for sh in leaf.addressable_shards]
    bad = sum(bool(np.isnan(np.asarray(sh.data, dtype=np.float32)).any()) for sh in shards)
    return f"{bad}/{len(shards)}"


def shard_states(result, expected: np.ndarray) -> str:
    """"<s0>,<s1>,...": per device shard of the array `result` (in device order), "nan" if it
    holds a NaN, else "ok" if it matches its part of `expected` (float64) within bfloat16
    rounding of a K-long sum, else "wrong"."""
    states = []
    scale = float(np.abs(expected).max()) or 1.0
    for sh in sorted(result.addressable_shards, key=lambda sh: sh.device.id):
        got = np.asarray(sh.data, dtype=np.float64)
        if np.isnan(got).any():
            states.append("nan")
            continue
        ok = np.allclose(got, expected[sh.index], rtol=2e-2, atol=1e-2 * scale)
        states.append("ok" if ok else "wrong")
    return ",".join(states)


def report_calls(f, args: tuple, calls: int, pause_s: float = 0.0,
                 raise_errors: bool = False, first: int = 0,
                 expected: np.ndarray | None = None) -> None:
    """Runs f(*args) `calls` times, blocking on each, waiting `pause_s` seconds after each;
    `raise_errors`: a call's exception is re-raised after its report; `first`: the number of the
    first call in the reports; `expected`: the correct result (one array), to report each
    shard's state."""
    for call in range(first, first + calls):
        start = time.perf_counter()
        try:
            result = jax.block_until_ready(f(*args))
            seconds = time.perf_counter() - start
            states = "" if expected is None else f" shards={shard_states(result, expected)}"
            print(f"CALL {call} RETURNED {seconds:.1f} nan_shards={nan_shards(result)}{states}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 (the expected failure, reported)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"CALL {call} RAISED {time.perf_counter() - start:.1f} {first}", flush=True)
            print(f"MESSAGE {call} {e}", flush=True)
            if raise_errors:
                raise
        time.sleep(pause_s)
