"""The copy-engine transport with one JAX process per GPU, without a GPU (docs/design.md, "Copy
engine across processes"): the transport choice for process layouts (mocked process counts,
hosts and IPC probe verdicts), the host exchange and the lowering-time CUDA IPC probe through a
stand-in for JAX's key-value store (the probe's CUDA side mocked), the address exchange's
PeerInfo as it travels (fake IPC handles) and the route decision per peer (the module's own
functions), and the lowering of a reduce-scatter with and without the copy engine across
processes."""

import re
import threading

import jax
import jax.numpy as jnp
import pytest

import fo_jax
from fo_jax import _process_layout, _transport, overlap

needs_module = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                  reason="CUDA module not built here (no nvcc at install time)")
BF16 = jnp.dtype(jnp.bfloat16)
# 4 ranks, 8192 x 8192 x 2048 per the design shapes: the copy engine takes it in one process.
SHAPE = dict(m=8192, n=8192, k=2048, size=4)
DEFAULT = fo_jax.OverlapConfig()
OPT_OUT = fo_jax.OverlapConfig(copy_engine_multiprocess=False)
REQUESTED = fo_jax.OverlapConfig(transport="copy_engine")  # the all-reduce's opt-in


@pytest.fixture
def processes(monkeypatch):
    """Pretends the program runs `count` JAX processes on `hosts` (process index order)."""

    def set_layout(count, hosts=None):
        monkeypatch.setattr(jax, "process_count", lambda: count)
        hosts = tuple(hosts or ["node-a"] * count)
        monkeypatch.setattr(_process_layout, "_hosts", hosts)
        monkeypatch.setattr(_process_layout, "_ipc", "")  # the IPC probe passed
        monkeypatch.setattr(_process_layout, "_pool", "")  # XLA's memory can be mapped
        monkeypatch.setattr(_process_layout, "local_device_count", lambda: 1)  # a GPU each

    return set_layout


def _choose(collective, config, transport_only=True):
    if transport_only:
        return _transport.choose("fo_jax.overlapped_matmul", collective, SHAPE["size"], BF16,
                                 SHAPE["m"], SHAPE["n"], SHAPE["k"], config)
    return overlap._choose_overlapped(BF16, config, SHAPE["m"], SHAPE["n"], SHAPE["k"], "gpu",
                                      collective, SHAPE["size"])


@needs_module
def test_one_process_keeps_the_copy_engine(processes):
    processes(1)
    for collective in ("reduce_scatter", "all_reduce"):
        assert _choose(collective, None)[0] == "copy_engine", collective


@needs_module
def test_several_processes_keep_nccl_when_opted_out(processes):
    processes(4)
    transport, why = _choose("reduce_scatter", OPT_OUT)
    assert transport == "nccl"
    assert "turned off" in why and "copy_engine_multiprocess=False" in why, why
    with pytest.raises(ValueError, match=r"transport='copy_engine'.*copy_engine_multiprocess"):
        _choose("reduce_scatter", fo_jax.OverlapConfig(transport="copy_engine",
                                                       copy_engine_multiprocess=False))


@needs_module
def test_reduce_scatter_on_one_host_takes_the_copy_engine_by_default(processes):
    processes(4)
    for config in (None, DEFAULT):
        transport, why = _choose("reduce_scatter", config)
        assert transport == "copy_engine" and "no collective tail" in why, why
        choice = _choose("reduce_scatter", config, transport_only=False)
        assert choice.path == "cuda" and choice.transport == "copy_engine", choice
    # Both forms cross processes: the ring and the direct form (its band sums read local memory).
    for ring in (True, False):
        config = fo_jax.OverlapConfig(copy_engine_ring=ring)
        assert _choose("reduce_scatter", config)[0] == "copy_engine", ring


@needs_module
def test_all_reduce_crosses_processes_when_requested_where_xla_memory_maps(processes,
                                                                        monkeypatch):
    processes(4)
    for config in (None, DEFAULT):  # unrequested: NCCL, saying how to opt in
        choice = _choose("all_reduce", config, transport_only=False)
        assert choice.transport == "nccl", choice
        assert "opt-in: OverlapConfig(transport='copy_engine')" in choice.reason, choice.reason
    choice = _choose("all_reduce", REQUESTED, transport_only=False)
    assert choice.transport == "copy_engine", choice
    with pytest.raises(ValueError, match="turned off"):
        _choose("all_reduce", fo_jax.OverlapConfig(transport="copy_engine",
                                                   copy_engine_multiprocess=False))
    why = "JAX's memory preallocation is off (XLA_PYTHON_CLIENT_PREALLOCATE=false): ..."
    monkeypatch.setattr(_process_layout, "_pool", why)
    with pytest.raises(ValueError, match="could not map from this process: JAX's memory "
                                         "preallocation is off"):
        _choose("all_reduce", REQUESTED)
    assert _choose("reduce_scatter", None)[0] == "copy_engine"  # needs no XLA memory mapped


AG_ON = dict(all_gather="overlap", allow_fallback=False)  # the overlapped all-gather's opt-in


@needs_module
def test_all_gather_crosses_processes_when_requested_where_xla_memory_maps(processes,
                                                                        monkeypatch):
    """As the all-reduce: its rows go into the peers' mapped XLA memory, so with several
    processes the copy engine takes it only on request, and only where that memory maps."""
    choose = _transport.choose_all_gather
    processes(4)
    for config in (fo_jax.OverlapConfig(**AG_ON), None):  # unrequested: NCCL, saying why
        transport, why = choose("fo_jax.all_gather_matmul", 4, config)
        assert transport == "nccl", why
        assert "copy-engine all-gather (its rows are pushed into the peers' mapped XLA memory) " \
               "is opt-in: OverlapConfig(transport='copy_engine')" in why, why
    requested = fo_jax.OverlapConfig(transport="copy_engine", **AG_ON)
    assert choose("fo_jax.all_gather_matmul", 4, requested)[0] == "copy_engine"
    with pytest.raises(ValueError, match="turned off"):
        choose("fo_jax.all_gather_matmul", 4,
               fo_jax.OverlapConfig(transport="copy_engine", copy_engine_multiprocess=False,
                                    **AG_ON))
    monkeypatch.setattr(_process_layout, "_pool", "JAX's memory preallocation is off ...")
    with pytest.raises(ValueError, match="all-gather across processes writes into the peers' "
                                         "XLA memory, which they could not map from this "
                                         "process: JAX's memory preallocation is off"):
        choose("fo_jax.all_gather_matmul", 4, requested)
    processes(1)  # one process: the copy engine unrequested, as before
    assert choose("fo_jax.all_gather_matmul", 4, fo_jax.OverlapConfig(**AG_ON))[0] == \
        "copy_engine"


@needs_module
def test_a_mesh_spanning_hosts_keeps_nccl(processes):
    processes(4, ["node-a", "node-a", "node-b", "node-b"])
    transport, why = _choose("reduce_scatter", None)
    assert transport == "nccl" and "span 2 hosts (node-a, node-b)" in why, why


def test_multiprocess_problem_rule(monkeypatch):
    """The rule itself, without the rest of the choice: the order of its reasons."""
    monkeypatch.setattr(_process_layout, "local_device_count", lambda: 1)  # a GPU each
    one_host = lambda: ("h",) * 2  # noqa: E731
    two_hosts = lambda: ("h", "g")  # noqa: E731
    rule = _process_layout.multiprocess_problem
    assert rule("all_reduce", 1, None, two_hosts) is None  # one process: not this rule's case
    assert "opt-in" in rule("all_gather", 2, DEFAULT, one_host)  # asks no probe or pool
    assert "has no broadcast" in rule("broadcast", 2, DEFAULT, one_host)
    assert "turned off" in rule("reduce_scatter", 2, OPT_OUT, one_host)
    assert "turned off" in rule("all_reduce", 2, OPT_OUT, one_host)
    assert "opt-in" in rule("all_reduce", 2, None, one_host)  # asks no host, probe or pool
    passed = lambda: None  # noqa: E731 - the IPC probe's verdicts, and the XLA memory's export
    failed = lambda: "GPU 1 of process 1 cannot write into ..."  # noqa: E731
    no_pool = lambda: "XLA_PYTHON_CLIENT_ALLOCATOR=platform: ..."  # noqa: E731

    def not_probed():
        raise AssertionError("the IPC probe ran")

    def not_asked():
        raise AssertionError("XLA's memory was tried")

    assert rule("reduce_scatter", 2, None, one_host, passed, not_asked) is None
    for collective, verb in (("all_reduce", "stores into"), ("all_gather", "writes into")):
        assert rule(collective, 2, REQUESTED, one_host, passed, passed) is None
        why = rule(collective, 2, REQUESTED, one_host, passed, no_pool)
        name = collective.replace("_", "-")
        assert why == (f"the copy-engine {name} across processes {verb} the peers' XLA "
                       "memory, which they could not map from this process: "
                       "XLA_PYTHON_CLIENT_ALLOCATOR=platform: ...")
        # XLA's memory is tried last: after the hosts and the probe.
        assert "span 2 hosts" in rule(collective, 2, REQUESTED, two_hosts, not_probed, not_asked)
        assert "probe" in rule(collective, 2, REQUESTED, one_host, failed, not_asked)
    # The all-reduce and all-gather across processes serve one GPU per process: a process that
    # drives two keeps NCCL for them, before its hosts, probe or memory are asked; the
    # reduce-scatter does not care.
    for collective in ("all_reduce", "all_gather"):
        assert rule(collective, 2, REQUESTED, one_host, passed, passed) is None
    monkeypatch.setattr(_process_layout, "local_device_count", lambda: 2)
    for collective in ("all_reduce", "all_gather"):
        why = rule(collective, 2, REQUESTED, not_probed, not_probed, not_asked)
        name = collective.replace("_", "-")
        assert why == (f"the copy-engine {name} across processes runs one GPU per process; this "
                       "process drives 2 (launch one process per GPU, or take NCCL)"), why
    assert rule("reduce_scatter", 2, None, one_host, passed, not_asked) is None

    for config in (None, DEFAULT):
        assert rule("reduce_scatter", 2, config, one_host, passed) is None
    why = rule("reduce_scatter", 2, None, one_host, failed)
    assert why.startswith("the CUDA IPC probe between the processes failed: GPU 1 of process 1")
    # The probe runs last: only where the hosts allow CUDA IPC, and not when turned off.
    assert "span 2 hosts" in rule("reduce_scatter", 2, None, two_hosts, not_probed)
    assert "turned off" in rule("reduce_scatter", 2, OPT_OUT, one_host, not_probed)
    assert "opt-in" in rule("all_gather", 2, None, one_host, not_probed)


def test_allocator_settings_that_keep_xla_memory_from_mapping():
    """The copy-engine all-reduce across processes maps each peer's XLA pool once: JAX's default
    allocator with its preallocated pool (one allocation per GPU) passes, a pool that grows or
    another allocator does not."""
    problem = _process_layout.allocator_problem
    assert problem({}) is None
    assert problem({"XLA_PYTHON_CLIENT_ALLOCATOR": "BFC", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5",
                    "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}) is None
    for off in ("false", "False", "0"):
        assert "preallocation is off" in problem({"XLA_PYTHON_CLIENT_PREALLOCATE": off})
    for allocator in ("platform", "cuda_async", "vmm"):
        why = problem({"XLA_PYTHON_CLIENT_ALLOCATOR": allocator})
        assert why.startswith(f"XLA_PYTHON_CLIENT_ALLOCATOR={allocator}:"), why


@needs_module
def test_descriptor_handover_over_a_unix_socket():
    """The copy-engine all-reduce across processes hands each peer its XLA memory's descriptor
    over an abstract Unix socket (csrc/comm/xla_pool_ipc.h). Here within one process, without a
    GPU: a pipe's write end to three receivers, each writing through its own copy; a receiver
    that never comes makes the server give up after its timeout instead of waiting forever."""
    import time

    check = fo_jax._cuda.module().fd_handover_check
    served, received, data = check(3, 3, 5000)
    assert (served, received, data) == ("", ["", "", ""], "abc")
    start = time.perf_counter()
    served, received, data = check(2, 1, 300)
    assert "never came for XLA's memory handle (waited 300 ms)" in served, served
    assert (received, data) == ([""], "a")
    assert time.perf_counter() - start < 5


def test_the_hosts_are_not_asked_for_when_turned_off():
    """Turned off (or for a collective that cannot cross processes) the rule never touches the
    key-value store: such a program exchanges nothing more than NCCL's unique ids."""

    def no_store():
        raise AssertionError("the key-value store was asked")

    assert "turned off" in _process_layout.multiprocess_problem("reduce_scatter", 4, OPT_OUT,
                                                               no_store)
    assert "opt-in" in _process_layout.multiprocess_problem("all_gather", 4, None, no_store)


class _Store:
    """A key-value store shared by threads standing in for processes (JAX's client API)."""

    def __init__(self):
        self.values, self.cv = {}, threading.Condition()

    def key_value_set(self, key, value):
        with self.cv:
            assert key not in self.values, key  # JAX's store refuses to overwrite
            self.values[key] = value
            self.cv.notify_all()

    def blocking_key_value_get(self, key, timeout_ms):
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.values, timeout_ms / 1000):
                raise TimeoutError(f"DEADLINE_EXCEEDED: {key}")
            return self.values[key]


def test_hosts_are_exchanged_through_the_store():
    store, seen = _Store(), {}
    names = ["node-a", "node-a", "node-b"]

    def run(p):
        seen[p] = _process_layout.exchange_hosts(p, 3, store, lambda: names[p], timeout_s=5)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {p: tuple(names) for p in range(3)}
    assert "span 2 hosts" in _process_layout.hosts_problem(seen[0])
    assert _process_layout.hosts_problem(("x", "x", "x")) is None


def test_a_missing_process_times_out_instead_of_hanging():
    with pytest.raises(TimeoutError, match="fo_jax/host/1"):
        _process_layout.exchange_hosts(0, 2, _Store(), lambda: "h", timeout_s=0.2)


class _FakeIpc:
    """The CUDA module's ipc_probe_* for one stand-in process: a handle names its (process,
    device); a write from process w into process o's memory fails with refuse(w, o) ("" passes);
    export_problem fails the export."""

    def __init__(self, proc, refuse=lambda w, o: "", export_problem=""):
        self.proc, self.refuse, self.export_problem = proc, refuse, export_problem
        self.tries, self.released = [], False

    def ipc_probe_export(self, device):
        if self.export_problem:
            return b"", self.export_problem
        return f"p{self.proc}d{device}".encode().ljust(64, b"\0"), ""

    def ipc_probe_try(self, device, handle, slot, word):
        owner = int(handle.rstrip(b"\0").decode()[1:].split("d")[0])
        self.tries.append((device, handle.rstrip(b"\0").decode(), slot, word))
        return self.refuse(self.proc, owner)

    def ipc_probe_release(self):
        self.released = True


def _probe(fakes, devices=None, timeout_s=5):
    """ipc_probe in one thread per fake process over one store: {process: verdict}."""
    store, got = _Store(), {}

    def run(p):
        got[p] = _process_layout.ipc_probe(p, len(fakes), store,
                                           (0, 1) if devices is None else devices[p], fakes[p],
                                           timeout_s=timeout_s)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(len(fakes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_ipc_probe_passes_when_every_pair_writes():
    fakes = [_FakeIpc(p) for p in range(3)]
    assert _probe(fakes) == {0: "", 1: "", 2: ""}
    for p, fake in enumerate(fakes):
        # Every other process's buffer of each GPU, from each of this process's GPUs, into
        # this process's own slot, with a nonzero word distinct per (process, GPU).
        assert sorted((d, h) for d, h, _, _ in fake.tries) == sorted(
            (d, f"p{q}d{e}") for d in (0, 1) for q in range(3) if q != p for e in (0, 1))
        assert {slot for _, _, slot, _ in fake.tries} == {p}
        assert fake.released
    words = {(p, d): w for p, f in enumerate(fakes) for d, _, _, w in f.tries}
    assert len(set(words.values())) == 6 and 0 not in words.values()


def test_ipc_probe_verdict_is_the_same_everywhere():
    """One pair that cannot write (process 1 into process 2): every process returns that pair's
    problem, so every process lowers the same transport."""
    refuse = lambda w, o: "cudaErrorPeerAccessUnsupported" if (w, o) == (1, 2) else ""  # noqa
    got = _probe([_FakeIpc(p, refuse) for p in range(3)])
    assert len(set(got.values())) == 1
    assert got[0] == ("GPU 0 of process 1 cannot write into the GPU memory of process 2 through "
                      "CUDA IPC: cudaErrorPeerAccessUnsupported")


def test_ipc_probe_export_failure_and_no_gpu():
    fakes = [_FakeIpc(0), _FakeIpc(1, export_problem="cudaErrorMemoryAllocation")]
    got = _probe(fakes)
    assert got[0] == got[1] == ("process 1 could not export GPU 0's memory: "
                                "cudaErrorMemoryAllocation")
    assert not fakes[0].tries  # nothing to try against a process that exported nothing
    got = _probe([_FakeIpc(0), _FakeIpc(1)], devices=[(), (0,)])
    assert got[0] == got[1] == "process 0 has no CUDA GPU"


def test_ipc_probe_missing_process_times_out():
    with pytest.raises(TimeoutError, match="fo_jax/ipc_probe/export/1"):
        _process_layout.ipc_probe(0, 2, _Store(), (0,), _FakeIpc(0), timeout_s=0.2)


def test_ipc_probe_runs_once_and_warns_when_it_fails(monkeypatch):
    """process_ipc_problem probes once per process; a failed probe warns once (the program then
    runs on NCCL) and is the rule's answer from then on."""
    calls = []

    def probe(*args):
        calls.append(args)
        return "GPU 0 of process 0 cannot write ..."

    monkeypatch.setattr(_process_layout, "_ipc", None)
    monkeypatch.setattr(_process_layout, "ipc_probe", probe)
    monkeypatch.setattr(_process_layout, "_client", lambda: _Store())
    monkeypatch.setattr(fo_jax._cuda, "module", lambda: object())
    with pytest.warns(UserWarning, match="copy engine across processes.*NCCL transport"):
        assert _process_layout.process_ipc_problem().startswith("GPU 0 of process 0")
    assert _process_layout.process_ipc_problem().startswith("GPU 0 of process 0")
    assert len(calls) == 1


@needs_module
def test_ipc_probe_functions_of_the_module():
    """The module's probe functions answer without raising: a handle of the wrong size is
    refused before any CUDA call; the export gives a 64-byte handle where a GPU is present, else
    the reason (no CUDA driver here)."""
    mod = _module_with_ipc()
    assert "3 bytes (expected 64)" in mod.ipc_probe_try(0, b"abc", 0, 1)
    handle, why = mod.ipc_probe_export(0)
    assert (len(handle) == 64 and why == "") or (handle == b"" and why), (handle, why)
    mod.ipc_probe_release()


def test_config_field_is_checked():
    assert fo_jax.OverlapConfig().copy_engine_multiprocess is True
    with pytest.raises(ValueError, match="copy_engine_multiprocess must be True or False"):
        fo_jax.OverlapConfig(copy_engine_multiprocess=1)


# --- the address exchange's entries and the route to each peer (the module's functions) ---

HANDLE = bytes(range(64))  # a fake cudaIpcMemHandle_t (64 opaque bytes)


def _module_with_ipc():
    mod = fo_jax._cuda.module()
    if not hasattr(mod, "copy_engine_peer_route"):
        pytest.fail("the CUDA module predates these sources: rebuild it (pip install -e . or "
                    "the CMake build of docs/development.md)")
    return mod


def _entry(**fields):
    base = dict(recv=0x7F0000000000, flags=0x7F0001000000, recv_bytes=1 << 26, host=42, pid=100,
                device=0, exported=1, bus_id=b"0000:19:00.0", recv_handle=HANDLE,
                flags_handle=HANDLE[::-1])
    base.update(fields)
    return base


@needs_module
def test_peer_info_travels_intact():
    mod = _module_with_ipc()
    sent = _entry(pid=4242, device=3, host=2**63 + 5, bus_id=b"0000:9a:00.0")
    got = mod.copy_engine_peer_info_roundtrip(sent)
    for key, value in sent.items():
        assert got[key] == value, key
    # Raw bytes of one layout: the two handles are 64 bytes each, plus the fixed fields.
    assert got["wire_bytes"] >= 2 * 64 + 16 + 4 * 8 + 4 * 4
    with pytest.raises(ValueError, match="recv_handle: at most 64 bytes"):
        mod.copy_engine_peer_info_roundtrip(_entry(recv_handle=bytes(65)))


@needs_module
def test_peer_routes():
    mod = _module_with_ipc()
    mine = _entry(pid=100, device=0)
    route = mod.copy_engine_peer_route
    # Same process: the peer's own addresses, by ordinal.
    assert route(mine, _entry(pid=100, device=1), 1, 1, True) == ("direct", "")
    kind, why = route(mine, _entry(pid=100, device=1), 1, 1, False)
    assert kind == "refused" and "no peer access" in why and "transport='nccl'" in why
    # Another process, GPU visible here: peer access decides; hidden (CUDA_VISIBLE_DEVICES): the
    # IPC open decides, so it is not refused here.
    other = _entry(pid=200, device=0, bus_id=b"0000:3b:00.0")
    assert route(mine, other, 2, 1, True) == ("ipc", "")
    kind, why = route(mine, other, 2, 1, False)
    assert kind == "refused" and "rank 2" in why and "0000:3b:00.0" in why
    assert route(mine, other, 2, -1, False) == ("ipc", "")
    # A peer that could not export its memory, or one on another host.
    kind, why = route(mine, _entry(pid=200, exported=0), 3, -1, False)
    assert kind == "refused" and "could not export" in why and "rank 3" in why
    kind, why = route(mine, _entry(pid=200, host=43), 1, -1, False)
    assert kind == "refused" and "one host" in why
    # Same pid on another host is still another host (pids repeat across machines).
    assert route(mine, _entry(pid=100, host=43), 1, 1, True)[0] == "refused"


@needs_module
def test_host_identity_is_stable():
    mod = _module_with_ipc()
    assert mod.copy_engine_host_identity() == mod.copy_engine_host_identity() != 0


# --- lowering: what the setting changes in the custom call ---


def _lowered_transport(config, collective="reduce_scatter"):
    """The transport in the plan attribute of a `collective` call lowered for CUDA from CPU
    devices (the layout mocked by the caller), as the module's enum value."""
    from jax.sharding import PartitionSpec as P

    from conftest import cpu_mesh

    mesh = cpu_mesh((4,), ("tp",))
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                              config=config),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
        out_specs=P("tp", None) if collective == "reduce_scatter" else P()))
    x = jnp.ones((SHAPE["m"], SHAPE["k"] * 4), jnp.bfloat16)
    w = jnp.ones((SHAPE["k"] * 4, SHAPE["n"]), jnp.bfloat16)
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "fo_jax_overlapped_matmul_v2" in text
    found = re.search(r"transport = (\d+) : i32", text)
    assert found, "no transport in the lowered plan"
    return int(found.group(1))


@needs_module
def test_lowering_with_several_processes(processes, monkeypatch):
    """With 4 processes (mocked; every device still of process 0, so plan agreement has no peer
    to ask) the lowered reduce-scatter runs on the copy engine by default and on NCCL when
    turned off; the all-reduce on NCCL unless it requests the copy engine; the unique id goes
    through the (stand-in) key-value store as with any multi-process program."""
    from fo_jax import _bootstrap

    mod = fo_jax._cuda.module()
    store = _Store()
    monkeypatch.setattr(_bootstrap, "_distributed_client", lambda: store)
    monkeypatch.setattr(_bootstrap, "_unique_ids", {})
    processes(4)
    assert _lowered_transport(fo_jax.OverlapConfig(allow_fallback=False)) == \
        mod.Transport["copy_engine"].value
    assert _lowered_transport(fo_jax.OverlapConfig(allow_fallback=False,
                                                   copy_engine_multiprocess=False)) == \
        mod.Transport["nccl"].value
    default = fo_jax.OverlapConfig(allow_fallback=False)
    requested = fo_jax.OverlapConfig(allow_fallback=False, transport="copy_engine")
    assert _lowered_transport(default, "all_reduce") == mod.Transport["nccl"].value
    assert _lowered_transport(requested, "all_reduce") == mod.Transport["copy_engine"].value
    monkeypatch.setattr(_process_layout, "_pool", "XLA_PYTHON_CLIENT_ALLOCATOR=platform: ...")
    with pytest.raises(ValueError, match="XLA_PYTHON_CLIENT_ALLOCATOR=platform"):
        _lowered_transport(requested, "all_reduce")
    assert any(key.startswith("fo_jax/nccl_unique_id/") for key in store.values)


def _lowered_all_gather_transport(config):
    """The transport in the plan attribute of an overlapped all-gather lowered for CUDA from CPU
    devices (the layout mocked by the caller): the design shape 8192x8192x2048 per rank."""
    from jax.sharding import PartitionSpec as P

    from conftest import cpu_mesh

    mesh = cpu_mesh((4,), ("tp",))
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.all_gather_matmul(x, w, axis_name="tp", config=config),
        mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
        out_specs=(P(None, "tp"), P("tp", None))))
    x = jax.ShapeDtypeStruct((SHAPE["m"], SHAPE["k"]), BF16)
    w = jax.ShapeDtypeStruct((SHAPE["k"], SHAPE["n"] * 4), BF16)
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "fo_jax_overlapped_matmul_v2" in text, "the all-gather took XLA's path"
    found = re.search(r"transport = (\d+) : i32", text)
    assert found, "no transport in the lowered plan"
    return int(found.group(1))


@needs_module
def test_all_gather_lowering_with_several_processes(processes, monkeypatch):
    """With 4 processes (mocked, as above) the overlapped all-gather lowers on NCCL unless it
    requests the copy engine, and a requested one where XLA's memory cannot be mapped raises at
    trace time; with one process it lowers on the copy engine unrequested, as before."""
    from fo_jax import _bootstrap

    mod = fo_jax._cuda.module()
    store = _Store()
    monkeypatch.setattr(_bootstrap, "_distributed_client", lambda: store)
    monkeypatch.setattr(_bootstrap, "_unique_ids", {})
    processes(4)
    default = fo_jax.OverlapConfig(**AG_ON)
    requested = fo_jax.OverlapConfig(transport="copy_engine", **AG_ON)
    assert _lowered_all_gather_transport(default) == mod.Transport["nccl"].value
    assert _lowered_all_gather_transport(requested) == mod.Transport["copy_engine"].value
    monkeypatch.setattr(_process_layout, "_pool", "XLA_PYTHON_CLIENT_ALLOCATOR=platform: ...")
    with pytest.raises(ValueError, match="XLA_PYTHON_CLIENT_ALLOCATOR=platform"):
        _lowered_all_gather_transport(requested)
    processes(1)
    assert _lowered_all_gather_transport(default) == mod.Transport["copy_engine"].value


# --- describe(): no exchange with the other processes ---


def _describe_on_4_processes(config=None, collective="reduce_scatter"):
    """fo_jax.describe of the design shape, traced on 4 CPU devices as if on CUDA devices of 4
    processes (the layout mocked by the caller)."""
    from jax.sharding import PartitionSpec as P

    from conftest import cpu_mesh

    mesh, seen = cpu_mesh((4,), ("tp",)), {}

    def body(x, w):
        seen["choice"] = fo_jax.describe(x, w, axis_name="tp", collective=collective,
                                         config=config)
        return x

    x = jax.ShapeDtypeStruct((SHAPE["m"], SHAPE["k"] * 4), BF16)
    w = jax.ShapeDtypeStruct((SHAPE["k"] * 4, SHAPE["n"]), BF16)
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                          out_specs=P(None, "tp"))).trace(x, w)
    return seen["choice"]


@needs_module
def test_describe_exchanges_nothing_with_the_other_processes(processes, monkeypatch):
    """A program may call describe() in one process only: before the first lowering has
    exchanged the hosts and probed CUDA IPC, describe() asks no other process (it would wait for
    processes that never join) and says what its copy-engine answer assumes; once they are
    known it answers from them."""
    from fo_jax import _checks

    monkeypatch.setattr(_checks, "trace_platform", lambda: "cuda")
    processes(4)
    monkeypatch.setattr(_process_layout, "_hosts", None)
    monkeypatch.setattr(_process_layout, "_ipc", None)

    def no_store():
        raise AssertionError("describe() asked the key-value store")

    monkeypatch.setattr(_process_layout, "_client", no_store)
    c = _describe_on_4_processes()
    assert (c.path, c.transport) == ("cuda", "copy_engine"), c
    assert "with 4 processes it holds if the first lowering" in c.reason, c.reason
    assert "not yet checked in this process" in c.reason, c.reason
    # Nothing was cached by the answer: the lowering still exchanges and probes.
    assert _process_layout._hosts is None and _process_layout._ipc is None
    # Turned off, or an all-reduce not requesting the copy engine: NCCL, nothing assumed. A
    # requested all-reduce: as the reduce-scatter (its check of XLA's memory asks no other
    # process).
    c = _describe_on_4_processes(OPT_OUT)
    assert c.transport == "nccl" and "turned off" in c.reason, c.reason
    c = _describe_on_4_processes(collective="all_reduce")
    assert c.transport == "nccl" and "not yet checked" not in c.reason, c.reason
    c = _describe_on_4_processes(REQUESTED, collective="all_reduce")
    assert c.transport == "copy_engine" and "not yet checked" in c.reason, c.reason
    # The overlapped all-gather as the all-reduce (x [8192, 2048] and w [2048, 8192] per rank
    # are its operands too).
    c = _describe_on_4_processes(fo_jax.OverlapConfig(**AG_ON), collective="all_gather")
    assert c.transport == "nccl" and "opt-in" in c.reason, c.reason
    assert "not yet checked" not in c.reason, c.reason
    c = _describe_on_4_processes(fo_jax.OverlapConfig(transport="copy_engine", **AG_ON),
                                 collective="all_gather")
    assert c.transport == "copy_engine" and "not yet checked" in c.reason, c.reason
    # After the lowering's exchanges: their answers, without the note.
    monkeypatch.setattr(_process_layout, "_hosts", ("node-a",) * 4)
    monkeypatch.setattr(_process_layout, "_ipc", "")
    c = _describe_on_4_processes()
    assert c.transport == "copy_engine" and "not yet checked" not in c.reason, c.reason
    monkeypatch.setattr(_process_layout, "_ipc", "GPU 0 of process 2 cannot write ...")
    c = _describe_on_4_processes()
    assert c.transport == "nccl" and "CUDA IPC probe between the processes failed" in c.reason
    monkeypatch.setattr(_process_layout, "_hosts", ("node-a", "node-a", "node-b", "node-b"))
    monkeypatch.setattr(_process_layout, "_ipc", None)
    c = _describe_on_4_processes()
    assert c.transport == "nccl" and "span 2 hosts" in c.reason, c.reason

