"""How a one-process-per-GPU worker leaves without jax.distributed.shutdown (whose barrier a
failed process may never reach): every process waits until all have finished, then the others
leave and process 0 last. Process 0 serves JAX's coordination service; a process still running
when it goes is terminated by JAX ("Terminating process because the JAX distributed service
detected fatal errors", exit status -6), so a fixed linger is not enough when the processes
finish their calls at different times."""

import os
import time

import jax

from fo_jax._bootstrap import current_distributed_client

# After the others saw every process finish they leave at once (os._exit: no thread runs after
# it), well within this.
COORDINATOR_GRACE_S = 3.0


def leave_together(status: int = 0, timeout_s: float = 120.0) -> None:
    """Publishes that this process is done, waits (up to `timeout_s`) until every process is,
    and ends the process with `status`: process 0 COORDINATOR_GRACE_S after the others."""
    client = current_distributed_client()
    proc, nproc = jax.process_index(), jax.process_count()
    client.key_value_set(f"fo_jax_tests/done/{proc}", "1")
    deadline = time.monotonic() + timeout_s
    for p in range(nproc):
        left_ms = int((deadline - time.monotonic()) * 1000)
        try:
            client.blocking_key_value_get(f"fo_jax_tests/done/{p}", max(left_ms, 1))
        except Exception:  # noqa: BLE001 - a process that never finished: leave anyway
            print(f"LEAVING WITHOUT process {p} (not done after {timeout_s:.0f} s)", flush=True)
            break
    if proc == 0:
        time.sleep(COORDINATOR_GRACE_S)
    os._exit(status)
