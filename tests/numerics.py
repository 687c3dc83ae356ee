"""Shared test numerics: random inputs, float64 NumPy references, dtype-keyed tolerances."""

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
