"""fp8 (float8_e4m3fn) GEMMs: per-tensor current scaling and the scaled fp8 matmul.

    xq, xs = fo_jax.quantize_fp8(x)          # x ~= xq * xs, xs = amax(|x|) / 448
    wq, ws = fo_jax.quantize_fp8(w)
    y = fo_jax.matmul(xq, wq, x_scale=xs, w_scale=ws)   # bf16: (xq * xs) @ (wq * ws)

The product is accumulated in float32 and rounded once to the output dtype (bfloat16). On CUDA
devices fo_jax's fp8 kernel computes it (csrc/kernels/gemm_configs.py, the fp8_* rows): fp8 wgmma
reads both operands K-major, so the op hands the kernel w transposed ([N, K], one XLA transpose
of the fp8 weight: K * N bytes read and written per call, which a caller can avoid by passing
`w_transposed=True` with the weight already stored [N, K]); the scales are float32 device
scalars applied in the kernel's epilogue (no host synchronization). With the weight stored
[N, K], fo_jax.matmul hands the GEMM to XLA's fp8 dot of the same accumulation where the GPU
model's table holds fp8 points saying that is faster (fo_jax/_xla_fp8.py; `fo_jax.describe(x,
w, w_transposed=True)` and the DEBUG log say so; the H200 table holds them:
docs/gemm_performance.md, "fp8").
Elsewhere the reference dequantizes both operands and multiplies in float32
(`reference.fp8_matmul`).

Derivatives: JAX gives an fp8 primal an fp8 cotangent, so the gradient with respect to an fp8
operand is the float32 derivative (computed from the dequantized operands) rounded to e4m3 with
saturation: it keeps e4m3's 3 mantissa bits and its range (down to 2^-9). The scales' gradients
are float32. `quantize_fp8` passes gradients straight through (d dequant(quantize(x)) / dx = 1),
so that training through `matmul(xq, wq, x_scale=xs, w_scale=ws)` of quantized operands sees
the bf16 gradient up to that rounding where q's cotangent, scale * dL/dX, is an e4m3 normal
number (>= 2^-6); below that it loses bits, and below 2^-9 it underflows to zero (scale the loss
up, or differentiate a bf16 matmul instead).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from fo_jax import _checks, _plan

FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
# Output dtypes of the fp8 GEMM: the CUDA kernel writes bfloat16 only.
FP8_OUT_DTYPES = (jnp.dtype(jnp.bfloat16),)
# fo_jax's fp8 kernel against its bf16 kernel on one H100 where an overlap can pay (K >= 2048:
# 1.37-1.74x; docs/gemm_performance.md, "fp8"): scales the bf16 GEMM-time estimate where an fp8 call
# decides whether its overlap pays.
GEMM_SPEEDUP_OVER_BF16 = 1.41
# The same with OverlapConfig.fp8_fast_accumulation (K >= 2048: 1.52-1.97x, most shapes 1.75x
# or more; benchmarks/results/gemm_fp8_h100_2026-11-24_8631637.md).
GEMM_SPEEDUP_OVER_BF16_FAST = 1.75


def gemm_speedup_over_bf16(config) -> float:
    """How much faster fo_jax's fp8 GEMM runs than its bf16 one, for the accumulation that
    `config` asks for (the estimate that decides whether an fp8 overlap pays)."""
    fast = _plan.fast_accumulation(FP8_DTYPE, config)
    return GEMM_SPEEDUP_OVER_BF16_FAST if fast else GEMM_SPEEDUP_OVER_BF16


def is_fp8(dtype) -> bool:
    """Whether `dtype` is one of JAX's 8-bit float types (fo_jax takes float8_e4m3fn)."""
    return jnp.dtype(dtype).name.startswith("float8")


def _finfo_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def check_fp8_args(fn: str, dtype, x_scale, w_scale, out_dtype):
    """Trace-time checks of the fp8 arguments for operands of `dtype`; returns the output dtype.
    fp8 operands need both scales (float32 scalars); other operands take neither (nor out_dtype).
    """
    if not is_fp8(dtype):
        given = [name for name, v in (("x_scale", x_scale), ("w_scale", w_scale),
                                      ("out_dtype", out_dtype)) if v is not None]
        if given:
            raise TypeError(f"{fn}: {', '.join(given)} apply to float8_e4m3fn operands only; the "
                            f"operands are {jnp.dtype(dtype)}")
        return jnp.dtype(dtype)
    if jnp.dtype(dtype) != FP8_DTYPE:
        raise TypeError(f"{fn}: fp8 operands must be float8_e4m3fn, got {jnp.dtype(dtype)} (e5m2 "
                        f"is not supported: quantize with fo_jax.quantize_fp8)")
    for name, s in (("x_scale", x_scale), ("w_scale", w_scale)):
        if s is None:
            raise TypeError(f"{fn}: float8_e4m3fn operands need {name} (a float32 scalar, the "
                            f"operand's dequantization scale, e.g. from fo_jax.quantize_fp8)")
        if not hasattr(s, "shape") or not hasattr(s, "dtype"):
            raise TypeError(f"{fn}: {name} must be a float32 JAX scalar, got "
                            f"{type(s).__name__}")
        if tuple(s.shape) != () or jnp.dtype(s.dtype) != jnp.float32:
            raise TypeError(f"{fn}: {name} must be a float32 scalar (shape ()), got "
                            f"{jnp.dtype(s.dtype)}{list(s.shape)}")
    out = jnp.dtype(jnp.bfloat16 if out_dtype is None else out_dtype)
    if out not in FP8_OUT_DTYPES:
        raise TypeError(f"{fn}: out_dtype {out} is not supported for fp8 operands; supported: "
                        f"{', '.join(str(d) for d in FP8_OUT_DTYPES)}")
    return out


# --------------------------------------------------------------------------------------------
# quantize_fp8
# --------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _quantize(x, dtype, x_dtype, axis_name):
    del x_dtype  # (for the backward: the cotangent's dtype)
    fmax = _finfo_max(dtype)
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    if axis_name is not None:  # one scale for the whole axis: its devices' largest amax
        amax = jax.lax.pmax(amax, axis_name)
    scale = jnp.where(amax > 0, amax / fmax, jnp.float32(1.0)).astype(jnp.float32)
    q = jnp.clip(x.astype(jnp.float32) / scale, -fmax, fmax).astype(dtype)
    return q, scale


def _quantize_fwd(x, dtype, x_dtype, axis_name):
    q, scale = _quantize(x, dtype, x_dtype, axis_name)
    return (q, scale), scale


def _quantize_bwd(dtype, x_dtype, axis_name, scale, cts):
    # Straight through: q = x / scale, so dL/dx = dL/dq / scale. The scale's own cotangent is
    # dropped: through q * scale its path and q's dependence on the scale cancel exactly
    # (q * scale = x inside the range), which makes the round trip's derivative the identity.
    del dtype, axis_name
    ct_q, _ = cts
    return ((ct_q.astype(jnp.float32) / scale).astype(x_dtype),)


_quantize.defvjp(_quantize_fwd, _quantize_bwd)


def quantize_fp8(x: jax.Array, dtype=jnp.float8_e4m3fn, *, axis_name=None) -> tuple:
    """(q, scale): x quantized to fp8 with current (per-call amax) per-tensor scaling.

    scale = amax(|x|) / finfo(dtype).max (1 where x is all zeros), a float32 scalar;
    q = clip(x / scale) to dtype's finite range, rounded to nearest. So q * scale ~= x, with
    e4m3's relative rounding error (at most 2^-4 for normal values). Gradients pass straight
    through (d(q * scale)/dx = 1; the module docstring says how the fp8 cotangent rounds).

    axis_name: inside `jax.shard_map`, the amax is the largest over the devices of that mesh axis
    (one `pmax` of a scalar), so every device gets the same scale, and shard_map's types say so
    (it does not vary over the axis). `overlapped_matmul(..., collective="all_gather")` then
    scales the gathered rows in one GEMM; with a scale per device it runs one GEMM per device's
    rows.
    """
    fn = "fo_jax.quantize_fp8"
    if not hasattr(x, "dtype"):
        raise TypeError(f"{fn}: x must be a JAX array, got {type(x).__name__}")
    if jnp.dtype(dtype) != FP8_DTYPE:
        raise TypeError(f"{fn}: dtype must be float8_e4m3fn, got {jnp.dtype(dtype)}")
    if not jnp.issubdtype(x.dtype, jnp.floating) or is_fp8(x.dtype):
        raise TypeError(f"{fn}: x must be float32, bfloat16 or float16, got {jnp.dtype(x.dtype)}")
    if axis_name is not None:
        _checks.axis_size(fn, axis_name)  # a clear error outside shard_map or for a bad name
    return _quantize(x, jnp.dtype(dtype), jnp.dtype(x.dtype), axis_name)


def dequantize(q: jax.Array, scale: jax.Array) -> jax.Array:
    """q * scale in float32."""
    return q.astype(jnp.float32) * scale


# --------------------------------------------------------------------------------------------
# The fp8 GEMM op: x[R, K] @ w[K, N] (or w[N, K] with w_transposed), scales, bf16 out.
# --------------------------------------------------------------------------------------------
def _reference(x, w, xs, ws, out_dtype, w_transposed):
    from fo_jax import reference  # noqa: PLC0415 (reference imports nothing of ours)

    return reference.fp8_matmul(x, w.T if w_transposed else w, xs, ws, out_dtype)


def blocker(m: int, n: int, k: int) -> Optional[str]:
    """Why fo_jax's fp8 kernel cannot take x[m, k] @ w[k, n] on CUDA devices, or None."""
    from fo_jax import _cuda  # noqa: PLC0415

    if m == 0 or n == 0 or k == 0:
        return f"an empty GEMM (M={m}, N={n}, K={k}) runs on the reference path"
    if m % 8 or n % 8 or k % 16:
        return (f"the fp8 kernel needs M and N multiples of 8 and K a multiple of 16 (16-byte "
                f"rows); got M={m}, N={n}, K={k}")
    if not _cuda.module_available():
        return _cuda.unavailable_reason()
    if not any(FP8_DTYPE.name in c.get("dtypes", ()) for c in _cuda.module().gemm_configs()):
        return "the compiled CUDA module has no fp8 kernels (rebuild fo_jax)"
    return None


def _unbatched(x, w, xs, ws, out_dtype, w_transposed, config):
    from fo_jax import _paths  # noqa: PLC0415 (_paths imports this module)

    r, k = x.shape
    n = w.shape[0] if w_transposed else w.shape[1]
    path = _paths.choose_fp8("matmul", config, r, n, k, "cuda", plain_nk=w_transposed).path
    if path == "reference":
        return _reference(x, w, xs, ws, out_dtype, w_transposed)
    from fo_jax import _plan, _vma, _xla_fp8, autodiff  # noqa: PLC0415

    if path == "xla":  # measured faster here (w_transposed: w is [N, K])
        fast = _plan.fast_accumulation(FP8_DTYPE, config)
        precision = None if fast else jax.lax.Precision.HIGHEST

        def cuda(x, w, xs, ws):
            return _xla_fp8.fp8_dot(x, w, xs, ws, w_transposed=True, precision=precision)
    else:
        from fo_jax._cuda_ops import matmul_fp8_cuda  # noqa: PLC0415 (needs the module)

        plan = _plan.plan_matmul("fo_jax.matmul", x.dtype, r, n, k, config)

        def cuda(x, w, xs, ws):
            w_nk = w if w_transposed else w.T  # the kernel reads the weight K-major
            y = matmul_fp8_cuda(x, w_nk, xs, ws, plan=plan)
            return autodiff.vary(y, _vma.varying_axes(x) | _vma.varying_axes(w))

    def default(x, w, xs, ws):
        return _reference(x, w, xs, ws, out_dtype, w_transposed)

    return jax.lax.platform_dependent(x, w, xs, ws, cuda=cuda, default=default)


def map_over_batch(f, axis_size: int, in_batched, args) -> jax.Array:
    """f(*args) for each element of the batch (a custom_vmap rule's fallback: one call per
    element), the unbatched arguments broadcast along."""
    args = tuple(a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)
                 for a, b in zip(args, in_batched))
    return jax.lax.map(lambda a: f(*a), args)


def _batchable(x, w, xs, ws, out_dtype, w_transposed, config):
    @custom_vmap
    def gemm(x, w, xs, ws):
        return _unbatched(x, w, xs, ws, out_dtype, w_transposed, config)

    @gemm.def_vmap
    def gemm_batched(axis_size, in_batched, x, w, xs, ws):
        xb, wb, xsb, wsb = in_batched
        if not (wb or xsb or wsb):  # one weight and scales: the batch joins the GEMM's rows
            rows = x.reshape(-1, x.shape[-1])
            y = _batchable(rows, w, xs, ws, out_dtype, w_transposed, config)
            return y.reshape(axis_size, -1, y.shape[-1]), True
        return map_over_batch(lambda *a: _batchable(*a, out_dtype, w_transposed, config),
                              axis_size, in_batched, (x, w, xs, ws)), True

    return gemm(x, w, xs, ws)


def saturate(v, dtype):
    """float32 -> fp8 with saturation (no inf or NaN from out-of-range values)."""
    fmax = _finfo_max(dtype)
    return jnp.clip(v, -fmax, fmax).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def fp8_gemm(x, w, xs, ws, out_dtype, w_transposed, config):
    """(x * xs) @ (w * ws) in out_dtype (x[R, K]; w[K, N], or [N, K] if w_transposed)."""
    return _batchable(x, w, xs, ws, out_dtype, w_transposed, config)


def _fp8_gemm_fwd(x, w, xs, ws, out_dtype, w_transposed, config):
    return fp8_gemm(x, w, xs, ws, out_dtype, w_transposed, config), (x, w, xs, ws)


def cotangents(x, w_kn, xs, ws, dy, fit=None) -> tuple:
    """The derivative in float32 from the dequantized operands of y = (x * xs) @ (w_kn * ws):
    with X = x * xs, W = w_kn * ws, dL/dX = dy @ W^T and dL/dW = X^T @ dy; then
    dL/dx = xs * dL/dX (rounded to fp8), dL/dxs = sum(x * dL/dX), and the same for w. `fit(ct,
    primal)`, where given, gives each float32 cotangent its primal's varying-axes type before the
    rounding (autodiff.like: inside shard_map a cotangent may need a psum over an axis its primal
    does not vary over, which must add float32 values, not fp8 ones)."""
    fit = fit or (lambda ct, primal: ct)
    hi = jax.lax.Precision.HIGHEST
    xf, wf = x.astype(jnp.float32), w_kn.astype(jnp.float32)
    dyf = dy.astype(jnp.float32)
    g_x = jnp.dot(dyf, (wf * ws).T, precision=hi)  # dL/dX [R, K]
    g_w = jnp.dot((xf * xs).T, dyf, precision=hi)  # dL/dW [K, N]
    dx = saturate(fit(g_x * xs, x), x.dtype)
    dw = saturate(fit(g_w * ws, w_kn), w_kn.dtype)
    dxs = fit(jnp.sum(g_x * xf), xs).astype(xs.dtype)
    dws = fit(jnp.sum(g_w * wf), ws).astype(ws.dtype)
    return dx, dw, dxs, dws


def fit_vma(ct, primal):
    """ct with `primal`'s varying-manual-axes type, keeping ct's dtype: summed (psum) over the axes
    ct varies over and primal does not (a replicated scale's cotangent inside shard_map, where x
    varies over the tensor-parallel axis), marked varying over those it lacks; as
    autodiff.like, without its cast (cotangents rounds to fp8 after the sum)."""
    from fo_jax import _vma, autodiff  # noqa: PLC0415 (autodiff imports nothing of ours but _vma)

    extra = _vma.varying_axes(ct) - _vma.varying_axes(primal)
    if extra:
        ct = jax.lax.psum(ct, tuple(sorted(extra, key=str)))
    return autodiff.vary(ct, _vma.varying_axes(primal))


def _fp8_gemm_bwd(out_dtype, w_transposed, config, res, dy):
    """cotangents() of the dequantized operands (the weight's transposed back if given [N, K])."""
    del out_dtype, config
    x, w, xs, ws = res
    dx, dw, dxs, dws = cotangents(x, w.T if w_transposed else w, xs, ws, dy, fit=fit_vma)
    return dx, (dw.T if w_transposed else dw), dxs, dws


fp8_gemm.defvjp(_fp8_gemm_fwd, _fp8_gemm_bwd)
