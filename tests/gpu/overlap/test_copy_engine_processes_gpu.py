"""The copy-engine reduce-scatter, all-reduce and overlapped all-gather with one JAX process per
GPU (CUDA IPC between the processes, the default on one host for the reduce-scatter,
OverlapConfig.copy_engine_multiprocess; docs/design.md, "Copy engine across processes"):
tests/workers/ipc_worker.py runs the cases of tests/workers/ipc_cases.py in one process per GPU,
and each process's shard must equal, bit for bit, what the single-process copy engine computes
here from the same operands with the same plan (the ring and the direct form, before and after
the receive buffers grow; the all-reduce, whose band sums store into the peers' mapped XLA
memory, in one round and in rounds; the all-gather, whose rows go into the peers' mapped XLA
memory through a per-call table in shared memory: each process's columns of the product). The
worker also runs the NCCL all-reduce and all-gather. tests/workers/ipc_probe_worker.py runs the
lowering-time CUDA IPC probe, with every GPU visible to every process and with each process
seeing only its own; tests/workers/describe_one_process_worker.py calls describe() in one process
only."""

import os
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import gpu_devices_or_skip, tp_or_skip
from numerics import assert_close
from test_overlap_gpu import _one_process_per_gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                                "workers"))
from ipc_cases import (AG_CASES, AR_CASES, CASES, ag_config, ag_fn, ag_operands,  # noqa: E402
                       ar_config, config, operands)

pytestmark = pytest.mark.gpu


def test_copy_engine_across_processes_matches_one_process(tmp_path):
    tp = tp_or_skip()
    outs = _one_process_per_gpu("ipc_worker.py",
                                "the copy engine across processes hung",
                                FO_JAX_IPC_OUT=str(tmp_path))
    for i, (returncode, out) in enumerate(outs):
        assert returncode == 0, f"process {i} failed:\n{out[-3000:]}"
        assert "WORKER OK" in out, out[-3000:]
    mesh = Mesh(np.array(gpu_devices_or_skip(tp)), ("tp",))
    for seed, (name, m, n, k_rank, ring) in enumerate(CASES):
        x, w, ref = operands(m, n, k_rank, tp, seed)
        f = jax.jit(jax.shard_map(
            lambda a, b, r=ring: fo_jax.overlapped_matmul(
                a, b, axis_name="tp", config=config(r)),
            mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None)))
        out = f(jnp.asarray(x), jnp.asarray(w))
        assert_close(out, ref, jnp.bfloat16)
        bits = np.asarray(out).view(np.uint16)
        band = m // tp
        for proc in range(tp):
            theirs = np.load(tmp_path / f"{name}_{proc}.npy")
            mine = bits[proc * band:(proc + 1) * band]
            assert np.array_equal(theirs, mine), (
                f"{name}: process {proc}'s band differs from the single-process copy engine in "
                f"{int((theirs != mine).sum())} of {mine.size} elements")
    for seed, (name, m, n, k_rank, rounds) in enumerate(AR_CASES, start=len(CASES)):
        x, w, ref = operands(m, n, k_rank, tp, seed)
        f = jax.jit(jax.shard_map(
            lambda a, b, r=rounds: fo_jax.overlapped_matmul(
                a, b, axis_name="tp", collective="all_reduce", config=ar_config(r)),
            mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))
        out = f(jnp.asarray(x), jnp.asarray(w))
        assert_close(out, ref, jnp.bfloat16)
        mine = np.asarray(out).view(np.uint16)
        for proc in range(tp):
            theirs = np.load(tmp_path / f"{name}_{proc}.npy")
            assert np.array_equal(theirs, mine), (
                f"{name}: process {proc}'s output differs from the single-process copy engine "
                f"in {int((theirs != mine).sum())} of {mine.size} elements")
    start = len(CASES) + len(AR_CASES)
    for seed, (name, rows, n, k, bands) in enumerate(AG_CASES, start=start):
        x, w, ref = ag_operands(rows, n, k, tp, seed)
        y, _ = ag_fn(mesh, ag_config(bands))(jnp.asarray(x), jnp.asarray(w))
        assert_close(y, ref, jnp.bfloat16)
        bits = np.asarray(y).view(np.uint16)
        for proc in range(tp):
            theirs = np.load(tmp_path / f"{name}_{proc}.npy")
            mine = bits[:, proc * n:(proc + 1) * n]
            assert np.array_equal(theirs, mine), (
                f"{name}: process {proc}'s columns differ from the single-process copy engine "
                f"in {int((theirs != mine).sum())} of {mine.size} elements")


@pytest.mark.parametrize("hide", [False, True], ids=["all_gpus_visible", "own_gpu_only"])
def test_the_ipc_probe_chooses_one_transport_for_every_process(hide):
    """Every process lowers the reduce-scatter (default config) to the same transport, from the
    same probe verdict, and computes it right; turned off, it lowers to NCCL. With every GPU
    visible (peer access on these machines) the probe passes and the copy engine runs; with
    each process seeing only its own GPU (CUDA_VISIBLE_DEVICES) either outcome is allowed, and
    the test reports which."""
    tp_or_skip()
    env = {"FO_JAX_HIDE_OTHER_GPUS": "1"} if hide else {}
    outs = _one_process_per_gpu("ipc_probe_worker.py", "the CUDA IPC probe hung", **env)
    lines = []
    for i, (returncode, out) in enumerate(outs):
        assert returncode == 0, f"process {i} failed:\n{out[-3000:]}"
        assert "WORKER OK" in out, out[-3000:]
        lines.append(re.search(r"PROBE (.*)", out).group(1))
    assert len(set(lines)) == 1, lines
    if hide:
        warnings.warn(f"CUDA IPC probe with each process seeing only its GPU: {lines[0]}",
                      stacklevel=1)
    else:
        assert lines[0] == "transport copy_engine, verdict ''", lines[0]


def test_describe_in_one_process_asks_the_others_nothing():
    """Process 0 alone calls describe() before any overlapped call is traced, while the others
    wait for it (describe_one_process_worker.py): it answers without an exchange (which would
    wait for keys the others publish only afterwards, up to FO_JAX_PLAN_TIMEOUT_S=20 here, and
    then fail), and the call that follows takes the copy engine in every process."""
    tp_or_skip()
    outs = _one_process_per_gpu("describe_one_process_worker.py",
                                "describe() in one process waited for the others",
                                FO_JAX_PLAN_TIMEOUT_S="20")
    for i, (returncode, out) in enumerate(outs):
        assert returncode == 0, f"process {i} failed:\n{out[-3000:]}"
        assert "WORKER OK" in out, out[-3000:]
    assert "DESCRIBE answered" in outs[0][1], outs[0][1][-3000:]
