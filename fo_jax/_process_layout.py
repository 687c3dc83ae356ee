"""Whether the copy-engine transport may take a call whose ranks live in several JAX processes
(one process per GPU), and why not (docs/design.md, "Copy engine across processes").

With several processes the copy engine reaches a peer's memory through CUDA IPC: each process
exports what fo_jax itself allocated (receive buffers, flag words) and the peers map it
(csrc/comm/peer_memory_ipc.h). That covers the reduce-scatter, direct form and ring: every byte
it sends lands in fo_jax-owned memory. The all-reduce also stores into each peer's per-call XLA
output buffer, and the all-gather pushes its rows into each peer's per-call gathered output: each
process maps its peers' XLA memory pool once (a virtual-memory allocation exported as a file
descriptor, csrc/comm/xla_pool_ipc.h), which needs JAX's preallocated pool (one allocation per
GPU) and an allocation the driver can export; xla_pool_problem checks both in this process,
without an exchange. (The all-gather's per-call table of those outputs is then a shared-memory
segment, csrc/comm/all_gather_peers.h.) Both are opt-in (OverlapConfig(transport='copy_engine')):
their speed and their failure handling across processes have yet to be measured on GPUs at TP=4,
so unrequested they keep NCCL; and both need one GPU per process (a process that drives several
keeps NCCL for them). CUDA IPC reaches only GPUs of one host: every process must be on this
host.

The choice is made at lowering, before any call has mapped its peers' memory, so the first
reduce-scatter lowering of a process probes CUDA IPC between all processes (ipc_probe: each
exports a small buffer of its GPU, every other one maps it, writes a word into it and reads it
back): if any pair cannot (no peer access, IPC refused), every process chooses NCCL, instead of
failing the call at its first run. A process that sees only its own GPU (CUDA_VISIBLE_DEVICES)
passes the probe where the driver allows IPC across the visibility split, as on the 4-GPU H200
machines the tests ran on. OverlapConfig(copy_engine_multiprocess=False) keeps NCCL with
several processes (and skips the probe). The rule gives the same answer in every process (it
reads only the config, the collective, the hosts and the probe's verdicts that every process
publishes; and, for the all-reduce and all-gather, this process's device count and XLA pool,
alike in processes launched alike), and plan agreement (fo_jax/_bootstrap.py) checks that the
plans agree.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import socket
import threading
import warnings
from typing import Callable, Optional, Sequence

import jax

from fo_jax import _env
from fo_jax.config import OverlapConfig

# Collectives whose copy-engine form crosses processes: the reduce-scatter writes only into
# fo_jax-owned peer memory, the all-reduce and the all-gather also into the peers' mapped XLA
# memory (XLA_COLLECTIVES), which makes them opt-in across processes.
IPC_COLLECTIVES = ("reduce_scatter", "all_reduce", "all_gather")
XLA_COLLECTIVES = ("all_reduce", "all_gather")
_WHAT_INTO_XLA = {"all_reduce": "its band sums store into the peers' mapped XLA memory",
                  "all_gather": "its rows are pushed into the peers' mapped XLA memory"}

_lock = threading.Lock()
# Set by without_exchanges(): the rule answers from what this process already knows.
_no_exchange = contextvars.ContextVar("fo_jax_no_exchange", default=False)
_hosts: Optional[tuple] = None  # every process's host name, by process index (published once)
_ipc: Optional[str] = None  # the CUDA IPC probe's verdict, "" when every pair passed (run once)
_pool: Optional[str] = None  # xla_pool_problem's answer, "" when the pool maps (asked once)


def _client():
    from fo_jax import _bootstrap  # noqa: PLC0415 - the distributed client, only when needed

    return _bootstrap._distributed_client()


def exchange_hosts(process_index: int, process_count: int, client,
                   hostname: Callable[[], str] = socket.gethostname,
                   timeout_s: Optional[float] = None) -> tuple:
    """Every process's host name, by process index, through JAX's distributed key-value store:
    this process publishes its own and reads the others' (waiting up to FO_JAX_PLAN_TIMEOUT_S
    for each; every process of an SPMD program traces the same overlapped calls, so each one
    publishes)."""
    timeout_ms = int(1000 * (timeout_s if timeout_s is not None else _env.plan_timeout_s()))
    mine = hostname()
    client.key_value_set(f"fo_jax/host/{process_index}", mine)
    return tuple(mine if p == process_index else
                 str(client.blocking_key_value_get(f"fo_jax/host/{p}", timeout_ms))
                 for p in range(process_count))


def process_hosts() -> Optional[tuple]:
    """exchange_hosts for this program, once per process; within without_exchanges() only what
    an earlier exchange found (None before it)."""
    global _hosts
    with _lock:
        if _hosts is None and not _no_exchange.get():
            _hosts = exchange_hosts(jax.process_index(), jax.process_count(), _client())
        return _hosts


def _probe_word(process_index: int, device_index: int) -> int:
    """The word a process writes from its device_index-th GPU: distinct per writer, never 0
    (the probe buffer starts zeroed)."""
    return 0xF0000000 | (process_index & 0xFFFF) << 8 | (device_index & 0xFF)


def ipc_probe(process_index: int, process_count: int, client, devices: Sequence[int], module,
              timeout_s: Optional[float] = None) -> str:
    """Whether every process's GPUs can write into every other process's GPU memory through CUDA
    IPC: "" when they can, else the first problem in process order (the same text in every
    process). Each process exports a probe buffer per local GPU (`devices`, CUDA ordinals) and
    publishes the handles in JAX's key-value store; then maps every other process's buffers from
    each of its GPUs, writes a word into its own slot (its process index) and reads it back, and
    publishes its verdict; once it has read every verdict (no peer uses its buffers any more)
    it frees its buffers. `module`: the CUDA module (ipc_probe_export, ipc_probe_try,
    ipc_probe_release). Every process publishes both keys whatever happens, so none waits for a
    process that failed; a process that never publishes times out (FO_JAX_PLAN_TIMEOUT_S)."""
    timeout_ms = int(1000 * (timeout_s if timeout_s is not None else _env.plan_timeout_s()))
    handles, problem = [], ""
    if not devices:
        problem = f"process {process_index} has no CUDA GPU"
    for d in devices:
        if problem:
            break
        try:
            handle, why = module.ipc_probe_export(d)
        except Exception as e:  # noqa: BLE001 - becomes this process's verdict
            handle, why = b"", f"{type(e).__name__}: {e}"
        if why:
            problem = f"process {process_index} could not export GPU {d}'s memory: {why}"
        handles.append(bytes(handle).hex())
    client.key_value_set(f"fo_jax/ipc_probe/export/{process_index}",
                         json.dumps({"handles": handles, "problem": problem}))
    verdict = problem
    for q in range(process_count):
        if q == process_index:
            continue
        peer = json.loads(str(client.blocking_key_value_get(f"fo_jax/ipc_probe/export/{q}",
                                                            timeout_ms)))
        if not (verdict or peer["problem"]):  # a peer's export problem is in its own verdict
            verdict = _write_into(process_index, q, devices, peer["handles"], module)
    client.key_value_set(f"fo_jax/ipc_probe/verdict/{process_index}", verdict or "ok")
    verdicts = [(verdict or "ok") if q == process_index else
                str(client.blocking_key_value_get(f"fo_jax/ipc_probe/verdict/{q}", timeout_ms))
                for q in range(process_count)]
    if devices:
        module.ipc_probe_release()
    return next((v for v in verdicts if v != "ok"), "")


def _write_into(process_index: int, peer: int, devices: Sequence[int], handles: Sequence[str],
                module) -> str:
    """ipc_probe's writes from each of this process's GPUs into each of a peer's probe buffers
    (handles in hex): "" when every word came back, else the first problem."""
    for i, d in enumerate(devices):
        for handle in handles:
            try:
                why = module.ipc_probe_try(d, bytes.fromhex(handle), process_index,
                                           _probe_word(process_index, i))
            except Exception as e:  # noqa: BLE001 - becomes this process's verdict
                why = f"{type(e).__name__}: {e}"
            if why:
                return (f"GPU {d} of process {process_index} cannot write into the GPU memory "
                        f"of process {peer} through CUDA IPC: {why}")
    return ""


def process_ipc_problem() -> Optional[str]:
    """ipc_probe for this program's processes, once per process: None when every pair passed,
    else the problem (warned once: the program then runs on NCCL). Within without_exchanges()
    only what an earlier probe found (None before it: pending_note() says so)."""
    global _ipc
    with _lock:
        if _ipc is None and not _no_exchange.get():
            # Only when probing (and _transport imports this module).
            from fo_jax import _cuda, _transport  # noqa: PLC0415

            _ipc = ipc_probe(jax.process_index(), jax.process_count(), _client(),
                             _transport._local_gpu_ordinals(), _cuda.module())
            if _ipc:
                warnings.warn(f"fo_jax: the copy engine across processes: {_ipc}; the calls "
                              "take the NCCL transport (OverlapConfig(copy_engine_multiprocess="
                              "False) skips this probe)", stacklevel=2)
        return _ipc or None


def allocator_problem(environ=os.environ) -> Optional[str]:
    """Why JAX's allocator settings keep this process's XLA buffers out of one allocation that
    its peer processes can map once (the copy-engine all-reduce and all-gather write into
    them), or None."""
    allocator = environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    if allocator not in ("default", "bfc"):
        return (f"XLA_PYTHON_CLIENT_ALLOCATOR={allocator}: XLA's buffers are not one "
                "preallocated pool")
    if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "") in ("false", "False", "0"):
        return ("JAX's memory preallocation is off (XLA_PYTHON_CLIENT_PREALLOCATE=false): XLA's "
                "pool grows by allocations that the peers would have to map call by call")
    return None


def _pool_export_problem() -> Optional[str]:
    """The export of the allocation that holds a small XLA buffer on this process's first GPU,
    as the all-reduce's and all-gather's first calls export their outputs': None when it
    works."""
    import jax.numpy as jnp  # noqa: PLC0415

    from fo_jax import _cuda  # noqa: PLC0415

    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    if not gpus:
        return "this process has no CUDA GPU"
    try:
        with jax.ensure_compile_time_eval():  # a real buffer, also while a call is traced
            buffer = jax.device_put(jnp.zeros(8, jnp.float32), gpus[0])
            buffer.block_until_ready()
        why = _cuda.module().xla_pool_export_problem(buffer.unsafe_buffer_pointer())
    except Exception as e:  # noqa: BLE001 - becomes the answer
        why = f"{type(e).__name__}: {e}"
    return why or None


def xla_pool_problem() -> Optional[str]:
    """Why this process's peers could not map its XLA memory for the copy-engine all-reduce or
    all-gather, or None: allocator_problem, then a trial export. Once per process; asks no other
    process (the processes of one program share their JAX settings, and plan agreement catches
    any that do not)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = allocator_problem() or _pool_export_problem() or ""
        return _pool or None


@contextlib.contextmanager
def without_exchanges():
    """Within it process_hosts and process_ipc_problem exchange nothing with the other
    processes and answer from what this process already knows (for describe(), which a program
    may call in one process only, where an exchange would wait for processes that never join
    it): before the first lowering has exchanged the hosts and probed CUDA IPC,
    multiprocess_problem assumes both allow the copy engine, and pending_note() says so."""
    token = _no_exchange.set(True)
    try:
        yield
    finally:
        _no_exchange.reset(token)


def pending_note(process_count: int) -> str:
    """What a copy-engine answer given without_exchanges() still depends on, or ""."""
    if process_count == 1 or (_hosts is not None and _ipc is not None):
        return ""
    return (f"; with {process_count} processes it holds if the first lowering finds them all on "
            "this host and its CUDA IPC probe passes (else NCCL, with a warning); not yet "
            "checked in this process")


def hosts_problem(hosts: Sequence[str]) -> Optional[str]:
    """Why processes on these hosts cannot share GPU memory, or None (one host)."""
    names = sorted(set(hosts))
    if len(names) <= 1:
        return None
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return (f"the program's {len(hosts)} processes span {len(names)} hosts ({shown}); CUDA IPC "
            "maps memory only between processes of one host")


def local_device_count() -> int:
    """The devices this process drives (a test stands in for it)."""
    return jax.local_device_count()


def multiprocess_problem(collective: str, process_count: int, config: Optional[OverlapConfig],
                         hosts: Callable[[], Optional[Sequence[str]]] = process_hosts,
                         ipc: Callable[[], Optional[str]] = process_ipc_problem,
                         pool: Callable[[], Optional[str]] = xla_pool_problem
                         ) -> Optional[str]:
    """Why the copy-engine transport cannot take a `collective` call of a program running
    `process_count` JAX processes, or None. One process: None (nothing to check here)."""
    if process_count == 1:
        return None
    if collective not in IPC_COLLECTIVES:
        return (f"with {process_count} processes the copy-engine transport has no {collective}")
    if config is not None and not config.copy_engine_multiprocess:
        return (f"with {process_count} processes the copy engine (CUDA IPC between the "
                "processes) was turned off: OverlapConfig(copy_engine_multiprocess=False)")
    name = collective.replace("_", "-")
    into_xla = collective in XLA_COLLECTIVES
    if into_xla:
        if config is None or config.transport != "copy_engine":
            return (f"with {process_count} processes the copy-engine {name} "
                    f"({_WHAT_INTO_XLA[collective]}) is opt-in: "
                    "OverlapConfig(transport='copy_engine')")
        # Its peer mappings and per-call table serve one rank per process.
        count = local_device_count()
        if count > 1:
            return (f"the copy-engine {name} across processes runs one GPU per process; this "
                    f"process drives {count} (launch one process per GPU, or take NCCL)")
    known_hosts = hosts()
    if known_hosts is None:  # not exchanged yet (without_exchanges): pending_note() says so
        return None
    problem = hosts_problem(known_hosts)
    if problem is not None:
        return problem
    problem = ipc()
    if problem is not None:
        return f"the CUDA IPC probe between the processes failed: {problem}"
    if into_xla:
        problem = pool()
        if problem is not None:
            verb = "stores into" if collective == "all_reduce" else "writes into"
            return (f"the copy-engine {name} across processes {verb} the peers' XLA "
                    f"memory, which they could not map from this process: {problem}")
    return None
