"""Reverse-mode autodiff of the overlapped ops: custom VJPs around opaque forwards, with the
forward and backward collectives paired by the op (as in a sequence-parallel layer):

| forward                 | dx                                  | dw                          |
|-------------------------|-------------------------------------|-----------------------------|
| y = psum_scatter(x @ w) | all-gather + GEMM: AG(dy) @ w^T     | x^T @ AG(dy) (gathered dy)  |
| y = psum(x @ w)         | dy @ w^T, no communication          | x^T @ dy                    |
| y = AG(x) @ w           | GEMM + reduce-scatter: RS(dy @ w^T) | AG(x)^T @ dy (forward's AG) |

The CUDA forwards are XLA FFI custom calls that JAX cannot differentiate, so each op carries its
own rule; the reference forwards go through the same rules, so both paths train the same way.
The backward's collective runs through the paired fo_jax op (handed in by fo_jax/overlap.py), so
it is overlapped wherever that op is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from fo_jax import _vma

Forward = Callable[[jax.Array, jax.Array], jax.Array]
# (dy, w_t) -> (AG(dy) @ w_t, AG(dy)): the all-gather + GEMM op the reduce-scatter's VJP uses.
GatherMatmul = Callable[[jax.Array, jax.Array], tuple]
# (dy, w_t) -> psum_scatter(dy @ w_t): the GEMM + reduce-scatter op the all-gather's VJP uses.
MatmulScatter = Callable[[jax.Array, jax.Array], jax.Array]


def overlapped_matmul_vjp(forward: Forward, x: jax.Array, w: jax.Array, axis_name: str,
                          collective: str, gather_matmul: GatherMatmul | None = None
                          ) -> jax.Array:
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
    - reduce_scatter: (dx, g) = gather_matmul(dy, w^T), i.e. g = all_gather(dy, axis_name,
      axis=0, tiled=True) and dx = g @ w^T in one all-gather + GEMM op, then dw = x^T @ g reusing
      the gathered dy. Without `gather_matmul`, XLA's all_gather and dot.

    Under `check_vma=True` each cotangent gets the varying-manual-axes type of its primal: summed
    (psum) over axes it varies over but its primal does not (e.g. dw over a data axis when w is
    replicated over it), marked varying over axes it lacks. Forward-mode (jvp) is not supported.

    Args:
      forward: `forward(x, w) -> y`, the primal implementation (reference or CUDA).
      x: local shard [M, K_local].
      w: local shard [K_local, N].
      axis_name: the mesh axis reduced over (bound by an enclosing shard_map).
      collective: "all_reduce" or "reduce_scatter".
      gather_matmul: the all-gather + GEMM op for reduce_scatter's dx (see GatherMatmul).

    Returns:
      `forward(x, w)`.
    """
    return _overlapped(forward, axis_name, collective, gather_matmul, x, w)


# forward, axis_name, collective and gather_matmul are static: a fresh lambda per call only
# re-traces this rule inside the (cached) trace of the caller's jit; it never reaches a jit cache
# key.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _overlapped(forward, axis_name, collective, gather_matmul, x, w):
    return forward(x, w)


def _overlapped_fwd(forward, axis_name, collective, gather_matmul, x, w):
    # Through _overlapped itself (forward has no derivative), so that grad of grad works.
    return _overlapped(forward, axis_name, collective, gather_matmul, x, w), (x, w)


def _overlapped_bwd(forward, axis_name, collective, gather_matmul, res, dy):
    del forward
    x, w = res
    # Under check_vma=False every aval has an empty varying set; under check_vma=True the product
    # being reduced varies over axis_name, so x or w does.
    checked = bool(_vma.varying_axes(x) | _vma.varying_axes(w))
    if collective == "reduce_scatter":
        dy = vary(dy, {axis_name}) if checked else dy
        if gather_matmul is not None:
            dx, g = gather_matmul(*common_vary(dy, w.T))
        else:
            g = jax.lax.all_gather(dy, axis_name, axis=0, tiled=True)
            dx = _dot(*common_vary(g, w), (1, 1))  # [M, N] x [K, N] -> [M, K]
    elif collective == "all_reduce":
        g = dy if checked else jax.lax.psum(dy, axis_name)
        dx = _dot(*common_vary(g, w), (1, 1))
    else:
        raise ValueError(f"fo_jax.autodiff: unknown collective {collective!r}")
    # Operands of each GEMM share one varying type (JAX would insert these pvarys itself).
    dw = _dot(*common_vary(x, g), (0, 0))  # [M, K] x [M, N] -> [K, N]
    return like(dx, x), like(dw, w)


_overlapped.defvjp(_overlapped_fwd, _overlapped_bwd)


def all_gather_matmul_vjp(forward: Callable, x: jax.Array, w: jax.Array, axis_name: str,
                          matmul_scatter: MatmulScatter, recompute: bool = False) -> tuple:
    """Calls `forward(x, w) -> (y, g)`, y = all_gather(x, axis_name, axis=0, tiled=True) @ w and
    g the gathered x, with fo_jax's reverse-mode rule attached (inside `jax.shard_map`).

    Backward: dx = matmul_scatter(dy, w^T) = psum_scatter(dy @ w^T) (the GEMM + reduce-scatter
    op), plus psum_scatter(dg) where the caller uses g; dw = g^T @ dy with the forward's gathered
    x (kept as a residual; `recompute=True` keeps x instead and gathers it again in the backward,
    trading a second all-gather for the memory of the gathered copy). g's own cotangent takes a
    separate rule (_gathered_input), so a caller that does not use g pays no reduce-scatter for
    its zero cotangent.
    """
    y, g = _gathered(forward, axis_name, matmul_scatter, bool(recompute), x, w)
    return y, _gathered_input(axis_name, x, jax.lax.stop_gradient(g))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _gathered(forward, axis_name, matmul_scatter, recompute, x, w):
    return forward(x, w)


def _gathered_fwd(forward, axis_name, matmul_scatter, recompute, x, w):
    y, g = _gathered(forward, axis_name, matmul_scatter, recompute, x, w)
    # The residual g as a function of x (its own rule), so that the backward differentiates
    # again (grad of grad): _gathered's own rule ignores g's cotangent.
    kept = x if recompute else _gathered_input(axis_name, x, jax.lax.stop_gradient(g))
    return (y, g), (kept, w)


def _gathered_bwd(forward, axis_name, matmul_scatter, recompute, res, cts):
    del forward
    kept, w = res
    dy, _ = cts  # g reaches callers only through _gathered_input, which carries its cotangent
    # The gathered x: kept, or gathered again. It has x's dtype and varying axes (a template for
    # dx's type).
    g = jax.lax.all_gather(kept, axis_name, axis=0, tiled=True) if recompute else kept
    dx = matmul_scatter(*common_vary(dy, w.T))
    dw = _dot(*common_vary(g, dy), (0, 0))  # [M, K] x [M, N] -> [K, N]
    return like(dx, kept if recompute else g), like(dw, w)


_gathered.defvjp(_gathered_fwd, _gathered_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gathered_input(axis_name, x, g):
    """g (the all-gather of x, computed by the forward) as a function of x: its cotangent
    scatters back to x's rows."""
    del x
    return g


def _gathered_input_fwd(axis_name, x, g):
    return g, x


def _gathered_input_bwd(axis_name, x, dg):
    dx = jax.lax.psum_scatter(dg, axis_name, scatter_dimension=0, tiled=True)
    return like(dx, x), jnp.zeros_like(dg)


_gathered_input.defvjp(_gathered_input_fwd, _gathered_input_bwd)


def _dot(a, b, contract: tuple[int, int]):
    # 16-bit GEMMs output their own dtype: XLA accumulates them in float32 inside the GEMM and
    # rounds once, so a float32 output plus a cast would only add a conversion pass.
    out = a.dtype if a.dtype == b.dtype and a.dtype.itemsize == 2 else jnp.float32
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                               preferred_element_type=out)


def _axes(names) -> tuple:
    return tuple(sorted(names, key=str))  # deterministic order: stable jaxprs across runs


def vary(a, axes):
    """`a` marked varying over `axes` as well (pcast / pvary; a no-op where it already is)."""
    missing = set(axes) - _vma.varying_axes(a)
    if not missing:
        return a
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(a, _axes(missing), to="varying")
    return jax.lax.pvary(a, _axes(missing))


def common_vary(a, b):
    """a and b, each marked varying over the union of their varying axes."""
    axes = _vma.varying_axes(a) | _vma.varying_axes(b)
    return vary(a, axes), vary(b, axes)


def like(ct, primal):
    """The cotangent ct in primal's dtype and varying-axes type (a psum transposes an implicit
    pvary)."""
    ct = ct.astype(primal.dtype)
    extra = _vma.varying_axes(ct) - _vma.varying_axes(primal)
    if extra:
        ct = jax.lax.psum(ct, _axes(extra))
    return vary(ct, _vma.varying_axes(primal))
