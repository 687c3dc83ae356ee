"""Hang diagnostics (device machine; not imported by `import fo_jax`): fo_jax's per-GPU protocol
state and a stall watchdog, shared by the GPU tests (FO_JAX_TEST_STALL_S, FO_JAX_DEBUG_STATES)
and tools/many_calls_probe.py. benchmarks/NOTES.md §12-14."""

import faulthandler
import os
import threading
import time
from typing import Callable, Hashable, Optional

from fo_jax import _env


def print_comm_states(timeout_s: float = 20.0) -> None:
    """One line per fo_jax communicator of this process (GPU, rank, call count, copy-engine
    flags, the latest call's GEMM counters: _fo_jax_cuda.debug_comm_state), each printed as it
    is read, on a thread of its own: on a hung machine a read may block, which is then reported
    instead of blocking the caller."""

    def read():
        try:
            from fo_jax import _cuda

            mod = _cuda.module()
            for i in range(mod.debug_comm_state_count()):
                print("  state:", mod.debug_comm_state(i), flush=True)
        except Exception as e:  # diagnostics only
            print("  state: unavailable:", e, flush=True)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        print(f"  state: reading it blocked for {timeout_s:.0f} s", flush=True)


def watch_for_stall(progress: Callable[[], Hashable], stall_s: float,
                    describe: Callable[[], str],
                    before_report: Optional[Callable[[], None]] = None) -> None:
    """Starts a daemon thread: once progress() has returned the same value for stall_s seconds,
    calls before_report (pytest: stop capturing output), prints describe(), every Python
    thread's stack and the comm states, then "STALLED <pid>" (tools/hang_probe.sh attaches
    cuda-gdb on it), waits PROBE_ATTACH_S seconds (default 0) and ends the process with status 3."""

    def watch():
        last, since = None, time.time()
        while True:
            time.sleep(1.0)
            now = progress()
            if now != last:
                last, since = now, time.time()
                continue
            if now is None or time.time() - since < stall_s:
                continue
            if before_report is not None:
                before_report()
            print(f"\nSTALL after {stall_s:.0f} s: {describe()}", flush=True)
            # Stacks first: they need no CUDA call (reading the states may block).
            faulthandler.dump_traceback(all_threads=True)
            print_comm_states(timeout_s=10.0)
            print(f"STALLED {os.getpid()}", flush=True)
            time.sleep(_env.stall_attach_s())
            os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
