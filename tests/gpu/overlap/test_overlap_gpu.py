"""The overlapped CUDA path on 2+ GPUs against the reference: both collectives, bf16/fp16,
several shapes (M per rank not a multiple of the tile too), 1000 back-to-back calls, XLA's own
collectives in the same jit, a 2x2 mesh, and one process per GPU."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import free_port, gpu_devices_or_skip, tp_or_skip
from numerics import REL_TOL, assert_close, explain_mismatch, random_operands, rel_err
from worker_processes import wait_all, with_stack_dumps

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _protocol_state_after_each_test():
    """Diagnostics (FO_JAX_DEBUG_STATES=1, with -s): after each test, every fo_jax communicator's
    call count (epoch) and copy-engine flags, one line per GPU (comm/copy_engine.h): the ranks of
    a group must agree on the epoch."""
    yield
    if os.environ.get("FO_JAX_DEBUG_STATES") == "1" and fo_jax.cuda_module_available():
        from fo_jax import _diagnostics

        print()
        _diagnostics.print_comm_states()


def _mesh(n, shape=None, names=("tp",)):
    devs = gpu_devices_or_skip(n)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    return Mesh(np.array(devs).reshape(shape or (n,)), names)


# Test shapes are small: without this the size fallback would send them to XLA's path.
NO_FALLBACK = fo_jax.OverlapConfig(allow_fallback=False)


def _tp_fn(mesh, collective, data_axis=None, config=NO_FALLBACK, use_reference=False):
    def body(x, w):
        if use_reference:
            return fo_jax.reference.overlapped_matmul(x, w, "tp", collective)
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                        config=config)

    if collective == "reduce_scatter":
        out = P((data_axis, "tp") if data_axis else "tp", None)
    else:
        out = P(data_axis, None)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(data_axis, "tp"), P("tp", None)),
                                 out_specs=out))


SHAPES = [  # global (M, N, K_total); per rank K = K_total / tp
    (1024, 1024, 2048),
    (4096, 512, 1024),
    (800, 264, 544),  # M per rank (tp 4: 200, tp 2: 400) not a multiple of any tile
    (2048, 8192, 1024),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_overlap_matches_reference(collective, shape, dtype):
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, k = shape
    rng = np.random.default_rng(hash((collective, shape)) % 2**32)
    x, w, x64, w64 = random_operands(rng, m, k, n, dtype)
    f = _tp_fn(mesh, collective)
    assert "fo_jax_overlapped_matmul_v2" in f.lower(x, w).as_text()
    out = f(x, w)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (m, n)
    assert_close(out, x64 @ w64, dtype)
    ref = _tp_fn(mesh, collective, use_reference=True)(x, w)
    assert_close(out, np.asarray(ref.astype(jnp.float32)), dtype, factor=2.0)


def test_explicit_partition_and_options():
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, k = 2048, 1024, 1024
    rng = np.random.default_rng(2)
    x, w, x64, w64 = random_operands(rng, m, k, n, jnp.bfloat16)
    for cfg in (fo_jax.OverlapConfig(num_groups=1, sm_budget=100, nccl_max_ctas=8,
                                     allow_fallback=False),
                fo_jax.OverlapConfig(num_groups=3, allow_fallback=False)):
        out = _tp_fn(mesh, "reduce_scatter", config=cfg)(x, w)
        assert_close(out, x64 @ w64, jnp.bfloat16)


def _assert_every_copy_close(out, expect64, dtype, factor=1.0):
    """Every device's copy of a replicated (all-reduce) result, not only the one numpy reads."""
    for shard in out.addressable_shards:
        assert_close(np.asarray(shard.data.astype(jnp.float32)), expect64[shard.index], dtype,
                     factor=factor)


def _assert_all_calls_close(outs, x64, w64, tp, collective, dtype=jnp.bfloat16):
    """Every call's result (every GPU's copy of an all-reduce) against the float64 product; a
    failure names the calls and, per GPU copy, the bands and rows that are off and the rank's
    partial product that explains them (numerics.explain_mismatch)."""
    expect = x64 @ w64
    problems = []
    for i, out in enumerate(outs):
        copies = ([np.asarray(s.data.astype(jnp.float32)) for s in out.addressable_shards]
                  if collective == "all_reduce" else [np.asarray(out.astype(jnp.float32))])
        for c, got in enumerate(copies):
            if rel_err(got, expect) > REL_TOL[jnp.dtype(dtype)]:
                problems.append(f"call {i} copy {c}: {explain_mismatch(got, x64, w64, tp)}")
    assert not problems, f"{len(problems)} wrong results: " + " | ".join(problems[:8])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_transports_agree(collective, dtype):
    """Copy-engine and NCCL transports against the float64 product and each other (every GPU's
    copy of an all-reduce); the copy engine is the default where it can run."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, k = 512 * tp, 1024, 2048
    rng = np.random.default_rng(7)
    x, w, x64, w64 = random_operands(rng, m, k, n, dtype)
    outs = {}
    for transport in ("copy_engine", "nccl"):
        cfg = fo_jax.OverlapConfig(transport=transport, allow_fallback=False)
        f = _tp_fn(mesh, collective, config=cfg)
        outs[transport] = f(x, w)
        assert outs[transport].dtype == jnp.dtype(dtype)
        assert_close(outs[transport], x64 @ w64, dtype)
        _assert_every_copy_close(outs[transport], x64 @ w64, dtype)
    assert_close(outs["copy_engine"], np.asarray(outs["nccl"].astype(jnp.float32)), dtype,
                 factor=2.0)

    def body(x, w):
        choice = fo_jax.describe(x, w, axis_name="tp", collective=collective,
                                 config=NO_FALLBACK)
        seen.append(choice)
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                        config=NO_FALLBACK)

    seen = []
    out_spec = P("tp", None) if collective == "reduce_scatter" else P(None, None)
    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                          out_specs=out_spec)).lower(x, w)
    assert seen[0].path == "cuda" and seen[0].transport == "copy_engine", seen[0]


@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_copy_engine_all_reduce_rounds(rounds):
    """The copy-engine all-reduce in 1, 2 and 4 rounds (rounds before the last summed and
    gathered next to the GEMM on the SMs it leaves free) against the float64 product, on every
    GPU's copy, back to back."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    rng = np.random.default_rng(10 + rounds)
    x, w, x64, w64 = random_operands(rng, 1024 * tp, 1024, 1536, jnp.bfloat16)
    cfg = fo_jax.OverlapConfig(transport="copy_engine", copy_engine_rounds=rounds,
                               allow_fallback=False)
    f = _tp_fn(mesh, "all_reduce", config=cfg)
    outs = [f(x, w) for _ in range(20)]
    jax.block_until_ready(outs)
    _assert_all_calls_close(outs, x64, w64, tp, "all_reduce")


@pytest.mark.parametrize("parts,sum_split,ring", [
    (1, "one", False), (2, "bands", False), (3, "one", True), (4, "bands", False),
    (2, "rows", True), (3, "rows", False), (4, "bands", True)])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_copy_engine_group_partitions(collective, parts, sum_split, ring):
    """Each chunk copied in 1-4 pieces (OverlapConfig.copy_engine_chunk_groups: one group each,
    copied as soon as it is done) and the last round summed in one pass, by bands or by rows
    (one pass per piece of the last chunk); or (ring, reduce-scatter) the ring: every piece sent
    to the previous rank, added by its GEMM's epilogue once its flag is in, the own band stored
    into the output by the GEMM; against the float64 product on every GPU's copy, back to back;
    the all-reduce in 2 rounds."""
    from fo_jax import _plan

    tp = tp_or_skip()
    mesh = _mesh(tp)
    rounds = 2 if collective == "all_reduce" else None
    rng = np.random.default_rng(20 + parts)
    x, w, x64, w64 = random_operands(rng, 2048 * tp, 1024, 1536, jnp.bfloat16)
    # The config with a ring kernel (the copy-engine shapes' own).
    cfg = fo_jax.OverlapConfig(transport="copy_engine", copy_engine_rounds=rounds,
                               allow_fallback=False, gemm_config="pp_128x192x64_c2",
                               copy_engine_ring=ring, copy_engine_chunk_groups=parts,
                               copy_engine_sum_split=sum_split)
    plan = _plan.plan_overlap("test", collective, tp, jnp.dtype(jnp.bfloat16), 2048 * tp, 1536,
                              1024 // tp, cfg, "copy_engine")  # per-rank x[M, K / tp]
    h = plan.rounds
    assert plan.num_groups == h * (parts * (tp - 1) + 1), plan
    assert plan.ring == (ring and collective == "reduce_scatter"), plan
    if not plan.ring:
        assert plan.sum_split == sum_split
    f = _tp_fn(mesh, collective, config=cfg)
    outs = [f(x, w) for _ in range(20)]
    jax.block_until_ready(outs)
    _assert_all_calls_close(outs, x64, w64, tp, collective)


@pytest.mark.parametrize("ring", [None, True], ids=["default", "ring"])
@pytest.mark.parametrize("m", [4096, 8192])
def test_benchmark_scale_reduce_scatter(m, ring):
    """The benchmark's short-K reduce-scatter shapes (per GPU x[m, 2048] @ w[2048, 8192]) with
    the default plan, and with the ring forced (copy_engine_ring=True), against the float64
    product, three calls back to back: their plans (group partitions, sums by rows, the ring's
    pieces) are not the small test shapes'."""
    from fo_jax import _plan

    tp = tp_or_skip()
    mesh = _mesh(tp)
    n, k = 8192, 2048
    rng = np.random.default_rng(m + tp)
    x, w, x64, w64 = random_operands(rng, m, k * tp, n, jnp.bfloat16)
    cfg = fo_jax.OverlapConfig(copy_engine_ring=ring)
    plan = _plan.plan_overlap("test", "reduce_scatter", tp, jnp.dtype(jnp.bfloat16), m, n, k,
                              cfg, "copy_engine")
    if ring:
        assert plan.ring, plan
    f = _tp_fn(mesh, "reduce_scatter", config=cfg)
    assert "fo_jax_overlapped_matmul_v2" in f.lower(x, w).as_text()
    outs = [f(x, w) for _ in range(3)]
    jax.block_until_ready(outs)
    _assert_all_calls_close(outs, x64, w64, tp, "reduce_scatter")


def test_copy_engine_shapes_change_between_calls():
    """The receive and publish buffers grow when a larger call arrives (all ranks together) and
    smaller calls reuse them; calls of different sizes and both collectives interleave, back to
    back, without a hang (reduce-scatter calls in between must not confuse the all-reduce's
    publish handshake)."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    cfg = fo_jax.OverlapConfig(transport="copy_engine", allow_fallback=False)
    fns = [_tp_fn(mesh, c, config=cfg) for c in ("reduce_scatter", "all_reduce")]
    rng = np.random.default_rng(8)
    cases = [random_operands(rng, rows * tp, 2048, 512, jnp.bfloat16) for rows in (256, 1024)]
    # (size, collective) per call: runs of 3 calls of one size, collectives in a 5-cycle.
    schedule = [((i // 3) % 2, int(i % 5 in (1, 2, 4))) for i in range(90)]
    outs = []
    for size, coll in schedule:
        x, w, _, _ = cases[size]
        outs.append(fns[coll](x, w))
    jax.block_until_ready(outs)
    for i in (-1, -2, -3, -5, -6):
        size, coll = schedule[i]
        _, _, x64, w64 = cases[size]
        assert_close(outs[i], x64 @ w64, jnp.bfloat16)
        if coll == 1:
            _assert_every_copy_close(outs[i], x64 @ w64, jnp.bfloat16)


@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
def test_group_counters_carry_across_calls(transport):
    """The GEMM's group counters are the communicator's and calls that succeed do not zero them
    (csrc/comm/group_counters.h): each call's transport waits for the call's own tiles past
    what the earlier calls counted. Calls of two sizes (different group tables) and both
    collectives interleave on one communicator, and every call's result is checked. Every call
    has operands of its own: a wait that passed early would move another call's tiles."""
    tp = tp_or_skip()
    mesh = _mesh(tp)
    cfg = fo_jax.OverlapConfig(transport=transport, allow_fallback=False)
    fns = [_tp_fn(mesh, c, config=cfg) for c in ("reduce_scatter", "all_reduce")]
    rng = np.random.default_rng(21)
    schedule = [(i % 2, (i // 2) % 2) for i in range(16)]  # (size, collective) per call
    cases = [random_operands(rng, (256, 2048)[size] * tp, 4096, 1024, jnp.bfloat16)
             for size, _ in schedule]
    outs = [fns[coll](*ops[:2]) for (_, coll), ops in zip(schedule, cases)]
    jax.block_until_ready(outs)
    for i, (out, (size, coll)) in enumerate(zip(outs, schedule)):
        _, _, x64, w64 = cases[i]
        err = rel_err(out, x64 @ w64)
        assert err <= REL_TOL[jnp.dtype(jnp.bfloat16)], (
            f"call {i} of {len(schedule)} ({('reduce_scatter', 'all_reduce')[coll]}, size "
            f"{size}): relative error {err:.3e}\n" + explain_mismatch(out, x64, w64, tp))


@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
def test_group_counters_zeroed_after_a_failed_call(transport):
    """After a call that fails, the next call zeroes the communicator's counters, every word of
    them (csrc/comm/group_counters.h): a call with few groups right after the failure, then calls
    with more groups, whose extra words held the earlier calls' counts, all match the reference.
    Every call has operands of its own, so a wait that passed early reads another call's tiles.
    The NCCL transport takes the group counts as given (8, then 2, then 8, on one communicator:
    the same CTA bound); the copy engine plans its own from the shape (two sizes)."""
    from fo_jax import _cuda

    tp = tp_or_skip()
    mesh = _mesh(tp)
    rng = np.random.default_rng(22)

    def operands(rows):
        return random_operands(rng, rows * tp, 4096, 2048, jnp.bfloat16)

    if transport == "nccl":
        f_many, f_few = (_tp_fn(mesh, "reduce_scatter", config=fo_jax.OverlapConfig(
            transport="nccl", num_groups=g, nccl_max_ctas=8, allow_fallback=False))
            for g in (8, 2))
        many_rows = few_rows = 2048
    else:
        f_many = f_few = _tp_fn(mesh, "reduce_scatter", config=fo_jax.OverlapConfig(
            transport="copy_engine", allow_fallback=False))
        many_rows, few_rows = 2048, 256
    jax.block_until_ready([f_many(*operands(many_rows)[:2]) for _ in range(3)])
    _cuda.module().inject_async_error_for_tests(6, -1)  # ncclRemoteError on every rank
    try:
        with pytest.raises(Exception, match=r"NCCL \(asynchronous\) failed"):
            jax.block_until_ready(f_many(*operands(many_rows)[:2]))
    finally:
        _cuda.module().inject_async_error_for_tests(0)
    calls = [(f_few, operands(few_rows))] + [(f_many, operands(many_rows)) for _ in range(4)]
    outs = [f(*ops[:2]) for f, ops in calls]
    jax.block_until_ready(outs)
    for i, (out, (_, (_, _, x64, w64))) in enumerate(zip(outs, calls)):
        err = rel_err(out, x64 @ w64)
        assert err <= REL_TOL[jnp.dtype(jnp.bfloat16)], (
            f"call {i} after the failure: relative error {err:.3e}\n"
            + explain_mismatch(out, x64, w64, tp))


def test_copy_engine_reuses_its_copy_graphs():
    """Each copy into a peer is a launch of a graph re-pointed at the call's buffers
    (docs/design.md, "The copy thread and copy graphs"): once warm, calls on new buffers build
    no more graphs (an update that fails would build a new graph per copy)."""
    from fo_jax import _cuda

    tp = tp_or_skip()
    mesh = _mesh(tp)
    cfg = fo_jax.OverlapConfig(transport="copy_engine", allow_fallback=False)
    rng = np.random.default_rng(12)
    calls = 20
    for collective in ("reduce_scatter", "all_reduce"):
        f = _tp_fn(mesh, collective, config=cfg)
        x, w, x64, w64 = random_operands(rng, 512 * tp, 1024, 1024, jnp.bfloat16)
        jax.block_until_ready(f(x, w))
        before = _cuda.module().copy_engine_counts()
        outs = [f(x, w) for _ in range(calls)]  # all kept alive: each call gets new buffers
        jax.block_until_ready(outs)
        after = _cuda.module().copy_engine_counts()
        used = [(b, a) for b, a in zip(before, after) if a[2] > b[2]]
        assert len(used) == tp, (collective, before, after)
        for b, a in used:
            assert a[2] - b[2] >= calls * (tp - 1), (collective, b, a)
            assert a[3] == b[3], (f"{collective}: copy graphs rebuilt (device, rank, copies, "
                                  f"built): {b} -> {a}")
        assert_close(outs[-1], x64 @ w64, jnp.bfloat16)


def test_copy_engine_refusals_at_trace_time():
    tp = tp_or_skip()
    mesh = _mesh(tp)
    rng = np.random.default_rng(9)
    cfg = fo_jax.OverlapConfig(transport="copy_engine", allow_fallback=False)
    x, w, _, _ = random_operands(rng, 200 * tp, 1024, 512, jnp.bfloat16)  # 200 rows per rank
    for collective in ("reduce_scatter", "all_reduce"):
        with pytest.raises(ValueError, match="not a multiple"):
            _tp_fn(mesh, collective, config=cfg).lower(x, w)
    grouped = fo_jax.OverlapConfig(transport="copy_engine", num_groups=3, allow_fallback=False)
    with pytest.raises(ValueError, match="group partition"):
        _tp_fn(mesh, "reduce_scatter", config=grouped).lower(x, w)


# "placed": inputs already sharded over the mesh (as in a model); "resharded": single-GPU arrays,
# which JAX slices on GPU 0 and copies to the others before every call (XLA transfers between
# the calls: the case that stalled at TP=4 with too few hardware queues, docs/troubleshooting.md).
# Placed first, so that it runs where the stall happened.
@pytest.mark.parametrize("inputs", ["placed", "resharded"])
def test_thousand_back_to_back_calls(inputs):
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, k = 1024, 1024, 1024
    rng = np.random.default_rng(3)
    for collective in ("reduce_scatter", "all_reduce"):
        x, w, x64, w64 = random_operands(rng, m, k, n, jnp.bfloat16)
        if inputs == "placed":
            x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P(None, "tp")))
            w = jax.device_put(w, jax.sharding.NamedSharding(mesh, P("tp", None)))
        f = _tp_fn(mesh, collective)
        outs = [f(x, w) for _ in range(1000)]
        jax.block_until_ready(outs)
        assert_close(outs[-1], x64 @ w64, jnp.bfloat16)
        np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[-1]))


@pytest.mark.parametrize("one_rank", [False, True])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("transport", ["nccl", "copy_engine"])
def test_async_nccl_error_becomes_an_exception(transport, collective, one_rank):
    """An asynchronous NCCL error on the communicator of every rank, or of the last rank only
    (injected through the module's test hook: NCCL's own detection cannot be provoked on a
    healthy machine), fails the call with a Python exception carrying NCCL's message, without a
    hang: the other ranks, whose work may already be enqueued, are not left waiting for the
    failed one (comm/comm_registry.h). The group stays failed (the next call raises too) until
    the error is gone; then calls work again."""
    from fo_jax import _cuda

    tp = tp_or_skip()
    mesh = _mesh(tp)
    rng = np.random.default_rng(30)
    x, w, x64, w64 = random_operands(rng, 512 * tp, 1024, 1024, jnp.bfloat16)
    cfg = fo_jax.OverlapConfig(transport=transport, allow_fallback=False)
    f = _tp_fn(mesh, collective, config=cfg)
    jax.block_until_ready(f(x, w))
    remote_error = 6  # ncclRemoteError
    _cuda.module().inject_async_error_for_tests(remote_error, tp - 1 if one_rank else -1)
    try:
        with pytest.raises(Exception, match=r"NCCL \(asynchronous\) failed: .*remote.* on rank"):
            jax.block_until_ready(f(x, w))
        with pytest.raises(Exception, match=r"NCCL \(asynchronous\) failed: .*group stays failed"):
            jax.block_until_ready([f(x, w) for _ in range(3)])
    finally:
        _cuda.module().inject_async_error_for_tests(0)
    outs = [f(x, w) for _ in range(5)]
    jax.block_until_ready(outs)
    expect = x64 @ w64
    if collective == "all_reduce":
        _assert_every_copy_close(outs[-1], expect, jnp.bfloat16)
    else:
        assert_close(outs[-1], expect, jnp.bfloat16)


def test_with_xla_collectives_in_the_same_jit():
    tp = tp_or_skip()
    mesh = _mesh(tp)
    m, n, k = 1024, 512, 1024
    rng = np.random.default_rng(4)
    x, w, x64, w64 = random_operands(rng, m, k, n, jnp.bfloat16)
    z = jnp.asarray(rng.standard_normal((tp * 64, 32)), jnp.float32)

    def body(x, w, z):
        a = jax.lax.psum(z, "tp")
        y = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter",
                                     config=NO_FALLBACK)
        b = jax.lax.all_gather(z, "tp", tiled=True)
        y2 = fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_reduce",
                                      config=NO_FALLBACK)
        return y, y2, a, b

    f = jax.jit(jax.shard_map(
        body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P("tp", None)),
        out_specs=(P("tp", None), P(), P(), P("tp", None))))
    for _ in range(3):
        y, y2, a, b = f(x, w, z)
    z64 = np.asarray(z, np.float64)
    assert_close(y, x64 @ w64, jnp.bfloat16)
    assert_close(y2, x64 @ w64, jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(a), z64.reshape(tp, 64, 32).sum(0), rtol=1e-5,
                               atol=1e-5)
    # all_gather's result varies by type (not invariant): every device holds the whole z.
    np.testing.assert_array_equal(np.asarray(b), np.tile(np.asarray(z), (tp, 1)))


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_2x2_mesh_two_communicators(collective):
    mesh = _mesh(4, (2, 2), ("data", "tp"))
    m, n, k = 2048, 1024, 1024
    rng = np.random.default_rng(5)
    x, w, x64, w64 = random_operands(rng, m, k, n, jnp.bfloat16)
    out = _tp_fn(mesh, collective, data_axis="data")(x, w)
    assert_close(out, x64 @ w64, jnp.bfloat16)


def _one_process_per_gpu(worker: str, hang: str, **env_extra) -> list:
    """Runs tests/<worker> in one process per GPU (tp_or_skip() of them) and returns their outputs;
    fails with `hang` (each process's last output and Python stacks) if any runs past 240 s
    (FO_JAX_TEST_PROCESS_TIMEOUT_S)."""
    nproc = tp_or_skip()
    port = free_port()
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "workers",
                        worker)
    # JAX's preallocated pool, as users run (the copy-engine all-reduce across processes maps
    # it, and needs it to be one allocation), but small: this process's JAX already holds most
    # of every GPU's memory.
    env = with_stack_dumps(dict(os.environ, NCCL_NVLS_ENABLE="0",
                                XLA_PYTHON_CLIENT_PREALLOCATE="true",
                                XLA_PYTHON_CLIENT_MEM_FRACTION="0.05"))
    env.pop("XLA_CLIENT_MEM_FRACTION", None)
    env.update(env_extra)
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, path, str(i), str(nproc), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(nproc)]
    return wait_all(procs, 240, hang)


def test_one_process_per_gpu():
    outs = _one_process_per_gpu("multiprocess_worker.py", "one-process-per-GPU run hung")
    for i, (returncode, out) in enumerate(outs):
        assert returncode == 0, f"process {i} failed:\n{out[-3000:]}"
        assert "WORKER OK" in out, out[-3000:]


def test_one_process_per_gpu_failure():
    """One process per GPU, the last one's communicator breaks (multiprocess_failure_worker.py):
    it raises with NCCL's message; the others, whose collectives wait for it inside NCCL, are
    freed by the progress watchdog (FO_JAX_COMM_TIMEOUT_S=5 here) and raise on a later call. No
    process hangs."""
    outs = _one_process_per_gpu("multiprocess_failure_worker.py",
                                "a process hung after another one's communicator failed",
                                FO_JAX_COMM_TIMEOUT_S="5")
    nproc = len(outs)
    for i, (_, out) in enumerate(outs):
        assert f"process {i}: first call done" in out, out[-3000:]
        assert f"process {i}: RAISED" in out, out[-3000:]
        if i == nproc - 1:
            assert "NCCL (asynchronous) failed" in out and "aborted" in out, out[-3000:]
        else:  # freed by the watchdog (or by NCCL's own detection of the failed peer)
            assert "no progress for 5 s" in out or "NCCL" in out, out[-3000:]


def test_unusable_communicator_aborts_the_group():
    """An asynchronous error that leaves one rank's communicator unable to run the NCCL
    transport's collectives (injected as `broken`) makes that rank abort every communicator of
    the group in this process, which ends the collectives the other ranks may already have
    enqueued: the call raises instead of hanging, later calls of the group raise at once, and a
    new group (new unique ids) works. Its own communicators (nccl_max_ctas=7 is a key of its
    own), so the other tests' are not aborted."""
    from fo_jax import _bootstrap, _cuda

    tp = tp_or_skip()
    mesh = _mesh(tp)
    rng = np.random.default_rng(31)
    x, w, x64, w64 = random_operands(rng, 512 * tp, 1024, 1024, jnp.bfloat16)
    cfg = fo_jax.OverlapConfig(transport="nccl", nccl_max_ctas=7, allow_fallback=False)
    f = _tp_fn(mesh, "reduce_scatter", config=cfg)
    jax.block_until_ready([f(x, w) for _ in range(3)])
    _cuda.module().inject_async_error_for_tests(6, tp - 1, True)
    try:
        # The broken rank reports the abort; a rank that checked between the failure and the
        # abort ran its call and reports the failure.
        with pytest.raises(Exception,
                           match=r"NCCL \(asynchronous\) failed: .*(aborted|group stays failed)"):
            jax.block_until_ready([f(x, w) for _ in range(3)])
    finally:
        _cuda.module().inject_async_error_for_tests(0)
    with pytest.raises(Exception, match=r"aborted .*restart the process"):
        jax.block_until_ready(f(x, w))
    # A new communicator (new unique ids, so a fresh lowering) is not affected.
    for key in [key for key in _bootstrap._unique_ids if key[1] == 7]:
        del _bootstrap._unique_ids[key]
    g = _tp_fn(mesh, "reduce_scatter", config=cfg)
    assert_close(g(x, w), x64 @ w64, jnp.bfloat16)
