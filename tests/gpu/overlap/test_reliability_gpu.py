"""Reliability on GPUs (docs/troubleshooting.md, "Reliability limits"): flags across the 32-bit
epoch wrap give bit-identical results for every copy-engine form; one communicator and one
copy-engine state per group whatever the shapes' NCCL settings, with the receive buffer's
superseded allocations freed; a receive-buffer allocation failing on one rank fails the call on
every rank instead of hanging; the capture guard; plan agreement between processes on GPUs; the
progress watchdog's release of a stuck copy-engine GPU (one GPU), of a rank that stops calling
and of the peers of a killed process; NaN sums in every process when one process's NCCL-transport
GEMM launch fails."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import free_port, gpu_devices_or_skip, tp_or_skip
from numerics import assert_close, random_operands
from worker_processes import wait_all, with_stack_dumps

pytestmark = pytest.mark.gpu

WORKERS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "workers")
WRAP_START = 2**32 - 8
# The workers import the fo_jax this process imported (not another one installed).
_FO_JAX_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))


def _process_env(**env_extra) -> dict:
    """The environment of the worker processes: no preallocation (this process's JAX
    holds most of every GPU), no NVLink multicast, this fo_jax, no XLA_FLAGS."""
    env = with_stack_dumps(dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                                NCCL_NVLS_ENABLE="0", PYTHONPATH=_FO_JAX_ROOT, **env_extra))
    env.pop("XLA_FLAGS", None)
    return env


def _worker(name, n_gpus, timeout_s=300, args=(), **env_extra):
    """Runs tests/workers/<name> on the first n_gpus GPUs in a process of its own; returns
    (returncode, output) or fails the test if it hangs (its last output and Python stacks)."""
    env = _process_env(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(n_gpus)),
                       **env_extra)
    p = subprocess.Popen([sys.executable, os.path.join(WORKERS, name), *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return wait_all([p], timeout_s, f"{name} hung")[0]


def test_capture_guard_refuses_a_capturing_stream():
    gpu_devices_or_skip(1)
    message = fo_jax._cuda.module().capture_guard_message()
    assert "being captured into a CUDA graph" in message, message
    assert "fo_jax.overlapped_matmul" in message and "outside the captured region" in message


def test_epoch_wrap_gives_bit_identical_results():
    """H2: 32 calls of every copy-engine form from epoch 2^32 - 8 (crossing the wrap) give the
    same bits as from epoch 0. Unsigned comparisons would let the calls after the wrap read
    flags of the calls before it as set: wrong sums, or a store through a stale address."""
    gpu_devices_or_skip(2)
    n = min(4, len(jax.devices("gpu")))
    runs = {}
    for start in (0, WRAP_START):
        code, out = _worker("epoch_wrap_worker.py", n, FO_JAX_TEST_EPOCH_START=str(start))
        assert code == 0 and "WORKER OK" in out, out[-4000:]
        runs[start] = dict(re.findall(r"^FORM (\S+) (\S+)$", out, re.M))
        epochs = [int(e) for e in re.search(r"^EPOCHS (.*)$", out, re.M).group(1).split()]
        assert epochs and all(e == epochs[0] for e in epochs), out[-2000:]  # ranks in step
        if start == WRAP_START:
            assert epochs[0] < 2**31, epochs  # the count went past 2^32 and wrapped
    assert runs[0] and runs[0] == runs[WRAP_START], runs


def _ce_call(mesh, collective, m, n, k, config):
    rng = np.random.default_rng(m + n + k)
    tp = mesh.shape["tp"]
    x, w, x64, w64 = random_operands(rng, m, k * tp, n, jnp.bfloat16)
    f = jax.jit(jax.shard_map(
        lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=collective,
                                              config=config),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
        out_specs=P("tp", None) if collective == "reduce_scatter" else P()))
    out = f(x, w)
    assert_close(np.asarray(out.astype(jnp.float32), np.float64), x64 @ w64, jnp.bfloat16)


def test_one_communicator_per_group_and_freed_receive_buffers():
    """H5/H6: copy-engine calls at growing shapes with different NCCL CTA bounds share one
    communicator and one copy-engine state per GPU; each GPU holds one receive buffer (the
    superseded ones freed) and the report counts it."""
    from fo_jax import info

    tp = tp_or_skip()
    # Its own mesh of devices in reverse order: a group (unique id) no other test uses.
    mesh = Mesh(np.array(jax.devices("gpu")[:tp][::-1]), ("tp",))
    before = {c["group"] for c in info.device_resources()["communicators"]}
    for rows, ctas in [(1024, 8), (2048, 32), (4096, 16), (8192, 8)]:
        for collective in ("reduce_scatter", "all_reduce"):
            config = fo_jax.OverlapConfig(allow_fallback=False, transport="copy_engine",
                                          nccl_max_ctas=ctas)
            _ce_call(mesh, collective, rows * tp, 1024, 512, config)
    res = info.device_resources()
    mine = [c for c in res["communicators"] if c["group"] not in before]
    assert len(mine) == tp, mine  # one per GPU of the group, whatever nccl_max_ctas
    assert all(c["copy_engine"] and c["nccl_max_ctas"] == 0 for c in mine), mine
    assert len({c["group"] for c in mine}) == 1, mine
    recv = [r for r in res["memory"] if r["kind"] == "copy-engine receive buffer"]
    for d in {c["device"] for c in mine}:
        rows = [r for r in recv if r["device"] == d]
        assert rows and rows[0]["allocations"] == 1, rows  # only the newest is held
        assert rows[0]["freed_bytes"] > 0, rows  # it grew: the older ones were freed
        assert res["bytes_by_device"][d] >= rows[0]["bytes"] > 0
    assert any(line.startswith("held outside XLA") for line in info._resource_lines())


def test_receive_allocation_failure_fails_every_rank():
    """H1: the receive-buffer allocation of rank 1 fails (FO_JAX_TEST_FAIL=alloc:1): it still
    takes part in the address exchange, so every rank fails the call (XLA raises) instead of
    its peers waiting for it; the next call fails the same way, promptly."""
    gpu_devices_or_skip(2)
    code, out = _worker("alloc_failure_worker.py", 2, timeout_s=240,
                        FO_JAX_TEST_FAIL="alloc:1")
    assert code == 0 and "WORKER OK" in out, out[-4000:]
    assert out.count("RAISED") == 2, out[-4000:]
    assert "injected by FO_JAX_TEST_FAIL=alloc" in out or "rank 1 of the group" in out, out


def test_plan_agreement_across_gpu_processes():
    """H3 on GPUs: one process per GPU, the last with another num_groups (as another tuning-cache
    entry would give): every process raises 'plan mismatch' at lowering, none hangs."""
    gpu_devices_or_skip(2)
    nproc = 2
    port = free_port()
    env = _process_env(FO_JAX_PLAN_TIMEOUT_S="60")
    procs = [subprocess.Popen([sys.executable, os.path.join(WORKERS, "plan_agreement_worker.py"),
                               str(i), str(nproc), str(port), "gpu", str(4 if i else 2)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(nproc)]
    for i, (_, out) in enumerate(wait_all(procs, 180, "a process hung after a plan mismatch")):
        assert f"RAISED {i} ValueError" in out and "plan mismatch" in out, out[-3000:]


# (stage, form): every stage after the address exchange where a rank can fail, on the forms whose
# release differs (direct, by rows, ring, all-reduce rounds, NCCL, the all-gather); and "setup",
# creating the copy-engine state before the group's first exchange (its own state for the
# copy-engine all-gather).
_STAGES = [("graph", "rs_direct"), ("graph", "rs_ring"), ("graph", "ar_two_rounds"),
           ("graph", "ag_copy_engine"), ("launch", "rs_direct"), ("launch", "rs_rows"),
           ("launch", "rs_ring"), ("launch", "ar_two_rounds"), ("launch", "rs_nccl"),
           ("launch", "ar_nccl"), ("launch", "ag_copy_engine"), ("copy", "rs_direct"),
           ("copy", "rs_ring"), ("copy", "ar_two_rounds"), ("copy", "ag_copy_engine"),
           ("launch", "ag_nccl"), ("setup", "rs_direct"), ("setup", "ar_two_rounds"),
           ("setup", "ag_copy_engine")]


# The copy-engine forms whose released calls write NaNs on every GPU (the band sums, the ring
# GEMM's tiles that add a slot: failed_call.h); the all-gather's releases write NaN rows on the
# GPUs that waited for the failed rank's (all_gather_copy_engine.h); NCCL's write none.
_MARKED_FORMS = ("rs_direct", "rs_ring", "ar_two_rounds")


@pytest.mark.parametrize("stage,form", _STAGES)
def test_failure_after_the_exchange_fails_every_rank(stage, form):
    """H1: the last rank fails at `stage` on every call (FO_JAX_TEST_FAIL=<stage>:<rank>) after
    its peers may already wait for it (setup: before the group's first exchange, which its peers
    then wait in). It releases what they wait for, so no call hangs (each
    ends within 30 s); the failed group makes every later call raise, with the cause; the process
    then exits cleanly. A graph or launch failure raises in the failing call itself; the copy
    thread's, which runs after the handler returned, by the next call at the latest, and a
    copy-engine reduce-scatter (direct or ring) or all-reduce call that returns after it holds
    NaNs on every GPU (its release marks the calls it ends abandoned: failed_call.h), except
    that the ring's failing GPU may hold its right sum (below); every returned result is right
    or NaN on each GPU (checked against float64); a
    copy-engine all-gather call that returns after it holds NaN rows where the failed rank's rows
    go, in both results of every other GPU (its release fills them: EnqueueBandRelease)."""
    n = tp_or_skip()
    code, out = _worker("failure_stage_worker.py", n, timeout_s=240, args=(form,),
                        FO_JAX_TEST_FAIL=f"{stage}:{n - 1}")
    assert code == 0 and "WORKER OK" in out, out[-4000:]
    calls = re.findall(r"^CALL (\d+) (RAISED|RETURNED) (\S+)", out, re.M)
    assert [int(c) for c, _, _ in calls] == [0, 1, 2], out[-4000:]
    assert all(float(seconds) < 30 for _, _, seconds in calls), calls
    outcomes = [what for _, what, _ in calls]
    first = outcomes.index("RAISED") if "RAISED" in outcomes else len(outcomes)
    assert first <= (1 if stage == "copy" else 0), out[-4000:]
    assert all(what == "RAISED" for what in outcomes[first:]), out[-4000:]
    assert f"injected by FO_JAX_TEST_FAIL={stage}" in out, out[-4000:]
    for states in re.findall(r"^CALL \d+ RETURNED \S+ nan_shards=\S+ shards=(\S+)", out, re.M):
        assert "wrong" not in states.split(","), out[-4000:]  # each GPU's result: right or NaN
    if stage == "copy" and form in _MARKED_FORMS and first > 0:
        states = re.search(r"^CALL 0 RETURNED \S+ nan_shards=\S+ shards=(\S+)", out, re.M)
        assert states, out[-4000:]
        states = states.group(1).split(",")
        assert len(states) == n and all(st == "nan" for st in states[:-1]), out[-4000:]
        # The failing rank's own output is NaN too, except on the ring: its own band's partial
        # sums never pass through its own sends, so they can all arrive (and its GEMM finish)
        # before its copy thread's release marks the call; then that output is the right sum.
        assert states[-1] == "nan" or (form == "rs_ring" and states[-1] == "ok"), out[-4000:]
    if stage == "copy" and form == "ag_copy_engine" and first > 0:
        poisoned = re.search(r"^CALL 0 RETURNED \S+ nan_shards=(\d+)/(\d+)", out, re.M)
        assert poisoned and int(poisoned.group(1)) >= 2 * (n - 1), out[-4000:]


def test_known_failure_in_another_process_ends_the_wait_without_a_timeout():
    """H4: one process per GPU, no progress timeout (the default: a paused rank is waited for).
    The last process's communicator breaks (multiprocess_failure_worker.py): it publishes the
    failure through JAX's key-value store and the other processes, waiting for it inside NCCL,
    abort their communicators of the group on seeing it; their next call raises naming the
    failed process. No process hangs."""
    gpu_devices_or_skip(2)
    nproc = 2
    port = free_port()
    env = _process_env()
    env.pop("FO_JAX_COMM_TIMEOUT_S", None)
    procs = [subprocess.Popen([sys.executable, os.path.join(WORKERS,
                                                            "multiprocess_failure_worker.py"),
                               str(i), str(nproc), str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(nproc)]
    outs = [out for _, out in wait_all(procs, 240,
                                       "a process hung after another one's communicator failed")]
    for i, out in enumerate(outs):
        assert f"process {i}: RAISED" in out, out[-3000:]
        if i != nproc - 1:
            assert f"process {nproc - 1} of the group failed" in out, out[-3000:]


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "all_gather"])
@pytest.mark.parametrize("stage", ["launch", "copy"])
def test_failure_in_one_process_fails_the_copy_engine_group_everywhere(stage, collective):
    """The copy engine across processes: the last process's rank fails at `stage` on every call.
    It releases the flags its peers in the other processes wait for (no call hangs, each ends
    within 30 s) and fails its group; the other processes learn it through the key-value store
    and raise from a later call on, naming the failed process. A reduce-scatter or all-reduce
    call that returns holds NaNs, never a wrong or stale value: the all-reduce's peers, whose
    outputs that rank stores into, fill theirs with NaNs (comm/abandoned_poison.h). An
    all-gather call that returns holds, on each GPU, the right product or NaN rows where the
    failed rank's rows did not come (its release fills them: EnqueueBandRelease): a launch
    failure leaves the peers' rows whole, a copy failure the failing rank's own."""
    from test_overlap_gpu import _one_process_per_gpu

    nproc = tp_or_skip()
    outs = _one_process_per_gpu("ipc_failure_worker.py", "a process hung after another failed",
                                FO_JAX_TEST_FAIL=f"{stage}:{nproc - 1}",
                                FAILURE_WORKER_COLLECTIVE=collective)
    for i, (code, out) in enumerate(outs):
        assert code == 0 and f"WORKER OK process {i}" in out, out[-4000:]
        calls = re.findall(r"^CALL (\d+) (RAISED|RETURNED) (\S+)", out, re.M)
        assert len(calls) == 6 and all(float(s) < 30 for _, _, s in calls), out[-4000:]
        outcomes = [what for _, what, _ in calls]
        assert "RAISED" in outcomes, out[-4000:]
        assert all(what == "RAISED" for what in outcomes[outcomes.index("RAISED"):]), out[-4000:]
        returned = re.findall(r"^CALL \d+ RETURNED .*$", out, re.M)
        if collective == "all_gather":
            assert all(re.search(r"shards=(nan|ok)$", line) for line in returned), out[-4000:]
        else:
            assert all("nan_shards=1/1 shards=nan" in line for line in returned), out[-4000:]
        if i != nproc - 1:
            assert f"process {nproc - 1} of the group failed" in out, out[-4000:]


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_failed_nccl_launch_sends_nans_on_one_gpu(collective, dtype):
    """One GPU, a one-rank NCCL communicator of the check's own: the NCCL transport's call whose
    GEMM launch failed (failed_nccl_call.h) fills the GEMM's output with NaNs (not a byte past
    it), sets the counters and runs the call's collectives, so its output, which held finite
    stale values, is all NaN; its error says so."""
    from fo_jax import _cuda

    gpu_devices_or_skip(1)
    mod = _cuda.module()
    r = mod.failed_nccl_call_check(getattr(mod.Collective, collective), dtype)
    assert r["error"] == "", r
    assert r["out_all_nan"] and r["guard_intact"] and r["counters_set"], r
    assert "holds NaNs" in r["message"], r


def test_a_failed_nccl_launch_in_one_process_gives_nan_sums_everywhere():
    """The NCCL transport with one process per GPU: the last process's GEMM launch fails on every
    call (FO_JAX_TEST_FAIL=launch:<last rank>). Its call still runs the collectives, on its GEMM
    output filled with NaNs (failed_nccl_call.h), and raises; so each call of the other processes
    that returns (before they learn of the failure through the key-value store) holds NaN sums
    on its shard instead of undefined ones, and their later calls raise, naming the process."""
    from test_overlap_gpu import _one_process_per_gpu

    nproc = tp_or_skip()
    outs = _one_process_per_gpu("ipc_failure_worker.py", "a process hung after another failed",
                                FO_JAX_TEST_FAIL=f"launch:{nproc - 1}",
                                FAILURE_WORKER_TRANSPORT="nccl")
    for i, (code, out) in enumerate(outs):
        assert code == 0 and f"WORKER OK process {i}" in out, out[-4000:]
        calls = re.findall(r"^CALL (\d+) (RAISED|RETURNED) (\S+)(?: nan_shards=(\d+)/(\d+))?",
                           out, re.M)
        assert len(calls) == 6 and all(float(s) < 30 for _, _, s, _, _ in calls), out[-4000:]
        outcomes = [what for _, what, _, _, _ in calls]
        if i == nproc - 1:
            assert outcomes == ["RAISED"] * 6, out[-4000:]
            continue
        assert "RAISED" in outcomes, out[-4000:]
        first = outcomes.index("RAISED")
        assert all(what == "RAISED" for what in outcomes[first:]), out[-4000:]
        assert f"process {nproc - 1} of the group failed" in out, out[-4000:]
        for _, _, _, bad, shards in calls[:first]:
            assert bad == shards != "0", out[-4000:]  # every returned call: NaN sums


@pytest.mark.parametrize("epoch_start", [0, 2**32 - 1])
@pytest.mark.parametrize("release", ["watchdog", "failed_peer"])
def test_a_release_ends_a_stuck_call_with_a_poisoned_output(release, epoch_start):
    """The releases of a stuck call on one GPU (stuck_release_check): an all-reduce call whose
    peer never comes is stuck in its stream waits and its band sum's in-kernel wait. "watchdog":
    the progress watchdog's release (a stream of its own, the rank's own flags). "failed_peer":
    what a peer whose call failed before enqueueing anything (a copy graph that cannot be built,
    the GEMM launch: failed_call.h, kWholeCall) writes, first its partner's `abandoned` word.
    Either ends the call with the local output all NaN (a released call's output reads as
    failed, not as a plausible sum), nothing stored through the out table (a stale address, or
    the failed peer's output) and exactly the release's words at the call's epoch (also where
    that epoch wraps to 0; the failed peer also sets its own `abandoned` and own-copies words,
    which its own band sums read after a copy-worker failure)."""
    gpu_devices_or_skip(1)
    r = fo_jax._cuda.module().stuck_release_check(epoch_start, release)
    assert r["error"] == "", r
    assert r["stuck_before"] and r["released"], r
    assert r["out_poisoned"] and not r["sum_equal"], r
    assert r["canary_untouched"] and r["words_released"], r
    print(f"released in {r['release_ms']:.2f} ms")


def test_release_check_control_stores_through_the_table():
    """The control of the release checks: the same awaited words written as healthy peers write
    them (no `abandoned`) end the call too, and the band sum then stores into the out table's
    address (the canary): so an untouched canary above is the release's doing."""
    gpu_devices_or_skip(1)
    r = fo_jax._cuda.module().stuck_release_check(0, "healthy_peer")
    assert r["error"] == "", r
    assert r["stuck_before"] and r["released"] and r["sum_equal"], r
    assert not r["out_poisoned"] and not r["canary_untouched"], r


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("epoch_start", [0, 2**32 - 1])
@pytest.mark.parametrize("release", ["watchdog", "failed_peer"])
def test_a_release_ends_a_stuck_ring_gemm_with_poisoned_sums(release, epoch_start, dtype):
    """The same releases of the ring reduce-scatter's GEMM on one GPU
    (stuck_ring_release_check): rank 0 of 3, stuck in the epilogues that wait for its receive
    slots' flags. "watchdog": the progress watchdog's release; "failed_peer": what its sender
    writes when its call fails before enqueueing anything. Either ends the GEMM with every tile
    that adds a slot all NaN: step 1's partial sum, which the ring sends on to the next rank,
    and the call's output (a released ring call reads as failed, on this GPU and the ones its
    partial sums reach); step 0's partial sum, which adds nothing, exact; the slot flags and
    `abandoned` at the call's epoch (also where it wraps to 0); in both of the ring's dtypes."""
    gpu_devices_or_skip(1)
    r = fo_jax._cuda.module().stuck_ring_release_check(epoch_start, release, dtype)
    assert r["error"] == "", r
    assert r["stuck_before"] and r["released"], r
    assert r["first_step_exact"] and r["sums_poisoned"] and not r["sums_exact"], r
    assert r["words_released"], r
    print(f"released in {r['release_ms']:.2f} ms")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ring_release_check_control_sums_exactly(dtype):
    """The control of the ring release checks: the slots' flags written as a healthy sender
    writes them (no `abandoned`) end the GEMM with every sum exact (bit for bit: small
    integers), so the NaNs above are the release's doing."""
    gpu_devices_or_skip(1)
    r = fo_jax._cuda.module().stuck_ring_release_check(0, "healthy_peer", dtype)
    assert r["error"] == "", r
    assert r["stuck_before"] and r["released"] and r["words_released"], r
    assert r["first_step_exact"] and r["sums_exact"] and not r["sums_poisoned"], r


_STUCK_EXIT = 70  # csrc/comm/copy_engine_watchdog.h, kStuckExitStatus


@pytest.mark.parametrize("form", ["rs_direct", "rs_ring", "ar_two_rounds", "ag_copy_engine"])
def test_a_rank_that_stops_calling_is_released_by_the_watchdog(form):
    """A rank that stops calling (FO_JAX_TEST_FAIL=stop:<last rank>: its copy-engine calls enqueue
    nothing) leaves its peers waiting for words that never come. With FO_JAX_COMM_TIMEOUT_S=5
    the progress watchdog releases them (the all-gather: its copy threads give up on the rank)
    and fails the group: no call takes longer than the limit + 30 s, and the calls after the
    first one raise, naming the timeout. If a release cannot take effect, the watchdog ends the
    process with exit status 70 and says why: no hang either way."""
    n = tp_or_skip()
    code, out = _worker("stopped_rank_worker.py", n, timeout_s=240, args=(form,),
                        FO_JAX_TEST_FAIL=f"stop:{n - 1}", FO_JAX_COMM_TIMEOUT_S="5")
    print(out[-3000:])
    if code == _STUCK_EXIT:
        assert "ending the process" in out and "progress watchdog released it" in out, out[-4000:]
        return
    assert code == 0 and "WORKER OK" in out, out[-4000:]
    calls = re.findall(r"^CALL (\d+) (RAISED|RETURNED) (\S+)", out, re.M)
    assert [int(c) for c, _, _ in calls] == [0, 1, 2], out[-4000:]
    assert all(float(seconds) < 35 for _, _, seconds in calls), calls
    outcomes = [what for _, what, _ in calls]
    assert outcomes[1:] == ["RAISED", "RAISED"], out[-4000:]
    assert "no progress for 5 s" in out or "did not reach all-gather call" in out, out[-4000:]
    if outcomes[0] == "RETURNED" and form in _MARKED_FORMS:
        # The released call's output reads as failed on every rank that waited: all but the
        # stopped one, whose call enqueued nothing.
        poisoned = re.search(r"^CALL 0 RETURNED \S+ nan_shards=(\d+)/(\d+)", out, re.M)
        assert poisoned and int(poisoned.group(1)) >= int(poisoned.group(2)) - 1, out[-4000:]


def test_a_killed_process_releases_its_copy_engine_peers(tmp_path):
    """One process per GPU, the copy engine across processes, FO_JAX_COMM_TIMEOUT_S=5: the last
    process SIGKILLs itself mid-loop (tests/workers/ipc_killed_peer_worker.py). Every survivor
    exits non-zero (a call raised, or the watchdog ended it) within the limit + 30 s of the
    kill, never hangs."""
    import time

    nproc = tp_or_skip()
    port = free_port()
    env = _process_env(FO_JAX_COMM_TIMEOUT_S="5")
    logs = [open(tmp_path / f"process{i}.log", "w+") for i in range(nproc)]
    procs = [subprocess.Popen([sys.executable, os.path.join(WORKERS, "ipc_killed_peer_worker.py"),
                               str(i), str(nproc), str(port)],
                              env=env, stdout=logs[i], stderr=subprocess.STDOUT, text=True)
             for i in range(nproc)]
    ended = [None] * nproc
    deadline = time.monotonic() + 240
    while None in ended and time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.monotonic()
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    report = "\n".join(f"--- process {i} (exit {p.returncode}):\n{out[-2500:]}"
                       for i, (p, out) in enumerate(zip(procs, outs)))
    print(report)
    assert None not in ended, "a process hung after its peer was killed:\n" + report
    assert procs[-1].returncode == -9 and "KILLING MYSELF" in outs[-1], report
    for i in range(nproc - 1):
        assert procs[i].returncode != 0 and "NO RAISE" not in outs[i], report
        assert ended[i] - ended[-1] < 35, report
