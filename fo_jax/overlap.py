"""The public ops: `overlapped_matmul` (GEMM + collective inside shard_map) and `matmul`.

Both take x[..., K] with any leading dimensions (their rows are flattened for the GEMM), validate
their input at trace time, pick a path (see `describe`), and log that choice on the "fo_jax"
logger at DEBUG level. Both are JAX ops: they run under jit, differentiate under jax.grad (their
own reverse-mode rules, the CUDA forward being an opaque custom call), batch under jax.vmap (a
batching rule that folds a batched x into the GEMM's rows) and work under lax.scan and
jax.checkpoint. Forward-mode (jvp) is not supported: JAX says so when asked.

Paths:
  - "reference": XLA dot (fp32 accumulation) then psum / psum_scatter; exact definition.
  - "xla": on CUDA, `x @ w` then the collective, as users write it (XLA's 16-bit GEMM accumulates
    in fp32 and rounds once, like the reference, without its extra conversion pass); taken by
    calls too small for the overlap to pay (see _plan.MIN_GEMM_SECONDS), and by a plain GEMM
    (fo_jax.matmul and its backward GEMMs, an overlapped call over an axis of size 1) where the
    measured table says XLA's dot is faster (fo_jax/_gemm_choice.py, prefer_xla_dot).
  - "cuda": fo_jax's own kernels through XLA FFI: the signaling GEMM, and for overlapped_matmul
    over an axis of more than one device the counter-gated transport: copy-engine writes into the
    peers' memory where possible, NCCL collectives otherwise (fo_jax/_transport.py). Over an axis
    of size 1 the collective is the identity and the call is fo_jax's GEMM alone.
The path depends on the platform the call runs on (that of the enclosing shard_map's mesh, else
JAX's default backend); the program carries the CUDA branch through jax.lax.platform_dependent,
so CUDA devices run it and other platforms run the reference.

Longer than ~500 lines on purpose: the public ops share their validation, logging and batching
helpers, and each op's custom_vjp / custom_vmap wiring stays next to its forward. What can stand
alone lives elsewhere: the path choices in fo_jax/_paths.py, the fp8 math in fo_jax/fp8.py, the
paired backward rules in fo_jax/autodiff.py, the lowering in fo_jax/_cuda_ops.py.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from fo_jax import (_checks, _fp8_all_gather, _plan, _process_layout, _vma, autodiff, fp8,
                    reference)
# The path choices live in fo_jax/_paths.py; PathChoice is public (fo_jax.PathChoice) and the
# choosers are imported here under their names, where the ops call them.
from fo_jax._paths import (CUDA_PLATFORMS, PathChoice, _all_gather_config,  # noqa: F401
                           _choose_all_gather, _choose_fp8_overlapped, _choose_gemm,
                           _choose_overlapped, choose_fp8)
from fo_jax.config import OverlapConfig

log = logging.getLogger("fo_jax")


def _rows(x) -> int:
    """Rows of x[..., K] as the GEMM sees them (its leading dimensions flattened)."""
    return math.prod(x.shape[:-1])


def _known_choice(choose, *args) -> PathChoice:
    """choose(*args) from what this process already knows, with no exchange with the other
    processes (describe(), which a program may call in one process only;
    fo_jax/_process_layout.py): a copy-engine answer across processes that still depends on the
    host exchange and CUDA IPC probe of the first call traced in every process says so."""
    with _process_layout.without_exchanges():
        choice = choose(*args)
    if (choice.transport == "copy_engine"
            and choice.collective in _process_layout.IPC_COLLECTIVES):
        note = _process_layout.pending_note(jax.process_count())
        if note:
            choice = dataclasses.replace(choice, reason=choice.reason + note)
    return choice


def _log(fn: str, x, w, choose, what: str = "") -> None:
    """Logs `choose(platform)` for the platform the call runs on (what `describe` returns), and
    ends with the path CUDA devices take (the branch the program carries for them)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    here = choose(_checks.trace_platform())
    cuda = here if here.platform in CUDA_PLATFORMS else choose("cuda")
    log.debug("%s x%s w%s%s: %s; on CUDA devices: path=%s (%s)", fn, tuple(x.shape),
              tuple(w.shape), what, here, cuda.path, cuda.reason)


# --------------------------------------------------------------------------------------------
# fo_jax.matmul
# --------------------------------------------------------------------------------------------
def _gemm_unbatched(x, w, config):
    """x[R, K] @ w[K, N]: fo_jax's GEMM on CUDA devices where it applies (XLA's dot where that is
    measured faster), else the reference."""
    r, k, n = x.shape[0], x.shape[1], w.shape[1]
    choice = _choose_gemm("matmul", jnp.dtype(x.dtype), config, r, n, k, "cuda", plain=True)
    if choice.path == "xla":
        return jax.lax.platform_dependent(x, w, cuda=reference.plain_matmul,
                                          default=reference.matmul)
    if choice.path != "cuda":
        return reference.matmul(x, w)
    from fo_jax._cuda_ops import matmul_cuda  # noqa: PLC0415 (needs the module)

    plan = _plan.plan_matmul("fo_jax.matmul", x.dtype, r, n, k, config)

    def cuda(x, w):
        # The custom call's result carries no varying manual axes; give it the operands', as
        # the reference's dot does, so that both branches (and check_vma) agree.
        y = matmul_cuda(x, w, plan=plan)
        return autodiff.vary(y, _vma.varying_axes(x) | _vma.varying_axes(w))

    return jax.lax.platform_dependent(x, w, cuda=cuda, default=reference.matmul)


def _map_over_weights(f, x, w, x_batched: bool):
    """f(x, w) for each weight of a batched w (its leading axis), with x's element alongside
    where x is batched too: one call each (fo_jax's kernels take one weight)."""
    if x_batched:
        return jax.lax.map(lambda a: f(a[0], a[1]), (x, w))
    return jax.lax.map(lambda wi: f(x, wi), w)


def _gemm_batchable(x, w, config):
    """_gemm_unbatched with a batching rule: a batched x joins the GEMM's rows; a batched w (one
    GEMM per weight) maps over the batch."""

    @custom_vmap
    def gemm(x, w):
        return _gemm_unbatched(x, w, config)

    @gemm.def_vmap
    def gemm_batched(axis_size, in_batched, x, w):
        x_batched, w_batched = in_batched
        if w_batched:
            return _map_over_weights(lambda x, w: _gemm_batchable(x, w, config), x, w,
                                     x_batched), True
        rows = x.reshape(-1, x.shape[-1])
        return _gemm_batchable(rows, w, config).reshape(axis_size, -1, w.shape[-1]), True

    return gemm(x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gemm(x, w, config):
    return _gemm_batchable(x, w, config)


def _gemm_fwd(x, w, config):
    # Through _gemm itself (not its batchable body, which has no derivative), so that the
    # residuals' dependence on x and w differentiates again (grad of grad).
    return _gemm(x, w, config), (x, w)


def _gemm_bwd(config, res, dy):
    """dx = dy @ w^T and dw = x^T @ dy, each through fo_jax's GEMM where it applies (the
    transposed operands are materialized: the kernel takes row-major A[M, K] and B[K, N])."""
    del config  # it names the forward's tile configuration, not the backward GEMMs'
    x, w = res
    dy_w, w_t = autodiff.common_vary(dy, w.T)
    x_t, dy_x = autodiff.common_vary(x.T, dy)
    dx = _gemm(dy_w, w_t, None)
    dw = _gemm(x_t, dy_x, None)
    return autodiff.like(dx, x), autodiff.like(dw, w)


_gemm.defvjp(_gemm_fwd, _gemm_bwd)


def _weight_kn(w, w_transposed: bool) -> tuple:
    """(K, N) of a weight given [K, N], or [N, K] with w_transposed."""
    return (w.shape[1], w.shape[0]) if w_transposed else tuple(w.shape)


def _matmul_chooser(x, w, config, is_fp8: bool, w_transposed: bool):
    """platform -> the PathChoice of fo_jax.matmul on validated operands (the DEBUG log's and
    describe()'s answer; the op itself decides for "cuda" the same way)."""
    rows = _rows(x)
    if is_fp8:
        k, n = _weight_kn(w, w_transposed)
        return lambda platform: choose_fp8("matmul", config, rows, n, k, platform,
                                           plain_nk=w_transposed)
    k, n = w.shape
    dtype = jnp.dtype(x.dtype)
    return lambda platform: _choose_gemm("matmul", dtype, config, rows, n, k, platform,
                                         plain=True)


def _validate_matmul(fn, x, w, config, x_scale, w_scale, out_dtype, w_transposed) -> tuple:
    """Trace-time checks of fo_jax.matmul's arguments (and describe()'s without an axis);
    returns whether the call is fp8 and, if so, its output dtype."""
    is_fp8, out = _check_fp8_call(fn, x, w, x_scale, w_scale, out_dtype, w_transposed)
    if not is_fp8:
        _checks.check_operands(fn, x, w)
    _checks.check_config(fn, config, plain=True)
    return is_fp8, out


def _check_fp8_call(fn, x, w, x_scale, w_scale, out_dtype, w_transposed, min_x_rank=1):
    """Trace-time checks of an fp8 call (or of fp8 arguments given to a 16-bit one); returns
    whether the call is fp8 and its output dtype."""
    for name, a in (("x", x), ("w", w)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{fn}: {name} must be a JAX array, got {type(a).__name__}")
    if not (fp8.is_fp8(x.dtype) or fp8.is_fp8(w.dtype)):
        if w_transposed:
            raise TypeError(f"{fn}: w_transposed applies to float8_e4m3fn operands only")
        fp8.check_fp8_args(fn, x.dtype, x_scale, w_scale, out_dtype)
        return False, None
    if jnp.dtype(x.dtype) != jnp.dtype(w.dtype):
        raise TypeError(f"{fn}: x and w must have the same dtype, got {jnp.dtype(x.dtype)} and "
                        f"{jnp.dtype(w.dtype)}")
    out = fp8.check_fp8_args(fn, x.dtype, x_scale, w_scale, out_dtype)
    # Shapes only (describe() takes jax.ShapeDtypeStruct too, which has no .T).
    w_kn = jax.ShapeDtypeStruct(tuple(w.shape[::-1]), w.dtype) \
        if w_transposed and len(w.shape) == 2 else w
    _checks.check_operands(fn, _ShapeOnly(x, out), _ShapeOnly(w_kn, out), min_x_rank)
    return True, out


class _ShapeOnly:
    """An operand's shape with a stand-in dtype, for _checks.check_operands' rank and size checks
    of fp8 operands (whose dtype it does not list)."""

    def __init__(self, a, dtype):
        self.shape = tuple(a.shape)
        self.dtype = dtype


def matmul(x: jax.Array, w: jax.Array, *, config: Optional[OverlapConfig] = None,
           x_scale: Optional[jax.Array] = None, w_scale: Optional[jax.Array] = None,
           out_dtype=None, w_transposed: bool = False) -> jax.Array:
    """x @ w with float32 accumulation, in x's dtype: fo_jax's GEMM on CUDA devices (no
    collective), or XLA's dot where the measured table says it is faster for this shape
    (fo_jax/_gemm_choice.py; `fo_jax.describe(x, w)` and the DEBUG log say which and why); the
    XLA reference elsewhere.

    Args:
      x: [..., K] (bfloat16 or float16 for the CUDA kernel; float32 runs the reference).
      w: [K, N], same dtype as x.
      config: optional `OverlapConfig` (its `gemm_config` names the forward's tile config and
        keeps fo_jax's GEMM, as does `allow_fallback=False`; `k_splits` splits its K).
      x_scale, w_scale: float8_e4m3fn operands only, and required then: float32 scalars, the
        operands' dequantization scales (`fo_jax.quantize_fp8` returns them); the result is
        (x * x_scale) @ (w * w_scale), accumulated in float32 (fo_jax/fp8.py).
      out_dtype: fp8 operands only: the result's dtype, bfloat16 (the default and the only one).
      w_transposed: fp8 operands only: w is given as [N, K] (the layout the fp8 kernel reads),
        which saves the op's transpose of a [K, N] weight.

    Returns:
      [..., N] in x's dtype (bfloat16 for fp8 operands). Differentiable (jax.grad; each
      backward GEMM runs on fo_jax's kernel or XLA's dot, chosen for its own shape as above; fp8
      operands differentiate in float32, fo_jax/fp8.py), batchable (jax.vmap), usable under jit,
      lax.scan and jax.checkpoint.
    """
    fn = "fo_jax.matmul"
    is_fp8, out = _validate_matmul(fn, x, w, config, x_scale, w_scale, out_dtype, w_transposed)
    _log(fn, x, w, _matmul_chooser(x, w, config, is_fp8, w_transposed))
    k, n = _weight_kn(w, w_transposed)
    rows = _rows(x)
    if is_fp8:  # fo_jax/fp8.py
        y = fp8.fp8_gemm(x.reshape(rows, k), w, x_scale, w_scale, out, w_transposed, config)
    else:
        y = _gemm(x.reshape(rows, k), w, config)
    return y.reshape(*x.shape[:-1], n)


# --------------------------------------------------------------------------------------------
# fo_jax.overlapped_matmul
# --------------------------------------------------------------------------------------------
def _overlap_unbatched(x, w, axis_name: str, collective: str, config, size: int):
    """The forward of one overlapped call on 2-D operands (never differentiated: the custom VJP
    of autodiff.py wraps it)."""
    fn = "fo_jax.overlapped_matmul"
    dtype = jnp.dtype(x.dtype)
    m, k, n = x.shape[0], x.shape[1], w.shape[1]
    ref = functools.partial(reference.overlapped_matmul, axis_name=axis_name,
                            collective=collective)
    choice = _choose_overlapped(dtype, config, m, n, k, "cuda", collective, size)
    if choice.path == "xla":
        plain = functools.partial(reference.plain_overlapped_matmul, axis_name=axis_name,
                                  collective=collective)
        return jax.lax.platform_dependent(x, w, cuda=plain, default=ref)
    if choice.path != "cuda":
        return ref(x, w)
    from fo_jax._cuda_ops import overlapped_matmul_cuda  # noqa: PLC0415 (needs the module)

    plan = _plan.plan_overlap(fn, collective, size, dtype, m, n, k, config, choice.transport)
    log.debug("%s: plan: %s", fn, plan.describe())
    cuda = functools.partial(overlapped_matmul_cuda, axis_name=axis_name, plan=plan,
                             config=config)
    return jax.lax.platform_dependent(x, w, cuda=cuda, default=ref)


def _overlap_batchable(axis_name: str, collective: str, config, size: int):
    """The forward (x, w) -> y with a batching rule: a batched x joins the GEMM's rows (for
    reduce_scatter reordered so that each rank still receives its rows of every batch element);
    a batched w maps over the batch, one overlapped call each."""

    @custom_vmap
    def forward(x, w):
        return _overlap_unbatched(x, w, axis_name, collective, config, size)

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, x, w):
        x_batched, w_batched = in_batched
        inner = _overlap_batchable(axis_name, collective, config, size)
        if w_batched:
            return _map_over_weights(inner, x, w, x_batched), True
        b, r, k = x.shape
        n = w.shape[1]
        if collective == "all_reduce":
            return inner(x.reshape(b * r, k), w).reshape(b, r, n), True
        # Rank q receives rows [q * r / P, (q + 1) * r / P) of every element: put those blocks
        # together, element-major within each rank's block, so that the scatter of the folded
        # rows hands rank q exactly them.
        rows = x.reshape(b, size, r // size, k).transpose(1, 0, 2, 3).reshape(b * r, k)
        return inner(rows, w).reshape(b, r // size, n), True

    return forward


def _validate_overlapped(x, w, axis_name, collective, config,
                         fn: str = "fo_jax.overlapped_matmul") -> tuple:
    _checks.check_collective(fn, collective)
    dtype = _checks.check_operands(fn, x, w, min_x_rank=1 if collective == "all_reduce" else 2)
    _checks.check_config(fn, config)
    size = _checks.mesh_axis_size(fn, axis_name)
    if collective == "reduce_scatter":
        _checks.check_scatter_rows(fn, x.shape[0], size, axis_name)
    return dtype, size


def describe(x, w, *, axis_name: Optional[str] = None, collective: Optional[str] = None,
             config: Optional[OverlapConfig] = None, w_transposed: bool = False) -> PathChoice:
    """Says which path `overlapped_matmul` takes for these arguments on the platform it runs on,
    and why (call it where you would call `overlapped_matmul`, i.e. inside shard_map; it
    validates the same way, but takes no fp8 scales: float8_e4m3fn operands describe the fp8
    path, "cuda" with a transport where it overlaps, "cuda" without one where fo_jax's fp8 GEMM
    is followed by XLA's collective; `w_transposed` as in `overlapped_matmul`; `collective`
    defaults to "reduce_scatter"). Without `axis_name` it describes `fo_jax.matmul(x, w,
    config=config, w_transposed=w_transposed)` instead: fo_jax's GEMM ("cuda"), XLA's dot where
    the GPU model's table measured it faster ("xla"), or the reference. The DEBUG log of the
    call says the same. With several JAX processes it exchanges nothing with the other
    processes (it may be called in one of them only): a reduce-scatter's copy-engine answer
    given before the first lowering has checked the hosts and probed CUDA IPC says so in its
    reason; that lowering decides (docs/design.md, "Copy engine across processes")."""
    fn = "fo_jax.describe"
    scale = jnp.float32(1) if fp8.is_fp8(x.dtype) or fp8.is_fp8(w.dtype) else None
    if axis_name is None:
        if collective is not None:
            raise TypeError(f"{fn}: collective={collective!r} needs axis_name (without one, "
                            "describe() describes fo_jax.matmul, which has no collective)")
        is_fp8, _ = _validate_matmul(fn, x, w, config, scale, scale, None, w_transposed)
        return _matmul_chooser(x, w, config, is_fp8, w_transposed)(_checks.trace_platform())
    collective = "reduce_scatter" if collective is None else collective
    is_fp8, _ = _check_fp8_call(fn, x, w, scale, scale, None, w_transposed,
                                min_x_rank=1 if collective == "all_reduce" else 2)
    if is_fp8:
        size = _validate_fp8_overlapped(fn, x, axis_name, collective, config)
        k, n = _weight_kn(w, w_transposed)
        return _known_choice(_choose_fp8_overlapped, config, _rows(x), n, k,
                             _checks.trace_platform(), collective, size)
    dtype, size = _validate_overlapped(x, w, axis_name, collective, config, fn)
    return _known_choice(_choose_overlapped, dtype, config, _rows(x), w.shape[1], w.shape[0],
                         _checks.trace_platform(), collective, size)


def _validate_fp8_overlapped(fn, x, axis_name, collective, config) -> int:
    _checks.check_collective(fn, collective)
    _checks.check_config(fn, config)
    size = _checks.mesh_axis_size(fn, axis_name)
    if collective == "reduce_scatter":
        _checks.check_scatter_rows(fn, x.shape[0], size, axis_name)
    return size


def _fp8_overlapped(x, w, axis_name, collective, config, x_scale, w_scale, out_dtype,
                    w_transposed):
    """overlapped_matmul on float8_e4m3fn operands: the fp8 GEMM and the collective on its
    bfloat16 output, overlapped on CUDA devices where _choose_fp8_overlapped says so."""
    fn = "fo_jax.overlapped_matmul"
    _, out = _check_fp8_call(fn, x, w, x_scale, w_scale, out_dtype, w_transposed,
                             min_x_rank=1 if collective == "all_reduce" else 2)
    size = _validate_fp8_overlapped(fn, x, axis_name, collective, config)
    if w_transposed:
        # The paths below take w[K, N] and hand the kernels w.T: XLA folds the two transposes,
        # so the kernel reads the caller's [N, K] weight as it is.
        w = w.T
    k, n = w.shape
    rows = _rows(x)
    _log(fn, x, w, lambda platform: _choose_fp8_overlapped(config, rows, n, k, platform,
                                                           collective, size),
         f" over {axis_name!r}")
    x2 = x.reshape(rows, k)
    if size == 1:  # the collective over one device is the identity: the fp8 GEMM alone
        y2 = fp8.fp8_gemm(x2, w, x_scale, w_scale, out, False, config)
        if collective != "all_gather":
            y2 = reference.apply_collective(y2, axis_name, collective)
    elif collective == "all_gather":
        y2 = _fp8_all_gather.all_gather_fp8(axis_name, size, config, x2, w, x_scale, w_scale)
    else:
        y2 = _fp8_overlapped_vjp(axis_name, collective, config, size, x2, w, x_scale, w_scale)
    lead = x.shape[:-1]
    if collective == "reduce_scatter":
        lead = (lead[0] // size, *lead[1:])
    elif collective == "all_gather":
        lead = (lead[0] * size, *lead[1:])
    return y2.reshape(*lead, n)


def _fp8_overlap_unbatched(x, w, xs, ws, axis_name: str, collective: str, config, size: int):
    """The forward of one fp8 overlapped call on 2-D operands (never differentiated: the custom
    VJP _fp8_overlapped_vjp wraps it): the overlapped CUDA call where the choice is "cuda" with a
    transport, else the fp8 GEMM (fo_jax/fp8.py: its kernel on CUDA devices, the dequantizing
    reference elsewhere) then XLA's collective."""
    m, k, n = x.shape[0], x.shape[1], w.shape[1]
    bf16 = jnp.dtype(jnp.bfloat16)
    choice = _choose_fp8_overlapped(config, m, n, k, "cuda", collective, size)

    def plain(x, w, xs, ws):
        y = fp8._unbatched(x, w, xs, ws, bf16, False, config)
        return reference.apply_collective(y, axis_name, collective)

    if choice.path != "cuda" or choice.transport is None:
        return plain(x, w, xs, ws)
    from fo_jax._cuda_ops import overlapped_matmul_fp8_cuda  # noqa: PLC0415 (needs the module)

    fn = "fo_jax.overlapped_matmul"
    plan = _plan.plan_overlap(fn, collective, size, fp8.FP8_DTYPE, m, n, k, config,
                              choice.transport)
    log.debug("%s: plan: %s", fn, plan.describe())

    def cuda(x, w, xs, ws):  # the kernel reads the weight K-major
        return overlapped_matmul_fp8_cuda(x, w.T, xs, ws, axis_name=axis_name, plan=plan,
                                          config=config)

    def default(x, w, xs, ws):
        return reference.apply_collective(fp8._reference(x, w, xs, ws, bf16, False), axis_name,
                                          collective)

    return jax.lax.platform_dependent(x, w, xs, ws, cuda=cuda, default=default)


def _fp8_overlap_batchable(axis_name: str, collective: str, config, size: int):
    """The fp8 forward (x, w, xs, ws) -> y with a batching rule: a batched x (one weight, one
    pair of scales) joins the GEMM's rows as for 16-bit operands (_overlap_batchable); a batched
    weight or scale maps over the batch, one overlapped call each."""

    @custom_vmap
    def forward(x, w, xs, ws):
        return _fp8_overlap_unbatched(x, w, xs, ws, axis_name, collective, config, size)

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, x, w, xs, ws):
        inner = _fp8_overlap_batchable(axis_name, collective, config, size)
        if any(in_batched[1:]):
            return fp8.map_over_batch(inner, axis_size, in_batched, (x, w, xs, ws)), True
        b, r, k = x.shape
        n = w.shape[1]
        if collective == "all_reduce":
            return inner(x.reshape(b * r, k), w, xs, ws).reshape(b, r, n), True
        rows = x.reshape(b, size, r // size, k).transpose(1, 0, 2, 3).reshape(b * r, k)
        return inner(rows, w, xs, ws).reshape(b, r // size, n), True

    return forward


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _fp8_overlapped_vjp(axis_name, collective, config, size, x, w, xs, ws):
    """psum / psum_scatter of (x * xs) @ (w * ws) in bfloat16 (x[M, K], w[K, N] float8_e4m3fn)
    with the fp8 GEMM's reverse-mode rule (fo_jax/fp8.py, cotangents: float32 from the
    dequantized operands). The backward's collective is XLA's (an all-gather of dy for the
    reduce-scatter, none for the all-reduce), as autodiff.overlapped_matmul_vjp pairs them."""
    return _fp8_overlap_batchable(axis_name, collective, config, size)(x, w, xs, ws)


def _fp8_overlapped_fwd(axis_name, collective, config, size, x, w, xs, ws):
    y = _fp8_overlapped_vjp(axis_name, collective, config, size, x, w, xs, ws)
    return y, (x, w, xs, ws)


def _fp8_overlapped_bwd(axis_name, collective, config, size, res, dy):
    del config, size
    x, w, xs, ws = res
    # As autodiff's rule for 16-bit operands: under check_vma=True the product being reduced
    # varies over axis_name (x or w does); under check_vma=False each device holds a share of a
    # replicated cotangent, summed by one psum.
    checked = bool(_vma.varying_axes(x) | _vma.varying_axes(w))
    if collective == "reduce_scatter":
        dy = autodiff.vary(dy, {axis_name}) if checked else dy
        g = jax.lax.all_gather(dy, axis_name, axis=0, tiled=True)
    else:
        g = dy if checked else jax.lax.psum(dy, axis_name)
    g = autodiff.vary(g, _vma.varying_axes(x) | _vma.varying_axes(w))
    return fp8.cotangents(x, w, xs, ws, g, fit=fp8.fit_vma)


_fp8_overlapped_vjp.defvjp(_fp8_overlapped_fwd, _fp8_overlapped_bwd)


def _overlapped_2d(x, w, axis_name: str, collective: str, config, size: int):
    """psum / psum_scatter of x[M, K] @ w[K, N] (collective "all_reduce" / "reduce_scatter")
    with its VJP (a reduce-scatter's dx through the all-gather + GEMM op)."""
    if size == 1:  # the collective over one device is the identity: no counters, no communicator
        return reference.apply_collective(_gemm(x, w, config), axis_name, collective)
    forward = _overlap_batchable(axis_name, collective, config, size)
    gather_matmul = None
    if collective == "reduce_scatter":
        gather_matmul = functools.partial(_all_gather_matmul_2d, axis_name=axis_name,
                                          config=_all_gather_config(config), size=size,
                                          recompute=False)
    return autodiff.overlapped_matmul_vjp(forward, x, w, axis_name, collective, gather_matmul)


def _all_gather_forward(x, w, axis_name: str, config, size: int) -> tuple:
    """(all_gather(x) @ w, all_gather(x)) on 2-D operands; never differentiated."""
    choice = _choose_overlapped(jnp.dtype(x.dtype), config, x.shape[0], w.shape[1], w.shape[0],
                                "cuda", "all_gather", size)
    ref = functools.partial(reference.all_gather_matmul, axis_name=axis_name)
    if choice.path == "xla":
        plain = functools.partial(reference.plain_all_gather_matmul, axis_name=axis_name)
        return jax.lax.platform_dependent(x, w, cuda=plain, default=ref)
    if choice.path != "cuda":
        return ref(x, w)
    from fo_jax._cuda_ops import all_gather_matmul_cuda  # noqa: PLC0415 (needs the module)

    fn = "fo_jax.all_gather_matmul"
    m, k, n = x.shape[0], x.shape[1], w.shape[1]
    plan = _plan.plan_overlap(fn, "all_gather", size, jnp.dtype(x.dtype), m, n, k, config,
                              choice.transport)
    log.debug("%s: plan: %s", fn, plan.describe())
    cuda = functools.partial(all_gather_matmul_cuda, axis_name=axis_name, plan=plan,
                             config=config)
    return jax.lax.platform_dependent(x, w, cuda=cuda, default=ref)


def _all_gather_batchable(axis_name: str, config, size: int):
    """The forward (x, w) -> (y, gathered x) with a batching rule: a batched x joins the GEMM's
    rows (the gather then orders them rank-major, element-major within each rank's block, and
    they are put back element by element); a batched w maps over the batch."""

    @custom_vmap
    def forward(x, w):
        return _all_gather_forward(x, w, axis_name, config, size)

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, x, w):
        x_batched, w_batched = in_batched
        inner = _all_gather_batchable(axis_name, config, size)
        if w_batched:
            return _map_over_weights(inner, x, w, x_batched), (True, True)
        b, r, k = x.shape
        n = w.shape[1]
        y, g = inner(x.reshape(b * r, k), w)

        def unfold(a, cols):  # rows (rank, element, row) -> (element, rank, row)
            return a.reshape(size, b, r, cols).transpose(1, 0, 2, 3).reshape(b, size * r, cols)

        return (unfold(y, n), unfold(g, k)), (True, True)

    return forward


def _all_gather_matmul_2d(x, w, axis_name: str, config, size: int, recompute: bool) -> tuple:
    """(all_gather(x) @ w, all_gather(x)) for x[M, K], w[K, N], with its VJP (dx through the
    GEMM + reduce-scatter op)."""
    if size == 1:
        return _gemm(x, w, config), x
    forward = _all_gather_batchable(axis_name, config, size)
    matmul_scatter = functools.partial(_overlapped_2d, axis_name=axis_name,
                                       collective="reduce_scatter", config=None, size=size)
    return autodiff.all_gather_matmul_vjp(forward, x, w, axis_name, matmul_scatter, recompute)


def overlapped_matmul(x: jax.Array, w: jax.Array, *, axis_name: str,
                      collective: str = "reduce_scatter",
                      config: Optional[OverlapConfig] = None,
                      x_scale: Optional[jax.Array] = None, w_scale: Optional[jax.Array] = None,
                      out_dtype=None, w_transposed: bool = False) -> jax.Array:
    """GEMM and a collective over `axis_name`, for use inside `jax.shard_map`.

    Args:
      x: local shard [..., K] (bfloat16 or float16; float32 on the reference path); any leading
        dimensions, at least one for reduce_scatter and all_gather.
      w: local shard [K, N], same dtype as x.
      axis_name: the mesh axis of the collective (bound by an enclosing shard_map).
      collective: "reduce_scatter" returns
        `psum_scatter(x @ w, axis_name, scatter_dimension=0, tiled=True)`, shape
        [x.shape[0] / P, ..., N] (row-parallel layer, sequence-parallel output);
        "all_reduce" returns `psum(x @ w, axis_name)`, shape [..., N];
        "all_gather" returns `all_gather(x, axis_name, axis=0, tiled=True) @ w`, shape
        [P * x.shape[0], ..., N] (column-parallel layer on a sequence-parallel input; see
        `all_gather_matmul` for the gathered x too).
      config: optional `OverlapConfig`.
      x_scale, w_scale, out_dtype: for float8_e4m3fn operands, as in `fo_jax.matmul`: on CUDA
        devices fo_jax's fp8 GEMM overlapped with the collective of its bfloat16 output (either
        transport; the copy-engine reduce-scatter in its direct form, never the ring), as for
        16-bit operands. "all_gather" gathers the fp8 x: where x_scale is provably the same on
        every device (`fo_jax.quantize_fp8(x, axis_name=...)` under check_vma=True) one fp8 GEMM
        takes every gathered row, overlapped with the gather under the all-gather's opt-in
        (`OverlapConfig(all_gather="overlap")`), else after XLA's all-gather; otherwise one GEMM
        per device's rows, each with its own gathered scale (fo_jax/_fp8_all_gather.py). Their
        backward is the fp8 GEMM's float32 rule (fo_jax/fp8.py) with XLA's collectives.
      w_transposed: float8_e4m3fn operands only: w is given as [N, K], the layout the fp8
        kernel reads, which saves each call's transpose of a [K, N] weight (as in
        `fo_jax.matmul`).

    Returns:
      The result in x's dtype (bfloat16 for fp8 operands), accumulated in float32.
      Differentiable (jax.grad; the backward pairs the collectives: a reduce-scatter's dx is an
      all-gather + GEMM and an all-gather's dx a GEMM + reduce-scatter), batchable (jax.vmap),
      usable under jit, lax.scan and jax.checkpoint.

    Raises:
      TypeError / ValueError at trace time for bad input (ranks, shapes, dtypes, collective, an
      axis name not bound by shard_map, e.g. one bound by jax.vmap, x.shape[0] not divisible by
      the axis size for reduce_scatter).
    """
    if hasattr(x, "dtype") and hasattr(w, "dtype") and (fp8.is_fp8(x.dtype) or
                                                        fp8.is_fp8(w.dtype)):
        return _fp8_overlapped(x, w, axis_name, collective, config, x_scale, w_scale, out_dtype,
                               w_transposed)
    fn = "fo_jax.overlapped_matmul"
    if w_transposed or x_scale is not None or w_scale is not None or out_dtype is not None:
        _check_fp8_call(fn, x, w, x_scale, w_scale, out_dtype,
                        w_transposed)  # fp8-only arguments on 16-bit operands: raises
    if collective == "all_gather":
        return _all_gather_matmul(fn, x, w, axis_name, config, recompute=False)[0]
    dtype, size = _validate_overlapped(x, w, axis_name, collective, config)
    k, n = w.shape
    rows = _rows(x)
    _log(fn, x, w, lambda platform: _choose_overlapped(dtype, config, rows, n, k, platform,
                                                       collective, size), f" over {axis_name!r}")
    y2 = _overlapped_2d(x.reshape(rows, k), w, axis_name, collective, config, size)
    lead = x.shape[:-1]
    if collective == "reduce_scatter":
        lead = (lead[0] // size, *lead[1:])
    return y2.reshape(*lead, n)


def all_gather_matmul(x: jax.Array, w: jax.Array, *, axis_name: str,
                      config: Optional[OverlapConfig] = None, recompute: bool = False) -> tuple:
    """(all_gather(x, axis_name, axis=0, tiled=True) @ w, the gathered x), for use inside
    `jax.shard_map`: the column-parallel GEMM of a sequence-parallel layer, whose gathered input
    other GEMMs on the same input (and the backward's dw) can reuse.

    Args:
      x: local shard [A, ..., K] (this rank's rows of the sequence-parallel input).
      w: local shard [K, N] (this rank's columns).
      axis_name: the mesh axis to gather over.
      config: optional `OverlapConfig`.
      recompute: keep x (not the gathered copy) for the backward and gather it again there.

    Returns:
      (y [P * A, ..., N], x_gathered [P * A, ..., K]) in x's dtype. Differentiable (dx through
      the GEMM + reduce-scatter op, plus the scatter of the gathered x's own cotangent where it is
      used), usable under jit, vmap, lax.scan and jax.checkpoint.
    """
    return _all_gather_matmul("fo_jax.all_gather_matmul", x, w, axis_name, config, recompute)


def _all_gather_matmul(fn: str, x, w, axis_name, config, recompute: bool) -> tuple:
    """all_gather_matmul, its errors naming `fn` (the public op the user called)."""
    dtype, size = _validate_overlapped(x, w, axis_name, "all_gather", config, fn)
    k, n = w.shape
    rows = _rows(x)
    _log(fn, x, w, lambda platform: _choose_overlapped(dtype, config, rows, n, k, platform,
                                                       "all_gather", size), f" over {axis_name!r}")
    y2, g2 = _all_gather_matmul_2d(x.reshape(rows, k), w, axis_name, config, size, recompute)
    lead = (x.shape[0] * size, *x.shape[1:-1])
    return y2.reshape(*lead, n), g2.reshape(*lead, k)
