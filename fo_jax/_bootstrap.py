"""Communicator bootstrap at lowering time: which rank of which tensor-parallel group each mesh
device is, and one NCCL unique id per group.

The lowering of an overlapped call sees the concrete mesh of the enclosing shard_map. Each group
is the set of devices that differ only in their coordinate along the reduced axis (a 2x2
data x tensor mesh gives two groups). fo_jax creates its own communicator per group, never one
that XLA's collectives use. Unique ids: one process (all local devices) generates them itself;
with one process per GPU (after jax.distributed.initialize) the process owning a group's rank 0
generates the id and publishes it through JAX's distributed key-value store, the others read it.
Ids are cached per (group devices, NCCL CTA bound), so every call on the same group reuses one
communicator; the copy-engine transport asks with bound 0 (it runs no NCCL collective but its
address exchange), so it has one communicator per group whatever the shape's NCCL settings.
The lowered call names its group's id by a token (group_token), not by the id: the id is new in
every run, the token is not, so the compiled module is the same in every run and JAX's
persistent compilation cache can hit; lowering registers the id under its token in the CUDA
module, where the handler looks it up.

Plan agreement: with one process per GPU every process plans on its own (its tuning cache, its
environment, its CUDA module), and ranks that run different plans hang or sum garbage. So each
overlapped call's lowering publishes its plan's fields through the same key-value store, under
the call's identity (what the program fixes alike on every process: group, collective, axis
size, operands, explicit OverlapConfig fields), and compares them with every other process of
the group, raising on every process, within FO_JAX_PLAN_TIMEOUT_S, with the differing fields
(docs/troubleshooting.md, "Plan mismatch"; docs/design.md, "Plan agreement").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

from fo_jax import _failure_watch

GROUP_TOKEN_BYTES = 32  # csrc/comm/group_ids.h kGroupTokenBytes
_lock = threading.Lock()
_unique_ids: dict = {}
_unconfirmed: list = []  # (client, peer's plan key, own fields, process, peer, call): see below
_KV_TIMEOUT_MS = 300_000
_POLL_MS = 100  # how often a process waiting for a peer's plan looks whether the peer waits too
_WARN_AFTER_S = 10.0  # a wait for a peer's plan this long is logged, naming the peer
log = logging.getLogger("fo_jax")


def concrete_mesh_of(axis_context, fn: str):
    """The concrete Mesh a lowering runs under, or a ValueError saying how to provide one."""
    mesh = getattr(axis_context, "mesh", None)
    if mesh is not None and getattr(mesh, "devices", None) is not None:
        return mesh
    try:  # an abstract shard_map mesh with a concrete mesh set in context (jax.set_mesh)
        from jax._src.mesh import get_concrete_mesh

        concrete = get_concrete_mesh()
        if concrete is not None and not concrete.empty:
            return concrete
    except ImportError:
        pass
    raise ValueError(
        f"{fn}: the CUDA path needs the concrete device mesh at lowering time; call it inside "
        "jax.shard_map(..., mesh=jax.sharding.Mesh(...)) or under jax.set_mesh(mesh)")


def group_table(devices: np.ndarray, axis: int) -> list:
    """Rows = tensor-parallel groups, columns = ranks along `axis` of the mesh device array."""
    moved = np.moveaxis(np.asarray(devices, dtype=object), axis, -1)
    return [list(row) for row in moved.reshape(-1, moved.shape[-1])]


def _owner_process(group: Sequence) -> int:
    return int(group[0].process_index)


def current_distributed_client():
    """JAX's distributed client now: None before `jax.distributed.initialize()` and after
    `jax.distributed.shutdown()`."""
    from jax._src import distributed  # noqa: PLC0415

    return distributed.global_state.client


def _distributed_client():
    client = current_distributed_client()
    if client is None:
        raise RuntimeError("fo_jax: several JAX processes but no distributed client; call "
                           "jax.distributed.initialize() first")
    return client


def communicator_ctas(plan) -> int:
    """The NCCL CTA bound that names the communicator of an overlap plan: the plan's bound on the
    NCCL transport; 0 on the copy-engine transport, whose communicator runs no NCCL collective
    but its address exchange (csrc/comm/overlap_call.cc keys its communicator alike)."""
    return int(plan.nccl_max_ctas) if plan.transport == "nccl" else 0


def plan_fields(plan, operands: Sequence = ()) -> dict:
    """What shapes an overlapped call, flat and JSON-able: every field of the plan (the GEMM
    plan's as "gemm.<field>") and each operand's shape and dtype. Two processes of one group must
    agree on all of it."""
    fields = {}
    for name, value in dataclasses.asdict(plan).items():
        if isinstance(value, dict):
            fields.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            fields[name] = value
    for i, aval in enumerate(operands):
        fields[f"operand{i}"] = _operand(aval)
    return json.loads(json.dumps(fields, default=str))  # tuples as lists, as the peers read them


def _operand(aval) -> str:
    return f"{getattr(aval, 'dtype', '?')}{list(getattr(aval, 'shape', ()))}"


def explicit_config(config) -> tuple:
    """The OverlapConfig fields the user set (those that differ from the defaults), as sorted
    (name, value) pairs: hashable, so that they travel through jit as a static parameter."""
    if config is None:
        return ()
    return tuple((f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                 if getattr(config, f.name) != f.default)


def call_identity(plan, operands: Sequence = (), explicit: Sequence = ()) -> dict:
    """What names an overlapped call the same way on every process, by construction of the
    program: its collective, axis size, operands and the OverlapConfig fields set explicitly
    (`explicit_config`). Unlike plan_fields, nothing in it depends on a process's tuning cache,
    environment or CUDA module."""
    identity = dict(collective=plan.collective, axis_size=int(plan.axis_size),
                    operands=[_operand(a) for a in operands], config=dict(explicit))
    return json.loads(json.dumps(identity, sort_keys=True, default=str))


def plan_digest(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _differences(mine: dict, theirs: dict, there: str) -> list:
    return [f"{name}: {mine.get(name, '<absent>')!r} here, {theirs.get(name, '<absent>')!r} "
            f"{there}" for name in sorted(set(mine) | set(theirs))
            if mine.get(name) != theirs.get(name)]


def plan_mismatch(mine: dict, theirs: dict, process: int, other: int,
                  call: str = "") -> Optional[str]:
    """None when the two processes' plan fields agree, else a message naming each differing
    field with both values (and the call, `call`, when given)."""
    diffs = _differences(mine, theirs, f"on process {other}")
    if not diffs:
        return None
    call = f" {call}" if call else ""
    return (f"fo_jax.overlapped_matmul: plan mismatch between process {process} and process "
            f"{other} for the same overlapped call{call}: " + "; ".join(diffs) + ". Every "
            "process must plan alike: give them the same tuning cache (XDG_CACHE_HOME), the same "
            "FO_JAX_* environment and the same CUDA module, or set the differing fields "
            "explicitly in OverlapConfig (docs/troubleshooting.md, 'Plan mismatch')")


def _try_get(client, key: str) -> Optional[str]:
    try:
        return client.key_value_try_get(key)
    except Exception:  # noqa: BLE001 (absent: the store's not-found error type varies by version)
        return None


def _publish(client, key: str, value: str, what: str) -> None:
    """Sets this process's `key` once: re-lowering the same call publishes the same value again,
    which is a no-op (the store refuses to overwrite a key); a different value for the same call
    means this process's own planning changed between two lowerings (e.g. a tuning cache
    written meanwhile), which no peer can agree with."""
    with _lock:  # one process's lowerings on several threads publish one after the other
        before = _try_get(client, key)
        if before is None:
            client.key_value_set(key, value)
            return
    if before != value:
        diffs = _differences(json.loads(value), json.loads(before), "at an earlier lowering")
        raise ValueError(
            f"fo_jax.overlapped_matmul: this process planned the same overlapped call ({what}) "
            f"differently at two lowerings: {'; '.join(diffs)}. Its tuning cache or FO_JAX_* "
            "environment changed while it ran; set the differing fields explicitly in "
            "OverlapConfig or keep the cache and environment fixed while the program runs "
            "(docs/troubleshooting.md, 'Plan mismatch')")


def _wait_for_plan(client, base: str, call: str, what: str, process_index: int, other: int,
                   deadline: float, timeout_s: float, fields: dict) -> Optional[str]:
    """The plan `other` published for this call, or None when waiting for it would deadlock:
    `other` waits (or gave up waiting) for a call this process has not lowered (each lowered a
    call the other does not, or they lowered shared calls in another order), so neither would go
    on. Raises RuntimeError once `timeout_s` has passed with `other` silent."""
    warned = False
    started = time.monotonic()
    while True:
        try:
            return client.blocking_key_value_get(f"{base}/{call}/{other}", _POLL_MS)
        except Exception:  # noqa: BLE001 (the store's timeout error type varies by version)
            pass
        awaited = _try_get(client, f"{base}/waiting/{other}") or ""
        if awaited and awaited != call and _try_get(client, f"{base}/{awaited}/{process_index}") \
                is None:
            return None
        now = time.monotonic()
        if now >= deadline:
            raise RuntimeError(
                f"fo_jax.overlapped_matmul: process {other} published no plan for the "
                f"overlapped call {what} on devices {base.rsplit('/', 1)[-1]} within "
                f"{timeout_s:g} s "
                "(FO_JAX_PLAN_TIMEOUT_S): it lowered no such call (e.g. it took the reference "
                "path: FO_JAX_FORCE_REFERENCE, no CUDA module; or its OverlapConfig or operands "
                f"differ) or stopped; this process's plan: {fields}")
        if not warned and now - started >= _WARN_AFTER_S:
            warned = True
            log.warning("fo_jax.overlapped_matmul: waiting for process %d to lower the "
                        "overlapped call %s too; raising after %g s (FO_JAX_PLAN_TIMEOUT_S)",
                        other, what, timeout_s)


def _recheck_unconfirmed(client) -> None:
    """Compares the plans this process left unconfirmed with the peer's, now that the peer may
    have published them: a mismatch found there raises here too, at this later lowering."""
    with _lock:
        mine = [u for u in _unconfirmed if u[0] is client]
    for entry in mine:
        _, key, fields, process_index, other, what = entry
        text = _try_get(client, key)
        if text is None:
            continue
        with _lock:
            if entry in _unconfirmed:
                _unconfirmed.remove(entry)
        mismatch = plan_mismatch(fields, json.loads(text), process_index, other, what)
        if mismatch is not None:
            raise ValueError(mismatch)


def check_plan_agreement(group: Sequence, fields: dict, process_index: int, timeout_s: float,
                         client=None, identity: Optional[dict] = None) -> None:
    """Publishes this process's plan fields for one overlapped call on the group and compares
    them with every other process of the group; raises ValueError on a mismatch (every process
    sees it, so all of them raise) or RuntimeError when a process published nothing within
    `timeout_s` (it lowered no such call: e.g. it took the reference path).

    The call is named by `identity` (call_identity: what every process fixes alike), so the
    check does not depend on how many or in which order the processes lower their calls:
    re-lowering a call publishes nothing new, and a call lowered on one process only (a
    `.lower()` for inspection) is left unconfirmed, without waiting for the timeout, as soon as
    the other process waits for a call this one has not lowered yet; the peer compares it if it
    lowers it, and so does this process at its next overlapped lowering (docs/design.md, "Plan
    agreement")."""
    devs = "-".join(str(int(d.id)) for d in group)
    processes = sorted({int(d.process_index) for d in group})
    if len(processes) < 2 or process_index not in processes:
        return
    identity = {} if identity is None else identity
    call = plan_digest(identity)
    what = json.dumps(identity, sort_keys=True)
    client = _distributed_client() if client is None else client
    _recheck_unconfirmed(client)
    base = f"fo_jax/plan/{devs}"
    _publish(client, f"{base}/{call}/{process_index}", json.dumps(fields, sort_keys=True), what)
    others = [p for p in processes if p != process_index]
    deadline = time.monotonic() + timeout_s
    mismatch, unconfirmed = None, []
    # "waiting": the call this process last waited for. Left set when it gives up waiting (the
    # peer waits for another call), so that a peer that saw it waiting does not wait for a call
    # this process never lowers; cleared when the wait ends with every plan read.
    client.key_value_set(f"{base}/waiting/{process_index}", call, allow_overwrite=True)
    try:
        for other in others:
            text = _wait_for_plan(client, base, call, what, process_index, other, deadline,
                                  timeout_s, fields)
            if text is None:
                unconfirmed.append(other)
                with _lock:
                    _unconfirmed.append((client, f"{base}/{call}/{other}", fields, process_index,
                                         other, what))
            else:
                mismatch = mismatch or plan_mismatch(fields, json.loads(text), process_index,
                                                     other, what)
    finally:
        if not unconfirmed:
            client.key_value_set(f"{base}/waiting/{process_index}", "", allow_overwrite=True)
    if unconfirmed:
        log.warning("fo_jax.overlapped_matmul: the plan of the overlapped call on devices %s "
                    "(%s) is not confirmed by process(es) %s, which wait(s) for another call "
                    "first: this process lowers a call they do not, or lowers shared calls in "
                    "another order; they compare it if they lower it, this process at its next "
                    "overlapped lowering", devs, what, unconfirmed)
    # Before anyone raises (and its process, perhaps the one serving the store, exits): every
    # process has read every plan, so that each reports the mismatch itself. Best effort: a
    # process gone by now has read them already; one that left the call unconfirmed does not
    # wait (the others may never lower it).
    try:
        _publish(client, f"{base}/{call}/read/{process_index}", "1", what)
        for other in others:
            if other not in unconfirmed:
                client.blocking_key_value_get(f"{base}/{call}/read/{other}",
                                              int(max(deadline - time.monotonic(), 1.0) * 1000))
    except Exception:  # noqa: BLE001 (each process reports its own outcome)
        pass
    if mismatch is not None:
        raise ValueError(mismatch)


def _group_name(group: Sequence, nccl_max_ctas: int) -> str:
    """What names a group's communicator (its CTA bound and devices' ids), e.g. "0/4-5-6-7": the
    key of its NCCL unique id in JAX's key-value store and the source of its token."""
    return "%d/%s" % (int(nccl_max_ctas), "-".join(str(int(d.id)) for d in group))


def _unique_id(group: Sequence, nccl_max_ctas: int, process_index: int, process_count: int,
               make_id: Callable[[], bytes]) -> bytes:
    key = (tuple(int(d.id) for d in group), int(nccl_max_ctas))
    with _lock:
        uid = _unique_ids.get(key)
        if uid is not None:
            return uid
        if process_count == 1:
            uid = make_id()
        else:
            client = _distributed_client()
            kv_key = "fo_jax/nccl_unique_id/" + _group_name(group, nccl_max_ctas)
            if _owner_process(group) == process_index:
                uid = make_id()
                client.key_value_set(kv_key, uid.hex())
            else:
                uid = bytes.fromhex(client.blocking_key_value_get(kv_key, _KV_TIMEOUT_MS))
            # A failure of this group in one process ends the others' waits for it.
            _failure_watch.watch(client, uid, process_index)
        _unique_ids[key] = uid
        return uid


def group_token(group: Sequence, nccl_max_ctas: int) -> bytes:
    """The 32 bytes that name a group's communicator in the lowered call (csrc/comm/group_ids.h):
    a digest of what keys its NCCL unique id here (its devices' ids and the communicator's CTA
    bound), the same in every run, so the compiled module is too and the persistent compilation
    cache can hit; the unique id itself is new in every run and reaches the handler through
    `register_id` at lowering."""
    return hashlib.sha256(("fo_jax/group/" + _group_name(group, nccl_max_ctas)).encode()).digest()


def mesh_attributes(mesh, axis_name: str, nccl_max_ctas: int, process_index: int,
                    process_count: int, make_id: Callable[[], bytes],
                    register_id: Optional[Callable[[bytes, bytes], None]] = None) -> dict:
    """The overlap call's attributes that describe the mesh (csrc/ffi/plan_attrs.h): `mesh`, a
    struct with one row per mesh device (its process, local ordinal, rank along `axis_name` and
    tensor-parallel group) and this process's index, and `group_tokens`, 32 bytes per group
    (group_token; zeros for the groups this process takes no part in). Each of this process's
    groups gets its NCCL unique id (made by `make_id`, or by the group's first process), passed
    with its token to `register_id` (the CUDA module's registry, which the handler reads)."""
    axis = list(mesh.axis_names).index(axis_name)
    groups = group_table(mesh.devices, axis)
    procs, locals_, ranks, group_ids = [], [], [], []
    tokens = bytearray()
    for g, group in enumerate(groups):
        if any(int(d.process_index) == process_index for d in group):
            uid = _unique_id(group, nccl_max_ctas, process_index, process_count, make_id)
            token = group_token(group, nccl_max_ctas)
            if register_id is not None:
                register_id(token, uid)
            tokens += token
        else:
            tokens += bytes(GROUP_TOKEN_BYTES)
        for r, d in enumerate(group):
            procs.append(int(d.process_index))
            locals_.append(int(d.local_hardware_id if d.local_hardware_id is not None else d.id))
            ranks.append(r)
            group_ids.append(g)
    as_i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    return dict(
        mesh=dict(
            process=np.int32(process_index),
            device_process=as_i32(procs),
            device_ordinal=as_i32(locals_),
            device_rank=as_i32(ranks),
            device_group=as_i32(group_ids),
        ),
        group_tokens=np.frombuffer(bytes(tokens), dtype=np.uint8),
    )


def overlap_mesh_attributes(mesh, axis_name: str, plan, operands: Sequence, process_index: int,
                            process_count: int, make_id: Callable[[], bytes],
                            explicit: Sequence = (),
                            register_id: Optional[Callable[[bytes, bytes], None]] = None) -> dict:
    """mesh_attributes for an overlapped call's lowering, with the communicator named as
    `communicator_ctas` says; with several processes, first checks that every process of each
    group this process takes part in runs the same plan (check_plan_agreement; `explicit`: the
    call's OverlapConfig fields set explicitly, as explicit_config gives them)."""
    axis = list(mesh.axis_names).index(axis_name)
    if process_count > 1:
        from fo_jax import _env  # noqa: PLC0415

        fields = plan_fields(plan, operands)
        identity = call_identity(plan, operands, explicit)
        for group in group_table(mesh.devices, axis):
            check_plan_agreement(group, fields, process_index, _env.plan_timeout_s(),
                                 identity=identity)
    return mesh_attributes(mesh, axis_name, communicator_ctas(plan), process_index,
                           process_count, make_id, register_id)
