"""Measuring code shared by `python -m fo_jax.bench`, `python -m fo_jax.tune` and benchmarks/.

Timing follows the anchors' method (median over `trials` of `reps` back-to-back calls, one
block_until_ready each), so all numbers compare. It lives in the package, not in benchmarks/
(not shipped in the wheel), so the installed CLIs can import it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fo_jax
from fo_jax import _xla_fp8

DESIGN_SHAPES = ["4096x8192x2048", "8192x8192x2048", "8192x8192x7168", "16384x8192x7168",
                 "16384x8192x2048"]
COLLECTIVES = ("reduce_scatter", "all_reduce")  # the tuner's (NCCL-transport) collectives
# The benchmark's: for "all_gather" a shape MxNxK is the gathered x[M, K] @ w[K, N] per GPU (x's
# local shard is [M / TP, K]).
BENCH_COLLECTIVES = (*COLLECTIVES, "all_gather")


def commit() -> str:
    """fo_jax's git commit as fo_jax.build_info() records it (FO_JAX_COMMIT overrides)."""
    return fo_jax.build_info()["commit"]


def device_info(devices: Sequence) -> dict:
    """The fields every result row carries: what ran, where, when, from which source."""
    import jaxlib  # noqa: PLC0415

    return {"device": devices[0].device_kind, "num_devices": len(devices),
            "date": datetime.date.today().isoformat(), "commit": commit(),
            "fo_jax_version": fo_jax.__version__, "jax_version": jax.__version__,
            "jaxlib_version": jaxlib.__version__}


def provenance(base: dict) -> str:
    """One line for report titles: device, count, date, commit and versions of a row's fields."""
    return (f"{base['device']} x{base['num_devices']}, {base['date']}, fo_jax "
            f"{base['fo_jax_version']} (commit {base['commit']}), jax {base['jax_version']}")


def progress(msg: str) -> None:
    """One progress line on stderr (stdout carries the rows and the report)."""
    print(f"[fo_jax.bench] {msg}", file=sys.stderr, flush=True)


def path_of(mesh: Mesh, collective: str, x: jax.Array, w: jax.Array) -> str:
    """fo_jax.describe's path for overlapped_matmul over mesh axis "tp" with these global
    operands (x K-sharded, w K-sharded), e.g. "cuda/copy_engine"; abstract evaluation only."""
    from fo_jax import info  # noqa: PLC0415

    x_shape, w_shape = x.shape, w.shape
    if collective == "all_gather":  # x row-sharded, w column-sharded: the same local shapes
        tp = mesh.shape["tp"]
        x_shape, w_shape = (x.shape[0] // tp, x.shape[1] * tp), (w.shape[0] * tp,
                                                                  w.shape[1] // tp)
    config = gather_config(None) if collective == "all_gather" else None
    try:
        c = info.describe_on_mesh(mesh, "tp", collective, x_shape, w_shape, x.dtype, config)
    except Exception as e:  # noqa: BLE001 (a report field must not end the run)
        return f"unknown ({e!r:.120})"
    return c.path + (f"/{c.transport}" if c.transport else "")


def rotated(names: list, r: int) -> list:
    """Round r of an interleaved measurement: `names` forward in even rounds and backward in odd
    ones, started at position r // 2 (mod len). Each method starts a round in turn and follows
    different methods from round to round (a rotation alone keeps every method's predecessor:
    at 16384x8192x7168 a method that always ran right after a pure GEMM read 5-11% slower than
    the same plan elsewhere in the order; docs/performance.md, 'How to measure')."""
    order = list(names) if r % 2 == 0 else list(names)[::-1]
    s = (r // 2) % len(order)
    return order[s:] + order[:s]


def median(values) -> float:
    """The middle value of `values` (the upper one of an even count): what the timing helpers
    report of their samples."""
    v = sorted(values)
    return v[len(v) // 2]


def time_ms_interleaved(fns: dict, *args, reps: int = 20, trials: int = 5,
                        warmup: int = 3) -> dict:
    """time_ms for several functions of the same arguments, their trials interleaved and the order
    changed every trial (`rotated`: A B C, C B A, B C A, A C B, ...) so that clock and power drift
    over the run hits all of them alike and no method always runs right after the same one.
    {name: ms}."""
    for f in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(f(*args))
    samples: dict = {name: [] for name in fns}
    names = list(fns)
    for t in range(trials):
        for name in rotated(names, t):
            f = fns[name]
            t0 = time.perf_counter()
            outs = [f(*args) for _ in range(reps)]
            jax.block_until_ready(outs)
            samples[name].append((time.perf_counter() - t0) * 1e3 / reps)
    return {name: median(v) for name, v in samples.items()}


def time_ms(f: Callable, *args, reps: int = 20, trials: int = 5, warmup: int = 3) -> float:
    """Median over `trials` of the mean time of `reps` back-to-back calls, in milliseconds."""
    return time_ms_interleaved({"f": f}, *args, reps=reps, trials=trials, warmup=warmup)["f"]


class Results:
    """Collects rows (printed as JSON as they come); writes JSON Lines and a markdown table."""

    def __init__(self, base: dict, echo: bool = True):
        self.base = base
        self.rows: list = []
        self.echo = echo

    def add(self, **row) -> dict:
        full = {**self.base, **row}
        self.rows.append(full)
        if self.echo:
            print(json.dumps(full), flush=True)
        return full

    def write_jsonl(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            for r in self.rows:
                fh.write(json.dumps(r) + "\n")

    def write_markdown(self, path: str, table: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(table)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


# XLA's fp8 dot, the fp8 baseline of the benchmarks: the same call fo_jax.matmul hands an fp8
# GEMM to where XLA is faster, so the two are one.
xla_fp8_dot = _xla_fp8.fp8_dot


def parse_shape(s: str) -> tuple:
    """"MxNxK" -> (M, N, K) ints (per-GPU x[M, K] @ w[K, N])."""
    try:
        m, n, k = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise ValueError(f"bad shape {s!r}: expected MxNxK, e.g. 8192x8192x2048") from None
    return m, n, k


def random_operands(mesh: Mesh, m: int, n: int, k: int, dtype, seed: int = 0) -> tuple:
    """Global x[M, tp*K] (K sharded) and w[tp*K, N] (K sharded), drawn on the devices."""
    tp = mesh.shape["tp"]
    kx, kw = jax.random.split(jax.random.key(seed))
    scale = 1.0 / (tp * k) ** 0.5

    def draw(kx, kw):
        x = (jax.random.normal(kx, (m, tp * k), jnp.float32) * scale).astype(dtype)
        w = jax.random.normal(kw, (tp * k, n), jnp.float32).astype(dtype)
        return x, w

    draw = jax.jit(draw, out_shardings=(NamedSharding(mesh, P(None, "tp")),
                                        NamedSharding(mesh, P("tp", None))))
    return draw(kx, kw)


def gather_operands(mesh: Mesh, m: int, n: int, k: int, dtype, seed: int = 0) -> tuple:
    """Global x[M, K] (rows sharded: [M / tp, K] per device) and w[K, tp*N] (columns sharded:
    [K, N] per device), drawn on the devices: the operands of the all_gather rows."""
    tp = mesh.shape["tp"]
    kx, kw = jax.random.split(jax.random.key(seed))

    def draw(kx, kw):
        x = (jax.random.normal(kx, (m, k), jnp.float32) * k ** -0.5).astype(dtype)
        w = jax.random.normal(kw, (k, tp * n), jnp.float32).astype(dtype)
        return x, w

    draw = jax.jit(draw, out_shardings=(NamedSharding(mesh, P("tp", None)),
                                        NamedSharding(mesh, P(None, "tp"))))
    return draw(kx, kw)


def operands(mesh: Mesh, collective: str, m: int, n: int, k: int, dtype, seed: int = 0) -> tuple:
    """The operands `build`'s functions take for `collective` (gather_operands for
    all_gather, random_operands otherwise)."""
    if collective == "all_gather":
        return gather_operands(mesh, m, n, k, dtype, seed)
    return random_operands(mesh, m, n, k, dtype, seed=seed)


def replicated(mesh: Mesh, x: jax.Array) -> jax.Array:
    """x whole on every device: the gathered input of the all_gather rows' gemm_only."""
    return jax.device_put(x, NamedSharding(mesh, P()))


def random_partials(mesh: Mesh, m: int, n: int, dtype, seed: int = 1) -> jax.Array:
    """Per-device partial products y[tp*M, N] (one [M, N] block per device), for comm_only."""
    tp = mesh.shape["tp"]
    f = jax.jit(lambda key: jax.random.normal(key, (tp * m, n), jnp.float32).astype(dtype),
                out_shardings=NamedSharding(mesh, P("tp", None)))
    return f(jax.random.key(seed))


# Baselines are built from what JAX users write today (fo_jax.reference.plain_*), not from the
# exact-definition reference, whose fp32-output GEMM plus cast is 5-15% slower on GPU.
xla_matmul = fo_jax.reference.plain_matmul


def _chunked(x, w, collective: str, chunks: int, tp: int):
    """x @ w then the collective, in `chunks` row chunks (inside shard_map).

    reduce_scatter: chunk c takes band c of every rank's block of rows, so that concatenating
    the scattered chunks gives exactly the tiled psum_scatter layout.
    """
    m = x.shape[0]
    if collective == "all_reduce":
        parts = [jax.lax.psum(xla_matmul(xc, w), "tp")
                 for xc in jnp.split(x, chunks, axis=0)]
        return jnp.concatenate(parts, axis=0)
    band = m // (tp * chunks)
    xr = x.reshape(tp, chunks, band, x.shape[1])
    parts = [jax.lax.psum_scatter(xla_matmul(xr[:, c].reshape(tp * band, -1), w),
                                  "tp", scatter_dimension=0, tiled=True) for c in range(chunks)]
    return jnp.concatenate(parts, axis=0)


def _chunked_gather(x, w, chunks: int):
    """all_gather(x) @ w in `chunks` chunks of every rank's rows (inside shard_map): chunk c
    gathers band c of each rank's rows and multiplies it; the bands go back to the tiled
    all_gather layout (rank-major)."""
    tp = jax.lax.axis_size("tp")
    parts = [xla_matmul(jax.lax.all_gather(xc, "tp", axis=0, tiled=True), w)
             for xc in jnp.split(x, chunks, axis=0)]
    band = x.shape[0] // chunks
    parts = [p.reshape(tp, band, -1) for p in parts]
    return jnp.stack(parts, axis=1).reshape(tp * x.shape[0], -1)


def gather_config(config: Optional[fo_jax.OverlapConfig]) -> fo_jax.OverlapConfig:
    """The all_gather rows' fo_jax configuration: the overlapped all-gather, opted in
    (OverlapConfig.all_gather), unless the configuration says otherwise or gives the GEMM an SM
    budget (fo_jax.sequential's all SMs would leave NCCL none: it stays XLA's path)."""
    config = config or fo_jax.OverlapConfig()
    if config.all_gather is not None or config.sm_budget is not None:
        return config
    return dataclasses.replace(config, all_gather="overlap")


def _build_gather(mesh: Mesh, kind: str, config: Optional[fo_jax.OverlapConfig],
                  chunks: int) -> Callable:
    """build() for collective "all_gather": functions of (x, w) with x's rows and w's columns
    sharded (gather_operands), giving each device's [M, N] (global [M, tp*N]); "gemm_only"
    takes (whole x, w) (see `replicated`), "comm_only" (x,)."""
    in_specs, out_spec = (P("tp", None), P(None, "tp")), P(None, "tp")

    config = gather_config(config)

    def body(x, w):
        if kind == "fo_jax":
            return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="all_gather",
                                            config=config)
        if kind == "baseline":
            return fo_jax.reference.plain_all_gather_matmul(x, w, "tp")[0]
        if kind == "gemm_only":
            return xla_matmul(x, w)
        if kind == "chunked":
            return _chunked_gather(x, w, chunks)
        raise ValueError(f"unknown kind {kind!r}")

    if kind == "comm_only":
        def comm(x):  # [M / tp, K] -> [M, K] on every device (stacked over "tp" in the output)
            return jax.lax.all_gather(x, "tp", axis=0, tiled=True)
        return jax.jit(jax.shard_map(comm, mesh=mesh, in_specs=P("tp", None),
                                     out_specs=P("tp", None)))
    if kind == "gemm_only":
        in_specs = (P(), P(None, "tp"))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec))


def build(mesh: Mesh, collective: str, kind: str, config: Optional[fo_jax.OverlapConfig] = None,
          chunks: int = 0) -> Callable:
    """A jitted shard_map function of (x, w) (or (y,) for "comm_only").

    kinds: "fo_jax" (overlapped_matmul with `config`), "baseline" (XLA dot + psum /
    psum_scatter), "gemm_only" (XLA dot alone), "comm_only" (the collective alone on y),
    "chunked" (`chunks` row chunks of dot + collective). collective "all_gather": see
    `_build_gather` (operands from `gather_operands`).
    """
    if collective == "all_gather":
        return _build_gather(mesh, kind, config, chunks)
    out_spec = P("tp", None) if collective == "reduce_scatter" else P()
    tp = mesh.shape["tp"]

    def body(x, w):
        if kind == "fo_jax":
            return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                            config=config)
        if kind == "baseline":
            return fo_jax.reference.plain_overlapped_matmul(x, w, "tp", collective)
        if kind == "gemm_only":
            return xla_matmul(x, w)
        if kind == "chunked":
            return _chunked(x, w, collective, chunks, tp)
        raise ValueError(f"unknown kind {kind!r}")

    if kind == "gemm_only":
        out_spec = P("tp", None)  # per-device [M, N] stacked
    if kind == "comm_only":
        def comm(y):  # y: this device's [M, N] partial product
            if collective == "reduce_scatter":
                return jax.lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
            return jax.lax.psum(y, "tp")
        return jax.jit(jax.shard_map(comm, mesh=mesh, in_specs=P("tp", None), out_specs=out_spec))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                                 out_specs=out_spec))


@jax.jit
def rel_err(got: jax.Array, ref: jax.Array) -> jax.Array:
    """||got - ref|| / ||ref|| in float32, computed on the devices."""
    g, r = got.astype(jnp.float32), ref.astype(jnp.float32)
    return jnp.linalg.norm(g - r) / jnp.maximum(jnp.linalg.norm(r), 1e-30)
