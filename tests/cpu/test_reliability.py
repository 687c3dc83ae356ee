"""Reliability logic that runs without a GPU (docs/troubleshooting.md, "Reliability limits"): the
flags' wrap-safe epoch comparison (the module's own function), the test hooks' parsing, the
copy-engine communicator's naming (one per group), the plan-agreement check between processes
(a shared in-memory store standing in for JAX's key-value store; tests/workers/
plan_agreement_worker.py runs it between two real processes) and the resource report."""

import json
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from fo_jax import _bootstrap, _env

needs_module = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                  reason="CUDA module not built here (no nvcc at install time)")


def _cyclic_geq(seen: int, value: int) -> bool:
    """cuda.h's CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0."""
    d = (seen - value) % 2**32
    return (d - 2**32 if d >= 2**31 else d) >= 0


@needs_module
def test_epoch_compare_is_cyclic_like_stream_waits():
    mod = fo_jax._cuda.module()
    top = 2**32 - 1
    cases = [(5, 5, True), (4, 5, False), (6, 5, True), (0, top, True), (top, 0, False),
             (3, 2**32 - 8, True), (2**32 - 9, 2**32 - 8, False), (2**31 - 1, 0, True),
             (2**31, 0, False), (0, 2**31, False)]
    for seen, value, want in cases:
        assert mod.epoch_reached(seen, value) is want, (seen, value)
        assert _cyclic_geq(seen, value) is want, (seen, value)
    rng = np.random.default_rng(0)
    for seen, value in rng.integers(0, 2**32, size=(2000, 2), dtype=np.uint64):
        assert mod.epoch_reached(int(seen), int(value)) is _cyclic_geq(int(seen), int(value))


@needs_module
def test_epochs_across_the_wrap():
    """The protocol's waits from an epoch start near 2^32: each call waits for its own epoch
    (not yet reached by the previous call's flags) and for the previous epoch (the acks)."""
    mod = fo_jax._cuda.module()
    start = 2**32 - 8
    flag = start  # every flag starts at the epoch start
    for call in range(1, 33):
        e = (start + call) % 2**32
        assert not mod.epoch_reached(flag, e), call  # this call's flag is not there yet
        assert mod.epoch_reached(flag, (e - 1) % 2**32), call  # the previous call's is
        flag = e
        assert mod.epoch_reached(flag, e), call


def test_test_hooks_parse(monkeypatch):
    monkeypatch.delenv(_env.TEST_EPOCH_START, raising=False)
    monkeypatch.delenv(_env.TEST_FAIL, raising=False)
    assert _env.test_epoch_start() == 0 and _env.test_fail() == ("", -1)
    monkeypatch.setenv(_env.TEST_EPOCH_START, str(2**32 - 8))
    assert _env.test_epoch_start() == 2**32 - 8
    monkeypatch.setenv(_env.TEST_EPOCH_START, "0xfffffff8")
    assert _env.test_epoch_start() == 2**32 - 8
    for bad in ("-1", str(2**32), "soon"):
        monkeypatch.setenv(_env.TEST_EPOCH_START, bad)
        with pytest.raises(ValueError, match="FO_JAX_TEST_EPOCH_START"):
            _env.test_epoch_start()
    monkeypatch.setenv(_env.TEST_FAIL, "alloc:1")
    assert _env.test_fail() == ("alloc", 1)
    monkeypatch.setenv(_env.TEST_FAIL, "setup:0")
    assert _env.test_fail() == ("setup", 0)
    for bad in ("alloc", "melt:1", "alloc:x"):
        monkeypatch.setenv(_env.TEST_FAIL, bad)
        with pytest.raises(ValueError, match="FO_JAX_TEST_FAIL"):
            _env.test_fail()
    monkeypatch.setenv(_env.PLAN_TIMEOUT_S, "2.5")
    assert _env.plan_timeout_s() == 2.5
    monkeypatch.setenv(_env.PLAN_TIMEOUT_S, "0")
    assert _env.plan_timeout_s() == _env.DEFAULT_PLAN_TIMEOUT_S


@needs_module
def test_module_refuses_an_unknown_failure_stage():
    mod = fo_jax._cuda.module()
    with pytest.raises(ValueError, match="unknown stage"):
        mod.set_test_hooks(0, "melt", 0)
    for stage in _env.TEST_FAIL_STAGES:  # every stage FO_JAX_TEST_FAIL accepts, the module too
        mod.set_test_hooks(0, stage, 7)
    mod.set_test_hooks(0, "", -1)  # the defaults: no hook


def _plan(transport, collective="reduce_scatter", config=None, rows=8192, size=4):
    from fo_jax import _plan as plan_mod

    return plan_mod.plan_overlap("test", collective, size, jnp.dtype(jnp.bfloat16), rows, 8192,
                                 2048, config, transport)


@needs_module
def test_copy_engine_communicator_ignores_the_nccl_cta_bound():
    """H5: the copy-engine transport names its communicator without the NCCL CTA bound, so the
    shapes of one group share one communicator; the NCCL transport keeps its bound."""
    for ctas in (8, 32):
        config = fo_jax.OverlapConfig(nccl_max_ctas=ctas)
        assert _bootstrap.communicator_ctas(_plan("copy_engine", config=config)) == 0
        assert _bootstrap.communicator_ctas(_plan("nccl", config=config)) == ctas


class _Dev:
    def __init__(self, id_, process_index):
        self.id, self.process_index = id_, process_index


class _Store:
    """A key-value store shared by threads standing in for processes (JAX's client API)."""

    def __init__(self):
        self.values, self.cv = {}, threading.Condition()

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.cv:
            assert allow_overwrite or key not in self.values, key  # as JAX's store refuses
            self.values[key] = value
            self.cv.notify_all()

    def key_value_try_get(self, key):
        with self.cv:
            if key not in self.values:
                raise KeyError(f"NOT_FOUND: {key}")
            return self.values[key]

    def blocking_key_value_get(self, key, timeout_ms):
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.values, timeout_ms / 1000):
                raise TimeoutError(f"DEADLINE_EXCEEDED: {key}")
            return self.values[key]


def _agree(fields_by_process, timeout_s=5.0, group=None):
    """Runs check_plan_agreement as every process at once; the exception each raised."""
    group = group or [_Dev(i, i) for i in range(len(fields_by_process))]
    store, raised = _Store(), {}

    def run(p):
        try:
            if fields_by_process[p] is not None:
                _bootstrap.check_plan_agreement(group, fields_by_process[p], p, timeout_s, store)
        except Exception as e:  # noqa: BLE001 (recorded for the assertions)
            raised[p] = e

    threads = [threading.Thread(target=run, args=(p,)) for p in range(len(fields_by_process))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return raised


@needs_module
def test_plan_agreement_passes_for_equal_plans():
    fields = _bootstrap.plan_fields(_plan("nccl"))
    assert _agree([fields, fields]) == {}
    assert _bootstrap.plan_digest(fields) == _bootstrap.plan_digest(json.loads(json.dumps(fields)))


@needs_module
def test_plan_mismatch_raises_on_every_process_naming_the_fields():
    """H3: two processes plan the same call differently (another tuning-cache entry or
    OverlapConfig: here 8 groups against the default): both raise, naming the field."""
    a = _bootstrap.plan_fields(_plan("nccl"))
    b = _bootstrap.plan_fields(_plan("nccl", config=fo_jax.OverlapConfig(num_groups=8)))
    assert a != b
    raised = _agree([a, b])
    assert set(raised) == {0, 1}
    for p, e in raised.items():
        assert isinstance(e, ValueError)
        assert "plan mismatch" in str(e) and "gemm.group_begin" in str(e), str(e)
        assert f"process {1 - p}" in str(e)


@needs_module
def test_plan_agreement_names_a_process_that_publishes_nothing():
    """A process that lowers no such call (it took the reference path) makes the others raise
    once the timeout has passed, naming it."""
    fields = _bootstrap.plan_fields(_plan("copy_engine"))
    raised = _agree([fields, None], timeout_s=0.5)
    assert set(raised) == {0}
    assert isinstance(raised[0], RuntimeError)
    assert "process 1 published no plan" in str(raised[0])


@needs_module
def test_plan_agreement_names_each_call_by_its_identity():
    """The same call re-checked publishes nothing new; another call (other explicit config) is
    its own key; the same call planned differently by one process raises there."""
    a = _bootstrap.plan_fields(_plan("nccl"))
    b = _bootstrap.plan_fields(_plan("nccl", config=fo_jax.OverlapConfig(num_groups=8)))
    plan = _plan("nccl")
    same = _bootstrap.call_identity(plan, (), _bootstrap.explicit_config(None))
    other = _bootstrap.call_identity(
        plan, (), _bootstrap.explicit_config(fo_jax.OverlapConfig(num_groups=8)))
    assert same != other and other["config"] == {"num_groups": 8}
    group, store = [_Dev(0, 0), _Dev(1, 1)], _Store()

    def both(fields, identity):
        raised = {}

        def run(p):
            try:
                _bootstrap.check_plan_agreement(group, fields, p, 5.0, store, identity)
            except Exception as e:  # noqa: BLE001 (recorded for the assertions)
                raised[p] = e

        threads = [threading.Thread(target=run, args=(p,)) for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return raised

    assert both(a, same) == {} and both(a, same) == {} and both(b, other) == {}
    with pytest.raises(ValueError, match="differently at two lowerings: gemm.group_begin"):
        _bootstrap.check_plan_agreement(group, b, 0, 5.0, store, same)


def test_plan_agreement_skips_groups_of_one_process():
    group = [_Dev(0, 0), _Dev(1, 0)]
    _bootstrap.check_plan_agreement(group, {"a": 1}, 0, 0.1, client=object())  # no store use


def test_plan_fields_name_operands_and_nested_fields():
    from fo_jax._plan import GemmPlan, OverlapPlan

    plan = OverlapPlan("all_reduce", "nccl", 2, GemmPlan(0, "c", 128, 128, (0, 4, 8), -16), 32)
    x = jax_aval((256, 64))
    fields = _bootstrap.plan_fields(plan, (x, x))
    assert fields["gemm.group_begin"] == [0, 4, 8] and fields["nccl_max_ctas"] == 32
    assert fields["operand0"] == "bfloat16[256, 64]"
    other = dict(fields, operand1="bfloat16[256, 32]")
    message = _bootstrap.plan_mismatch(fields, other, 0, 1)
    assert "operand1" in message and "operand0" not in message
    assert _bootstrap.plan_mismatch(fields, dict(fields), 0, 1) is None


def jax_aval(shape):
    import jax

    return jax.core.ShapedArray(shape, jnp.bfloat16)


@needs_module
def test_device_resources_report():
    """The report's query and its lines agree; without GPUs nothing is held (with GPUs, earlier
    tests of this process may hold communicators: the README's command runs every test in one
    process)."""
    from conftest import gpus
    from fo_jax import info

    res = info.device_resources()
    n = len(res["communicators"])
    lines = info._resource_lines()
    assert lines[0].startswith(f"held outside XLA by this process: {n} communicator")
    assert {c["device"] for c in res["communicators"]} <= set(res["bytes_by_device"])
    assert len(lines) == 1 + len(res["bytes_by_device"])
    if not gpus():
        assert n == 0 and res["bytes_by_device"] == {}


@needs_module
@pytest.mark.parametrize("first_signal", [0, 2**32 - 8, 2**32 - 1])
def test_copy_thread_signals_are_wrap_safe(first_signal):
    """The copy thread awaits each call's signal (its epoch) before its acknowledgements; at the
    wrap (2^32 - 1, then 0) a plain >= would let the job run before the call signalled it."""
    before, after = fo_jax._cuda.module().host_worker_wrap_check(first_signal)
    assert (before, after) == (False, True)


def _lowered_rs_text(transport: str, ctas: int) -> str:
    """The lowered CUDA module of a 2-rank reduce-scatter over CPU devices."""
    import jax
    from jax.sharding import PartitionSpec as P

    from conftest import cpu_mesh

    mesh = cpu_mesh((2,), ("tp",))
    config = fo_jax.OverlapConfig(allow_fallback=False, transport=transport, nccl_max_ctas=ctas)
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp",
                                              collective="reduce_scatter", config=config),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None)))
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    return f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()


def _group_tokens(text: str) -> bytes:
    """The lowered call's group_tokens (MLIR prints a short array as a list, a long one in hex)."""
    import re

    value = re.search(r"group_tokens = dense<([^>]*)>", text).group(1)
    if value.startswith('"0x'):
        return bytes.fromhex(value[3:-1])
    return bytes(int(v) for v in value.strip("[]").split(","))


@needs_module
@pytest.mark.parametrize("transport", ["copy_engine", "nccl"])
def test_lowered_group_tokens_follow_the_communicator_naming(transport):
    """H5 at lowering: two copy-engine calls with different NCCL CTA bounds name the same group
    token (one communicator); on the NCCL transport each bound has its own. The token names the
    group's NCCL unique id in the CUDA module's registry, where the handler looks it up."""
    from fo_jax import _cuda

    tokens = {ctas: _group_tokens(_lowered_rs_text(transport, ctas)) for ctas in (8, 32)}
    assert (tokens[8] == tokens[32]) is (transport == "copy_engine")
    for ctas, token in tokens.items():
        key = (tuple(range(2)), 0 if transport == "copy_engine" else ctas)
        assert _cuda.module().group_unique_id(token) == _bootstrap._unique_ids[key]


@needs_module
def test_lowered_module_is_the_same_in_every_process():
    """H12: the NCCL unique id is new in every process, the lowered module is not (it names the
    id by a token), so JAX's persistent compilation cache can hit across runs."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import sys, hashlib; sys.path[:0] = [%r, %r]; import test_reliability as t; "
            "print(hashlib.sha256(t._lowered_rs_text('nccl', 8).encode()).hexdigest())"
            % (here, os.path.dirname(here)))
    where = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))  # this fo_jax
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p))
    digests = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300, cwd=here)
        assert p.returncode == 0, p.stderr[-3000:]
        digests.append(p.stdout.split()[-1])
    assert digests[0] == digests[1]
    assert "group_tokens" in _lowered_rs_text("nccl", 8)
