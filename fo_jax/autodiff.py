"""Reverse-mode autodiff of overlapped_matmul: one custom VJP around an opaque forward.

The CUDA forward is an XLA FFI custom call that JAX cannot differentiate, so the op carries its own
rule; the reference forward goes through the same rule, so both paths train the same way. The rule
is the transpose of "local GEMM, then psum / psum_scatter", written out with explicit GEMMs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from fo_jax import _vma

Forward = Callable[[jax.Array, jax.Array], jax.Array]


def overlapped_matmul_vjp(forward: Forward, x: jax.Array, w: jax.Array, axis_name: str,
                          collective: str) -> jax.Array:
    """Calls `forward(x, w)` with fo_jax's reverse-mode rule attached (inside `jax.shard_map`).

    `forward` must compute `psum(x @ w, axis_name)` (collective="all_reduce") or
    `psum_scatter(x @ w, axis_name, scatter_dimension=0, tiled=True)` (collective=
    "reduce_scatter") in x's dtype; it is treated as opaque and is never differentiated, so it may
    be a custom call without an autodiff rule. Backward, with fp32 GEMM accumulation and cotangents
    returned in the primal dtypes:

    - all_reduce: dx = dy @ w^T, dw = x^T @ dy. dy is replicated over `axis_name`, so there is no
      communication (under `check_vma=False` JAX hands each device a share of the cotangent of a
      replicated value, and the rule sums the shares with one psum of dy, as JAX's own psum
      transpose does there).
    - reduce_scatter: g = all_gather(dy, axis_name, axis=0, tiled=True), dx = g @ w^T,
      dw = x^T @ g.

    Under `check_vma=True` each cotangent gets the varying-manual-axes type of its primal: summed
    (psum) over axes it varies over but its primal does not (e.g. dw over a data axis when w is
    replicated over it), marked varying over axes it lacks. Forward-mode (jvp) is not supported.

    Args:
      forward: `forward(x, w) -> y`, the primal implementation (reference or CUDA).
      x: local shard [M, K_local].
      w: local shard [K_local, N].
      axis_name: the mesh axis reduced over (bound by an enclosing shard_map).
      collective: "all_reduce" or "reduce_scatter".

    Returns:
      `forward(x, w)`.
    """
    return _overlapped(forward, axis_name, collective, x, w)


# forward, axis_name and collective are static: a fresh lambda per call only re-traces this rule
# inside the (cached) trace of the caller's jit; it never reaches a jit cache key.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _overlapped(forward, axis_name, collective, x, w):
    return forward(x, w)


def _overlapped_fwd(forward, axis_name, collective, x, w):
    # Through _overlapped itself (forward has no derivative), so that grad of grad works.
    return _overlapped(forward, axis_name, collective, x, w), (x, w)


def _overlapped_bwd(forward, axis_name, collective, res, dy):
    del forward
    x, w = res
    # Under check_vma=False every aval has an empty varying set; under check_vma=True the product
    # being reduced varies over axis_name, so x or w does.
    checked = bool(_vma.varying_axes(x) | _vma.varying_axes(w))
    if collective == "reduce_scatter":
        g = jax.lax.all_gather(vary(dy, {axis_name}) if checked else dy, axis_name, axis=0,
                               tiled=True)
    elif collective == "all_reduce":
        g = dy if checked else jax.lax.psum(dy, axis_name)
    else:
        raise ValueError(f"fo_jax.autodiff: unknown collective {collective!r}")
    # Operands of each GEMM share one varying type (JAX would insert these pvarys itself).
    dx = _dot(*common_vary(g, w), (1, 1))  # [M, N] x [K, N] -> [M, K]
    dw = _dot(*common_vary(x, g), (0, 0))  # [M, K] x [M, N] -> [K, N]
    return like(dx, x), like(dw, w)


_overlapped.defvjp(_overlapped_fwd, _overlapped_bwd)


def _dot(a, b, contract: tuple[int, int]):
    # 16-bit GEMMs output their own dtype: XLA accumulates them in float32 inside the GEMM and
    # rounds once, so a float32 output plus a cast would only add a conversion pass.
    out = a.dtype if a.dtype == b.dtype and a.dtype.itemsize == 2 else jnp.float32
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                               preferred_element_type=out)


def _axes(names) -> tuple:
    return tuple(sorted(names, key=str))  # deterministic order: stable jaxprs across runs


def vary(a, axes):
    missing = set(axes) - _vma.varying_axes(a)
    if not missing:
        return a
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(a, _axes(missing), to="varying")
    return jax.lax.pvary(a, _axes(missing))


def common_vary(a, b):
    axes = _vma.varying_axes(a) | _vma.varying_axes(b)
    return vary(a, axes), vary(b, axes)


def like(ct, primal):
    """The cotangent ct in primal's dtype and varying-axes type (a psum transposes an implicit pvary)."""
    ct = ct.astype(primal.dtype)
    extra = _vma.varying_axes(ct) - _vma.varying_axes(primal)
    if extra:
        ct = jax.lax.psum(ct, _axes(extra))
    return vary(ct, _vma.varying_axes(primal))
