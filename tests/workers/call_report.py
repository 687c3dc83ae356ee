"""The failure workers' call loop: each call timed and reported as "CALL <i> RAISED|RETURNED
<seconds> <first line of the error>" (and "MESSAGE <i> <error>"), the lines the reliability tests
parse (tests/gpu/overlap/test_reliability_gpu.py)."""

import time

import jax


def report_calls(f, args: tuple, calls: int, pause_s: float = 0.0,
                 raise_errors: bool = False, first: int = 0) -> None:
    """Runs f(*args) `calls` times, blocking on each, waiting `pause_s` seconds after each;
    `raise_errors`: a call's exception is re-raised after its report; `first`: the number of the
    first call in the reports."""
    for call in range(first, first + calls):
        start = time.perf_counter()
        try:
            jax.block_until_ready(f(*args))
            print(f"CALL {call} RETURNED {time.perf_counter() - start:.1f}", flush=True)
        except Exception as e:  # noqa: BLE001 (the expected failure, reported)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"CALL {call} RAISED {time.perf_counter() - start:.1f} {first}", flush=True)
            print(f"MESSAGE {call} {e}", flush=True)
            if raise_errors:
                raise
        time.sleep(pause_s)
