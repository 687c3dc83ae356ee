"""Whether the copy-engine transport may take a call whose ranks live in several JAX processes
(one process per GPU), and why not (docs/design.md, "Copy engine across processes").

With several processes the copy engine reaches a peer's memory through CUDA IPC: each process
exports what fo_jax itself allocated (receive buffers, flag words) and the peers map it
(csrc/comm/peer_memory_ipc.h). That covers the reduce-scatter, direct form and ring: every byte
it sends lands in fo_jax-owned memory. The all-reduce (and any collective whose copy-engine form
stores into the peers' outputs) writes into each peer's per-call XLA output buffer, whose
address means nothing in another process (XLA does not export its allocations over IPC), so it
keeps NCCL there. CUDA IPC reaches only GPUs of one host: every process must be on this host.

Opt-in: the choice is made at lowering, before any process has tried to map its peers' memory,
and a pair that cannot (no peer access; perhaps a GPU hidden by CUDA_VISIBLE_DEVICES, untested)
fails the call on every rank rather than falling back to NCCL; so with several processes the
path is taken only with OverlapConfig(copy_engine_multiprocess=True). The rule gives the same
answer in every process (it reads only the config, the collective and the hosts
that every process publishes), and plan agreement (fo_jax/_bootstrap.py) checks that the plans
agree.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable, Optional, Sequence

import jax

from fo_jax import _env
from fo_jax.config import OverlapConfig

# Collectives whose copy-engine form writes only into fo_jax-owned peer memory.
IPC_COLLECTIVES = ("reduce_scatter",)

_lock = threading.Lock()
_hosts: Optional[tuple] = None  # every process's host name, by process index (published once)


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


def process_hosts() -> tuple:
    """exchange_hosts for this program, once per process."""
    global _hosts
    with _lock:
        if _hosts is None:
            _hosts = exchange_hosts(jax.process_index(), jax.process_count(), _client())
        return _hosts


def hosts_problem(hosts: Sequence[str]) -> Optional[str]:
    """Why processes on these hosts cannot share GPU memory, or None (one host)."""
    names = sorted(set(hosts))
    if len(names) <= 1:
        return None
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return (f"the program's {len(hosts)} processes span {len(names)} hosts ({shown}); CUDA IPC "
            "maps memory only between processes of one host")


def multiprocess_problem(collective: str, process_count: int, config: Optional[OverlapConfig],
                         hosts: Callable[[], Sequence[str]] = process_hosts) -> Optional[str]:
    """Why the copy-engine transport cannot take a `collective` call of a program running
    `process_count` JAX processes, or None. One process: None (nothing to check here)."""
    if process_count == 1:
        return None
    if collective not in IPC_COLLECTIVES:
        return (f"with {process_count} processes the copy-engine {collective} would store into "
                "the peers' per-call XLA output buffers, whose addresses mean nothing in another "
                "process (XLA does not export its allocations over CUDA IPC); only the "
                "reduce-scatter, which writes into fo_jax's own IPC-exported buffers, can cross "
                "processes")
    if config is None or not config.copy_engine_multiprocess:
        return (f"with {process_count} processes the copy engine (CUDA IPC between the "
                "processes) is opt-in, since a GPU pair that cannot map the other's memory then "
                "fails the call instead of falling back to NCCL: pass "
                "OverlapConfig(copy_engine_multiprocess=True) to use it")
    return hosts_problem(hosts())
