"""Failure containment without a GPU (docs/design.md, "Failure handling"): the words a
copy-engine call that fails on one rank still writes in its peers' flags (the module's own pure
function, against the protocol's table in docs/design.md, "Flag memory layout"), the failure
stages of the test hook, the opt-in progress timeout, and the cross-process failure watch (a
stand-in module and key-value store; its exit in a real one-process run)."""

import collections
import os
import subprocess
import sys

import pytest

import fo_jax
from conftest import cpu_worker_env, free_port
from fo_jax import _env, _failure_watch

needs_module = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                  reason="CUDA module not built here (no nvcc at install time)")


def _releases(P, me, *, all_reduce=False, ring=False, split="one", rounds=1, groups=None,
              part="call"):
    mod = fo_jax._cuda.module()
    groups = groups or list(range(rounds * P + 1))  # one group per chunk
    return mod.failed_call_releases(P, me, all_reduce, ring, getattr(mod.SumSplit, split),
                                    rounds, groups, part)


def _parts_make_the_call(P, me, **kw):
    whole = _releases(P, me, part="call", **kw)
    copy, xla = _releases(P, me, part="copy", **kw), _releases(P, me, part="xla", **kw)
    assert collections.Counter(whole) == collections.Counter(copy + xla)
    assert len(set(whole)) == len(whole)  # each word once
    # The acknowledgements come last: the receive slots are free only after the sums.
    kinds = [w for _, w, _ in whole]
    first_ack = kinds.index("recv_acked")
    assert set(kinds[first_ack:]) == {"recv_acked"}
    return whole


@needs_module
def test_direct_reduce_scatter_releases_each_step_and_the_acks():
    """Rank 1 of 4 sends step j to rank (1 + 1 + j) % 4 into its slot j, then acknowledges to
    every sender; a reduce-scatter has no output addresses and no `stored`."""
    got = _parts_make_the_call(4, 1)
    assert got == [(2, "arrived", 0), (3, "arrived", 1), (0, "arrived", 2),
                   (0, "recv_acked", 1), (2, "recv_acked", 1), (3, "recv_acked", 1)]
    assert _releases(4, 1, part="xla") == []  # XLA's stream writes nothing into the peers


@needs_module
def test_all_reduce_releases_the_address_the_slots_and_stored():
    """All-reduce, 2 rounds, 2 ranks: the output address flag first (the peer's stores need
    it), each round's slot (round h, step 0 -> slot h), `stored` (XLA's stream), the ack."""
    got = _parts_make_the_call(2, 0, all_reduce=True, rounds=2)
    assert got == [(1, "out_ready", 0), (1, "arrived", 0), (1, "arrived", 1), (1, "stored", 0),
                   (1, "recv_acked", 0)]
    assert _releases(2, 0, all_reduce=True, rounds=2, part="xla") == [(1, "stored", 0)]
    copy = _releases(2, 0, all_reduce=True, rounds=2, part="copy")
    assert (1, "out_ready", 0) in copy and (1, "stored", 0) not in copy


@needs_module
def test_ring_releases_every_group_to_the_previous_rank():
    """The ring sends its first P - 1 chunks (two groups each here) to rank me - 1, flagged per
    group by the group's index; no step flags."""
    got = _parts_make_the_call(4, 0, ring=True, groups=[0, 2, 4, 6, 8])
    ring = [(3, "ring_arrived", g) for g in range(6)]
    assert got == ring + [(1, "recv_acked", 0), (2, "recv_acked", 0), (3, "recv_acked", 0)]


@needs_module
def test_sums_by_rows_release_every_piece_of_the_last_step():
    """SumSplit rows: the last chunk sent (step P - 2) is flagged piece by piece before its step
    flag; earlier steps only by their step flag."""
    got = _parts_make_the_call(3, 2, split="rows", groups=[0, 1, 4, 5])
    assert got == [(0, "arrived", 0), (1, "last_pieces", 0), (1, "last_pieces", 1),
                   (1, "last_pieces", 2), (1, "arrived", 1), (0, "recv_acked", 2),
                   (1, "recv_acked", 2)]


@needs_module
@pytest.mark.parametrize("P", [2, 4, 8])
def test_every_peer_is_released_for_every_form(P):
    """Whatever the form, each peer gets an acknowledgement and, for the direct form, exactly
    one arrival flag per round (the slot it reads)."""
    for me in range(P):
        for all_reduce, rounds in ((False, 1), (True, 1), (True, 2)):
            got = _parts_make_the_call(P, me, all_reduce=all_reduce, rounds=rounds)
            for q in set(range(P)) - {me}:
                assert (q, "recv_acked", me) in got
                assert sum(1 for p, w, _ in got if p == q and w == "arrived") == rounds
                assert ((q, "stored", me) in got) is all_reduce
            assert all(p != me for p, _, _ in got)  # never this rank's own flags


@needs_module
def test_releases_refuse_bad_arguments():
    mod = fo_jax._cuda.module()
    with pytest.raises(ValueError, match="failed_call_releases"):
        mod.failed_call_releases(1, 0, False, False, mod.SumSplit.one, 1, [0, 1], "call")
    with pytest.raises(ValueError, match="part must be"):
        mod.failed_call_releases(2, 0, False, False, mod.SumSplit.one, 1, [0, 1, 2], "gemm")


@needs_module
@pytest.mark.parametrize("stage", ["graph", "launch", "copy", "alloc", ""])
def test_module_takes_every_failure_stage(stage):
    mod = fo_jax._cuda.module()
    mod.set_test_hooks(0, stage, 1)
    mod.set_test_hooks(0, "", -1)  # the defaults: no hook


def test_failure_stages_parse(monkeypatch):
    for stage in ("alloc", "graph", "launch", "copy"):
        monkeypatch.setenv(_env.TEST_FAIL, f"{stage}:3")
        assert _env.test_fail() == (stage, 3)
    for bad in ("graph", "gemm:1", "launch:-1", "copy:one"):
        monkeypatch.setenv(_env.TEST_FAIL, bad)
        with pytest.raises(ValueError, match="FO_JAX_TEST_FAIL"):
            _env.test_fail()


def test_progress_timeout_is_opt_in(monkeypatch):
    """No timeout by default: a paused rank is waited for, as XLA's collectives wait."""
    monkeypatch.delenv(_env.COMM_TIMEOUT_S, raising=False)
    assert _env.comm_timeout_s() == 0.0
    monkeypatch.setenv(_env.COMM_TIMEOUT_S, "30")
    assert _env.comm_timeout_s() == 30.0


class _Module:
    """Stands in for the CUDA module: its failed groups, and the aborts asked of it."""

    def __init__(self, failed=()):
        self.failed, self.aborts = list(failed), []

    def failed_groups(self):
        return list(self.failed)

    def abort_group_for_known_failure(self, uid, message):
        self.aborts.append((uid, message))


class _Store:
    """JAX's key-value store, as far as the watch uses it (its keys come back in full)."""

    def __init__(self):
        self.values = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite or key not in self.values, key
        self.values[key] = value

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in sorted(self.values.items()) if k.startswith(prefix)]


def test_failure_watch_publishes_and_every_process_aborts_once():
    """Process 1's group fails (its NCCL error, a failed launch): it publishes the failure and
    aborts there; process 0, healthy until then, aborts on its next pass, naming process 1 and
    the cause; a healthy group is left alone; nothing is aborted twice."""
    store, bad, good = _Store(), b"\x01" * 128, b"\x02" * 128
    p0, p1 = _Module(), _Module(failed=[(bad, "NCCL error on rank 1")])
    watched = lambda p: {bad: (store, p), good: (store, p)}  # noqa: E731
    handled0, handled1 = set(), set()
    assert _failure_watch.poll_once(p0, watched(0), handled0) == []  # nothing published yet
    assert _failure_watch.poll_once(p1, watched(1), handled1) == [(bad, "NCCL error on rank 1")]
    assert store.values == {f"fo_jax/failed/{bad.hex()}/1": "NCCL error on rank 1"}
    aborted = _failure_watch.poll_once(p0, watched(0), handled0)
    assert aborted == [(bad, "process 1 of the group failed: NCCL error on rank 1")]
    assert p0.aborts == aborted and p1.aborts == [(bad, "NCCL error on rank 1")]
    # Process 0's group now counts as failed locally too: it is not published or aborted again.
    p0.failed = [(bad, aborted[0][1])]
    for module, handled, p in ((p0, handled0, 0), (p1, handled1, 1)):
        assert _failure_watch.poll_once(module, watched(p), handled) == []
    assert len(p0.aborts) == 1 and len(p1.aborts) == 1
    assert list(store.values) == [f"fo_jax/failed/{bad.hex()}/1"]


def test_failure_watch_survives_a_store_that_is_gone():
    class Gone(_Store):
        def key_value_dir_get(self, prefix):
            raise RuntimeError("UNAVAILABLE: the coordination service has shut down")

    uid = b"\x03" * 128
    assert _failure_watch.poll_once(_Module(), {uid: (Gone(), 0)}, set()) == []


def test_failure_watch_polls_only_the_current_client():
    """Groups watched through a client that was shut down (or replaced by a new initialize) are
    not polled: their store is gone."""
    old, new = _Store(), _Store()
    watched = {b"\x04" * 128: (old, 0), b"\x05" * 128: (new, 1)}
    assert _failure_watch.current_clients_only(watched, new) == {b"\x05" * 128: (new, 1)}
    assert _failure_watch.current_clients_only(watched, None) == {}


@pytest.mark.parametrize("shutdown", [False, True], ids=["exit", "shutdown_then_exit"])
def test_failure_watch_never_aborts_the_exit(shutdown):
    """A process whose watch is inside a call into jaxlib (a poll's key-value request, the GIL
    released) when the interpreter exits ends normally, with or without
    jax.distributed.shutdown() first: the exit hook joins the thread before finalization, where
    Python would end it inside jaxlib's C++ frames and abort the process (tests/workers/
    watch_exit_worker.py)."""
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers",
                          "watch_exit_worker.py")
    args = [sys.executable, worker, str(free_port())] + (["shutdown"] if shutdown else [])
    run = subprocess.run(args, env=cpu_worker_env(), capture_output=True, text=True,
                         timeout=120)
    out = run.stdout + run.stderr
    assert "WORKER EXITING" in out, out[-3000:]
    assert run.returncode == 0, f"exit status {run.returncode}:\n{out[-3000:]}"


def test_every_multi_process_group_is_watched(monkeypatch):
    """The lowering that names a group's communicator across processes also watches it for
    failures; a group of one process is not watched (its failures are known in-process)."""
    from fo_jax import _bootstrap

    class Dev:
        def __init__(self, id_, process_index):
            self.id, self.process_index = id_, process_index

    watched, store = [], _Store()
    store.blocking_key_value_get = lambda key, timeout_ms: store.values[key]
    monkeypatch.setattr(_bootstrap, "_distributed_client", lambda: store)
    monkeypatch.setattr(_failure_watch, "watch", lambda *a: watched.append(a))
    monkeypatch.setattr(_bootstrap, "_unique_ids", {})
    uid = bytes(range(128))
    group = [Dev(90, 0), Dev(91, 1)]
    assert _bootstrap._unique_id(group, 0, 0, 2, lambda: uid) == uid
    assert _bootstrap._unique_id(group, 0, 1, 2, lambda: b"unused") == uid  # from the store
    assert watched == [(store, uid, 0)]  # the second lookup hit the cache of this "process"
    _bootstrap._unique_ids.clear()
    assert _bootstrap._unique_id(group, 0, 1, 2, lambda: b"unused") == uid
    assert watched[-1] == (store, uid, 1)
    _bootstrap._unique_id([Dev(92, 0), Dev(93, 0)], 0, 0, 1, lambda: uid)
    assert len(watched) == 2
