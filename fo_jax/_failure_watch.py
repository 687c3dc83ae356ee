"""Known failures across processes (docs/design.md, "Failure handling"). With one JAX process per
GPU, a rank that fails (its group fails in its process: an NCCL error, a failed GEMM launch, the
opt-in progress watchdog) leaves the other processes' ranks waiting inside NCCL for a partner
that will not come, and nothing in those processes knows. So each process publishes the failure
of a group it takes part in through JAX's distributed key-value store (the one that carries the
NCCL unique ids), under `fo_jax/failed/<unique id>/<process>`, and watches for the others'. On a
known failure, here or published elsewhere, every process fails the group and, on the NCCL
transport, aborts its communicators of it (the failing one included, so that nobody waits in NCCL
for the others either): the call waiting now returns (its output undefined: JAX cannot fail an
operation that already returned) and every later call of the group raises with the cause. A
copy-engine group is failed, not aborted: its calls keep running in step, as in one process
(csrc/comm/comm_registry.h, AbortGroupForKnownFailure). A rank that merely pauses publishes
nothing and is waited for, as XLA's own collectives wait.

A daemon thread polls once a second, only the groups whose client is still JAX's distributed
client (after `jax.distributed.shutdown()` there is no store to ask); `poll_once` is the pass, pure
of threads and clocks for the tests (a stand-in module and store). At interpreter exit the thread
is stopped and joined before finalization: a poll's key-value requests run in jaxlib with the GIL
released, and a daemon thread that comes back from one while the interpreter finalizes is ended
by Python (pthread_exit) inside jaxlib's C++ frames, which aborts the process with "FATAL:
exception not rethrown" after a run whose results were all right."""

from __future__ import annotations

import atexit
import threading
from typing import Optional

PERIOD_S = 1.0
# At exit: a poll's key-value requests return within milliseconds, or fail within about 0.1 s once
# the coordination service is gone; a join that times out leaves the exit as it was before.
JOIN_TIMEOUT_S = 10.0
PREFIX = "fo_jax/failed"

_lock = threading.Lock()
_watched: dict = {}  # unique id (bytes) -> (client, this process's index)
_handled: set = set()  # unique ids aborted here
_stop = threading.Event()
_thread: Optional[threading.Thread] = None


def _key(unique_id: bytes, process: Optional[int] = None) -> str:
    """The group's directory (no trailing slash: the store appends its own), or a process's
    entry in it."""
    base = f"{PREFIX}/{unique_id.hex()}"
    return base if process is None else f"{base}/{process}"


def poll_once(module, watched: dict, handled: set) -> list:
    """One pass over the watched groups: publishes each local failure not yet published and
    aborts that group here; aborts each group that another process published as failed. Returns
    (unique id, message) for each group aborted in this pass; each group is aborted once."""
    local = {bytes(uid): failure for uid, failure in module.failed_groups()}
    aborted = []
    for uid, (client, process) in list(watched.items()):
        if uid in handled:
            continue
        message = local.get(uid)
        if message is not None:
            try:
                client.key_value_set(_key(uid, process), message, allow_overwrite=True)
            except Exception:  # noqa: BLE001 (a store that is shutting down: abort here anyway)
                pass
        else:
            try:
                entries = client.key_value_dir_get(_key(uid))
            except Exception:  # noqa: BLE001 (no entry yet, or the store is shutting down)
                continue
            others = [(k.rsplit("/", 1)[-1], v) for k, v in entries
                      if k.rsplit("/", 1)[-1] != str(process)]
            if not others:
                continue
            other, failure = sorted(others)[0]
            message = f"process {other} of the group failed: {failure}"
        handled.add(uid)
        module.abort_group_for_known_failure(uid, message)
        aborted.append((uid, message))
    return aborted


def current_clients_only(watched: dict, client) -> dict:
    """The watched groups whose client is `client`, JAX's distributed client now: after
    `jax.distributed.shutdown()` (or a new `initialize`) an old client's store is gone."""
    return {uid: entry for uid, entry in watched.items() if entry[0] is client}


def _stop_and_join() -> None:
    """Registered with atexit when the thread starts, so it runs before the exit hooks registered
    earlier (jax's among them): ends the thread's poll before the interpreter finalizes."""
    _stop.set()
    _thread.join(JOIN_TIMEOUT_S)


def _run() -> None:
    from fo_jax import _cuda  # noqa: PLC0415 (the module is loaded by the lowering that watches)
    from fo_jax._bootstrap import current_distributed_client  # noqa: PLC0415 (imports this)

    while not _stop.wait(PERIOD_S):
        if not _cuda.module_available(warn=False):
            continue
        with _lock:
            watched = current_clients_only(_watched, current_distributed_client())
        if not watched:
            continue
        try:
            poll_once(_cuda.module(), watched, _handled)
        except Exception:  # noqa: BLE001 (never take the process down from a daemon thread)
            pass


def watch(client, unique_id: bytes, process_index: int) -> None:
    """Watches the group with this NCCL unique id (several processes take part in it) from now
    on; starts the thread on first use."""
    global _thread
    with _lock:
        _watched.setdefault(bytes(unique_id), (client, process_index))
        if _thread is None:
            _thread = threading.Thread(target=_run, name="fo_jax-failure-watch", daemon=True)
            _thread.start()
            atexit.register(_stop_and_join)
