"""The calls that tests/workers/ipc_worker.py runs in one process per GPU and that
tests/gpu/overlap/test_copy_engine_processes_gpu.py repeats in one process, so that both compute
from the same operands with the same plan (bit-for-bit comparable); and what the
one-process-per-GPU workers share: the mesh of every process's GPU, the operands sharded over
it, the overlapped call on it and the check of a process's shard against float64."""

import jax.numpy as jnp
import numpy as np

import fo_jax

# (name, global M, N, K per rank, ring). In this order: the larger call grows every rank's
# receive buffer (a new generation: the peers map it and close their mappings of the old one),
# and the last one runs the first shape again on the grown buffers.
CASES = (
    ("ring", 4096, 1024, 512, True),
    ("direct", 4096, 1024, 512, False),
    ("direct_grown", 16384, 1024, 512, False),
    ("ring_after_growth", 4096, 1024, 512, True),
)
CALLS = 10  # back-to-back calls per case (every one must give the same bits)
# All-reduce cases (name, global M, N, K per rank, copy_engine_rounds), after CASES: one round,
# rounds summed next to the GEMM, and a larger call that grows the receive buffer again. The
# first one maps every peer's XLA memory; the later ones store through the same mappings.
AR_CASES = (
    ("ar_one_round", 4096, 1024, 512, 1),
    ("ar_two_rounds", 4096, 1024, 512, 2),
    ("ar_grown_four_rounds", 32768, 1024, 512, 4),
)

# Overlapped all-gather cases (name, rows of x per rank, N per rank, K, bands per rank), after
# AR_CASES: the first one maps every peer's XLA memory and opens the group's shared exchange;
# the later ones push through the same mappings. AG_CALLS back-to-back calls each: more than the
# ring of "call started" events (8), so every peer's ring is reused across the processes.
AG_CASES = (  # test_all_gather_gpu.py's SHAPES (None: the planner's bands)
    ("ag_planned_bands", 512, 1024, 2048, None),
    ("ag_odd_n_k", 1024, 392, 136, 2),
    ("ag_four_bands", 2048, 4096, 1024, 4),
)
AG_CALLS = 20


def config(ring: bool) -> "fo_jax.OverlapConfig":
    """The copy engine requested (a call it cannot take raises instead of running on NCCL)."""
    return fo_jax.OverlapConfig(allow_fallback=False, transport="copy_engine",
                                copy_engine_ring=ring)


def ar_config(rounds: int) -> "fo_jax.OverlapConfig":
    """The copy-engine all-reduce requested, in `rounds` rounds."""
    return fo_jax.OverlapConfig(allow_fallback=False, transport="copy_engine",
                                copy_engine_rounds=rounds)


def ag_config(bands) -> "fo_jax.OverlapConfig":
    """The overlapped all-gather on the copy engine requested (opt-in across processes), with
    `bands` bands per rank (None: the planner's); small shapes, so no fallback to XLA's
    path."""
    return fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False,
                                transport="copy_engine", num_groups=bands)


def ag_fn(mesh, cfg):
    """all_gather_matmul over "tp" on x sharded by rows and w by columns, jitted: (y, gathered
    x), y [M, N] sharded by columns, the gathered x stacked by rank."""
    import jax
    from jax.sharding import PartitionSpec as P

    return jax.jit(jax.shard_map(
        lambda a, b: fo_jax.all_gather_matmul(a, b, axis_name="tp", config=cfg),
        mesh=mesh, in_specs=(P("tp", None), P(None, "tp")),
        out_specs=(P(None, "tp"), P("tp", None))))


def ag_operands(rows: int, n: int, k: int, nproc: int, seed: int):
    """Global x[rows * nproc, k] and w[k, n * nproc] as bf16 NumPy arrays, and their float64
    product (the reference)."""
    return _bf16_operands((rows * nproc, k), (k, n * nproc), seed)


def shard_ag_operands(mesh, x, w):
    """Global x (rows sharded over "tp") and w (columns sharded) from NumPy arrays every process
    holds whole."""
    from jax.sharding import PartitionSpec as P

    return _global(mesh, x, P("tp", None)), _global(mesh, w, P(None, "tp"))


def lowered_transport(f, *args) -> int:
    """The transport (the CUDA module's Transport value) of the fo_jax call in f lowered on
    args."""
    import re

    found = re.search(r"transport = (\d+) : i32", f.lower(*args).as_text())
    assert found, "no fo_jax call in the lowered program"
    return int(found.group(1))


def _bf16_operands(x_shape, w_shape, seed: int):
    """x and w of these shapes as bf16 NumPy arrays (x scaled by 1/sqrt(K)), and their float64
    product."""
    rng = np.random.default_rng(seed)
    x = np.asarray(jnp.asarray(rng.standard_normal(x_shape) / np.sqrt(x_shape[1]),
                               jnp.bfloat16))
    w = np.asarray(jnp.asarray(rng.standard_normal(w_shape), jnp.bfloat16))
    return x, w, np.asarray(x, np.float64) @ np.asarray(w, np.float64)


def operands(m: int, n: int, k_rank: int, nproc: int, seed: int):
    """Global x[m, k_rank * nproc] and w[k_rank * nproc, n] as bf16 NumPy arrays, and their float64
    product (the reference)."""
    return _bf16_operands((m, k_rank * nproc), (k_rank * nproc, n), seed)


def tp_mesh():
    """The "tp" mesh of every process's GPU (after jax.distributed.initialize)."""
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), ("tp",))


def _global(mesh, a, spec):
    """A global array sharded by `spec` from a NumPy array every process holds whole."""
    import jax
    from jax.sharding import NamedSharding

    return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda i: a[i])


def shard_operands(mesh, x, w):
    """Global x (K sharded over "tp") and w (rows sharded) from NumPy arrays every process
    holds whole."""
    from jax.sharding import PartitionSpec as P

    return _global(mesh, x, P(None, "tp")), _global(mesh, w, P("tp", None))


def tp_fn(mesh, cfg, collective: str = "reduce_scatter"):
    """overlapped_matmul over "tp" on operands sharded by shard_operands, jitted."""
    import jax
    from jax.sharding import PartitionSpec as P

    out_spec = P("tp", None) if collective == "reduce_scatter" else P()
    return jax.jit(jax.shard_map(
        lambda a, b: fo_jax.overlapped_matmul(a, b, axis_name="tp", collective=collective,
                                              config=cfg),
        mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=out_spec))


def check_shard(out, ref, what: str) -> float:
    """This process's (only) shard of `out` against the float64 `ref` at its index: asserts a
    relative error under 1.5e-2 (bf16) and returns it."""
    (shard,) = out.addressable_shards
    got = np.asarray(shard.data.astype(jnp.float32), np.float64)
    want = ref[shard.index]
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert err < 1.5e-2, (what, err)
    return err


def sharded_call(nproc: int, transport: str = "copy_engine",
                 collective: str = "reduce_scatter"):
    """(f, (x, w), float64 product) for the failure workers, after jax.distributed.initialize:
    the copy-engine `collective` across processes (a reduce-scatter in the direct form; transport
    "nccl": the NCCL transport's) over a mesh of every process's GPU, on the operands of
    4096 x 1024 with 512 columns of K per rank (seed 5), sharded for it; "all_gather": the
    overlapped all-gather's product (AG_CASES' first shape, the planner's bands)."""
    mesh = tp_mesh()
    if collective == "all_gather":  # its product only (the gathered x is checked elsewhere)
        x, w, ref = ag_operands(512, 1024, 2048, nproc, 5)
        cfg = ag_config(None) if transport == "copy_engine" else fo_jax.OverlapConfig(
            all_gather="overlap", allow_fallback=False, transport=transport)
        both = ag_fn(mesh, cfg)
        return (lambda a, b: both(a, b)[0]), shard_ag_operands(mesh, x, w), ref
    x, w, ref = operands(4096, 1024, 512, nproc, 5)
    if transport != "copy_engine":
        cfg = fo_jax.OverlapConfig(allow_fallback=False, transport=transport)
    else:
        cfg = config(False) if collective == "reduce_scatter" else ar_config(1)
    return tp_fn(mesh, cfg, collective), shard_operands(mesh, x, w), ref
