"""One JAX process (CPU) whose failure watch is inside calls into jaxlib when the interpreter
exits: the stand-in module's `failed_groups` spends about a second in the distributed client's
`blocking_key_value_get` (C++, the GIL released), BLOCK_MS at a time, as a poll's key-value
request runs while the coordination service shuts down. A daemon thread that comes back from such
a call during interpreter finalization is ended by Python (pthread_exit) inside jaxlib's C++
frames, which aborts the process ("FATAL: exception not rethrown"); the watch's exit hook must stop
and join its thread first. Prints "WORKER EXITING" and exits with status 0 when healthy.

Usage: watch_exit_worker.py PORT [shutdown]   (shutdown: call jax.distributed.shutdown() first)"""

import sys
import threading

import jax
from jax._src import distributed

from fo_jax import _cuda, _failure_watch

BLOCK_MS = 1
port, shutdown = sys.argv[1], sys.argv[2:] == ["shutdown"]
jax.distributed.initialize(f"localhost:{port}", num_processes=1, process_id=0)
client = distributed.global_state.client
inside = threading.Event()


class BlockingModule:
    """The CUDA module's two calls that the watch makes; the first blocks in jaxlib."""

    def failed_groups(self):
        inside.set()
        for _ in range(1000):  # about a second, almost all of it in jaxlib
            try:
                client.blocking_key_value_get("fo_jax/test/never_set", BLOCK_MS)
            except Exception:  # noqa: BLE001 (the expected deadline, or a client shut down)
                pass
        return []

    def abort_group_for_known_failure(self, unique_id, message):
        raise AssertionError("nothing failed")


_cuda.module_available = lambda warn=True: True
_cuda.module = BlockingModule
_failure_watch.PERIOD_S = 0.01
_failure_watch.watch(client, b"\x07" * 128, 0)
assert inside.wait(30), "the watch never polled"
if shutdown:
    jax.distributed.shutdown()
print("WORKER EXITING", flush=True)
