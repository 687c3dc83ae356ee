"""Communicator bootstrap at lowering time: which rank of which tensor-parallel group each mesh
device is, and one NCCL unique id per group.

The lowering of an overlapped call sees the concrete mesh of the enclosing shard_map. Each group
is the set of devices that differ only in their coordinate along the reduced axis (a 2x2
data x tensor mesh gives two groups). fo_jax creates its own communicator per group, never one
that XLA's collectives use. Unique ids: one process (all local devices) generates them itself;
with one process per GPU (after jax.distributed.initialize) the process owning a group's rank 0
generates the id and publishes it through JAX's distributed key-value store, the others read it.
Ids are cached per (group devices, NCCL CTA bound), so every call on the same group reuses one
communicator.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

_lock = threading.Lock()
_unique_ids: dict = {}
_KV_TIMEOUT_MS = 300_000


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
            from jax._src import distributed

            client = distributed.global_state.client
            if client is None:
                raise RuntimeError(
                    "fo_jax: several JAX processes but no distributed client; call "
                    "jax.distributed.initialize() first")
            kv_key = "fo_jax/nccl_unique_id/%d/%s" % (key[1], "-".join(map(str, key[0])))
            if _owner_process(group) == process_index:
                uid = make_id()
                client.key_value_set(kv_key, uid.hex())
            else:
                uid = bytes.fromhex(client.blocking_key_value_get(kv_key, _KV_TIMEOUT_MS))
        _unique_ids[key] = uid
        return uid


def mesh_attributes(mesh, axis_name: str, nccl_max_ctas: int, process_index: int,
                    process_count: int, make_id: Callable[[], bytes]) -> dict:
    """The overlap call's attributes that describe the mesh (csrc/ffi/plan_attrs.h): `mesh`, a
    struct with one row per mesh device (its process, local ordinal, rank along `axis_name` and
    tensor-parallel group) and this process's index, and `unique_ids`, 128 bytes per group
    (zeros for the groups this process takes no part in)."""
    axis = list(mesh.axis_names).index(axis_name)
    groups = group_table(mesh.devices, axis)
    procs, locals_, ranks, group_ids = [], [], [], []
    uids = bytearray()
    for g, group in enumerate(groups):
        mine = any(int(d.process_index) == process_index for d in group)
        uids += (_unique_id(group, nccl_max_ctas, process_index, process_count, make_id)
                 if mine else bytes(128))
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
        unique_ids=np.frombuffer(bytes(uids), dtype=np.uint8),
    )
