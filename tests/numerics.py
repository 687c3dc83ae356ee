"""Shared test numerics: random inputs, float64 NumPy references, dtype-keyed tolerances, the
signaling GEMM's expected counters and group-major output layout, and its raw run into a
poisoned output (GPU tests)."""

import jax.numpy as jnp
import numpy as np

# Relative Frobenius error allowed against a float64 reference, by input dtype.
REL_TOL = {
    jnp.dtype(jnp.float32): 1e-5,
    jnp.dtype(jnp.float16): 3e-3,
    jnp.dtype(jnp.bfloat16): 1.5e-2,
}


def random_operands(rng: np.random.Generator, m: int, k: int, n: int, dtype):
    """x[m, k], w[k, n] ~ N(0, 1) / sqrt(k) in `dtype` (never zeros), plus their float64 copies."""
    x = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    xj, wj = jnp.asarray(x, dtype=dtype), jnp.asarray(w, dtype=dtype)
    assert xj.dtype == jnp.dtype(dtype) and wj.dtype == jnp.dtype(dtype)
    return xj, wj, np.asarray(xj, np.float64), np.asarray(wj, np.float64)


def device_operands(dev, seed: int, rows: int, k: int, n: int, dtype):
    """random_operands(default_rng(seed), rows, k, n, dtype), x and w put on device `dev`."""
    import jax  # noqa: PLC0415

    x, w, x64, w64 = random_operands(np.random.default_rng(seed), rows, k, n, dtype)
    return jax.device_put(x, dev), jax.device_put(w, dev), x64, w64


def poisoned_gemm_run(dev, plan, x, w, batch: int = 1):
    """(output as float64, counters) of the raw signaling GEMM of `plan` (signalling) writing
    into a NaN-poisoned buffer on `dev`: an element it never writes stays NaN."""
    import jax  # noqa: PLC0415

    from fo_jax import _cuda_ops  # noqa: PLC0415 (needs the CUDA module)

    d0 = jax.device_put(jnp.full((x.shape[0], w.shape[1]), jnp.nan, x.dtype), dev)
    f = jax.jit(lambda a, b, d: _cuda_ops.signaling_gemm(a, b, plan, batch, True, d),
                donate_argnums=2)
    d, counters = f(x, w, d0)
    return np.asarray(d.astype(jnp.float32), np.float64), np.asarray(counters)


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "output has NaN/Inf (unwritten or poisoned elements?)"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def assert_close(out, ref, dtype, factor: float = 1.0):
    err = rel_err(out, ref)
    tol = REL_TOL[jnp.dtype(dtype)] * factor
    assert err <= tol, f"relative error {err:.3e} > {tol:.1e} ({jnp.dtype(dtype)})"


def explain_mismatch(got, x64, w64, tp: int, block_rows: int = 128) -> str:
    """For a wrong [M, N] product of x64[M, K] @ w64[K, N] summed over `tp` ranks (rank q owns
    K-slice q): per band of M / tp rows (rank b's share), the relative error, the bad blocks of
    `block_rows` rows, and the rank whose partial product, missing or counted twice, best explains
    the bad rows (a collective that read a part too early or twice shows up as one of those)."""
    got = np.asarray(got, np.float64)
    k = x64.shape[1] // tp
    parts = [x64[:, q * k:(q + 1) * k] @ w64[q * k:(q + 1) * k] for q in range(tp)]
    expect = sum(parts)
    scale = float(np.abs(expect).max())
    band = got.shape[0] // tp
    lines = []
    for b in range(tp):
        rows = np.arange(b * band, (b + 1) * band)
        d = got[rows] - expect[rows]
        if not np.all(np.isfinite(d)):
            lines.append(f"band {b}: NaN/Inf")
            continue
        bad = [i for i in range(0, band, block_rows)
               if np.abs(d[i:i + block_rows]).max() / scale > 0.02]
        if not bad:
            continue
        sel = np.concatenate([np.arange(i, min(i + block_rows, band)) for i in bad])
        cands = {}
        for q in range(tp):
            cands[f"rank {q}'s part missing"] = np.abs(d[sel] + parts[q][rows][sel]).max() / scale
            cands[f"rank {q}'s part twice"] = np.abs(d[sel] - parts[q][rows][sel]).max() / scale
        best = min(cands, key=cands.get)
        lines.append(f"band {b}: max error {np.abs(d).max() / scale:.3g} of max|ref|, bad "
                     f"{block_rows}-row blocks at rows {bad}; best fit: {best} (residual "
                     f"{cands[best]:.3g})")
    return "; ".join(lines) or "no band off by more than 2% of max|ref|"


def expected_group_counts(plan, batch: int, n: int) -> list:
    """The counter value of each group once the signaling GEMM is done (signaling_gemm.h):
    batch x its tile-rows x ceil(n / tile_n)."""
    tiles_n = -(-n // plan.tile_n)
    b = plan.group_begin
    return [batch * (b[g + 1] - b[g]) * tiles_n for g in range(plan.num_groups)]


def group_major_layout(ref, plan, batch: int, m: int):
    """The group-major reduce-scatter layout of a batched launch (signaling_gemm.h) from the plain
    product `ref` ([batch * m, n], batch-major)."""
    out = np.empty_like(ref)
    for g in range(plan.num_groups):
        r0 = min(plan.group_begin[g] * plan.tile_m, m)
        r1 = min(plan.group_begin[g + 1] * plan.tile_m, m)
        for b in range(batch):
            dst = batch * r0 + b * (r1 - r0)
            out[dst:dst + r1 - r0] = ref[b * m + r0:b * m + r1]
    return out


def measured_config_times(results_file: str) -> dict:
    """{(M, N, K): {config: ms}} of the fo_jax.gemm rows (one per forced tile configuration) of
    a committed benchmarks/results/ sweep (bench_fp8.py --configs)."""
    import json  # noqa: PLC0415
    import pathlib  # noqa: PLC0415

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / results_file
    times = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["method"] == "fo_jax.gemm" and row.get("ms"):
            times.setdefault((row["M"], row["N"], row["K"]), {})[row["config"]] = row["ms"]
    return times
