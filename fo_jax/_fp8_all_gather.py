"""float8_e4m3fn operands through overlapped_matmul(collective="all_gather"):
all_gather(x * x_scale) @ (w * w_scale) in bfloat16, on 2-D operands.

The gathered rows carry each device's own x_scale, and fo_jax's fp8 kernels scale a whole tile by
one scalar. Where shard_map's types prove the scale equal on every device of the axis
(check_vma=True and x_scale not varying over it: what `fo_jax.quantize_fp8(x, axis_name=...)`
returns), one GEMM scales every gathered row: on CUDA devices the overlapped all-gather where the
16-bit one would run (OverlapConfig(all_gather="overlap"); its consumer GEMM is the fp8 kernel's,
fed the fp8 rows as they land), else XLA's all-gather of the fp8 x (half the bytes of a bfloat16
one), then fo_jax's fp8 GEMM (fo_jax/fp8.py: its kernel on CUDA devices, the dequantizing
reference elsewhere). Otherwise the devices' scales are gathered too and each device's rows run
as their own GEMM with their own scale: exact for any scales, one GEMM per device. The backward
is the fp8 GEMM's float32 rule with XLA's collectives: dL/dX of the gathered rows is
reduce-scattered in float32, then rounded to fp8.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from fo_jax import _plan, _vma, autodiff, fp8

_BF16 = jnp.dtype(jnp.bfloat16)
_HI = jax.lax.Precision.HIGHEST


def _types_tracked(axis_name: str) -> bool:
    """Whether shard_map tracks varying-axes types (check_vma=True): the device index then
    varies over the axis."""
    return axis_name in _vma.varying_axes(jax.lax.axis_index(axis_name))


def scale_is_shared(x_scale, axis_name: str) -> bool:
    """Whether shard_map's varying-axes types prove x_scale equal on every device of axis_name:
    they are tracked and x_scale does not vary over it."""
    return _types_tracked(axis_name) and axis_name not in _vma.varying_axes(x_scale)


def _gathered_scales(xs, axis_name: str):
    """[P]: every device's x_scale, in the all-gather's device order."""
    if _types_tracked(axis_name):
        xs = autodiff.vary(xs, {axis_name})
    return jax.lax.all_gather(xs, axis_name)


def _plain_shared(x, w, xs, ws, axis_name: str, config):
    g = jax.lax.all_gather(x, axis_name, axis=0, tiled=True)
    return fp8.fp8_gemm(g, w, xs, ws, _BF16, False, config)


def _forward(x, w, xs, ws, axis_name: str, size: int, config):
    m, k = x.shape
    if scale_is_shared(xs, axis_name):
        from fo_jax import _paths  # noqa: PLC0415 (_paths imports fp8, which this module uses)

        choice = _paths._choose_fp8_overlapped(config, m, w.shape[1], k, "cuda", "all_gather",
                                               size)
        plain = functools.partial(_plain_shared, axis_name=axis_name, config=config)
        if choice.path != "cuda" or choice.transport is None:
            return plain(x, w, xs, ws)
        from fo_jax._cuda_ops import all_gather_matmul_fp8_cuda  # noqa: PLC0415 (the module)

        plan = _plan.plan_overlap("fo_jax.overlapped_matmul", "all_gather", size, fp8.FP8_DTYPE,
                                  m, w.shape[1], k, config, choice.transport)

        def cuda(x, w, xs, ws):  # the kernel reads the weight K-major
            return all_gather_matmul_fp8_cuda(x, w.T, xs, ws, axis_name=axis_name, plan=plan,
                                              config=config)[0]

        return jax.lax.platform_dependent(x, w, xs, ws, cuda=cuda, default=plain)
    g = jax.lax.all_gather(x, axis_name, axis=0, tiled=True)
    bands = g.reshape(size, m, k)
    scales = _gathered_scales(xs, axis_name)
    # A batched scale maps over the bands (fo_jax/fp8.py's batching rule): one GEMM each.
    y = jax.vmap(lambda b, s: fp8.fp8_gemm(b, w, s, ws, _BF16, False, config))(bands, scales)
    return y.reshape(size * m, y.shape[-1])


def _batchable(axis_name: str, size: int, config):
    """_forward with a batching rule (the overlapped CUDA call has none): a batched x (one
    weight, one pair of scales) joins the GEMM's rows, which the gather orders rank-major, then
    element by element within each rank's block, and are put back per element; a batched weight
    or scale maps over the batch."""

    @custom_vmap
    def forward(x, w, xs, ws):
        return _forward(x, w, xs, ws, axis_name, size, config)

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, x, w, xs, ws):
        inner = _batchable(axis_name, size, config)
        if any(in_batched[1:]):
            return fp8.map_over_batch(inner, axis_size, in_batched, (x, w, xs, ws)), True
        b, r, k = x.shape
        y = inner(x.reshape(b * r, k), w, xs, ws)
        n = y.shape[-1]
        return y.reshape(size, b, r, n).transpose(1, 0, 2, 3).reshape(b, size * r, n), True

    return forward


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def all_gather_fp8(axis_name: str, size: int, config, x, w, xs, ws):
    """all_gather(x * xs, axis_name, axis=0, tiled=True) @ (w * ws) in bfloat16 (x[M, K],
    w[K, N] float8_e4m3fn; xs, ws float32 scalars) with the float32 reverse-mode rule."""
    return _batchable(axis_name, size, config)(x, w, xs, ws)


def _fwd(axis_name, size, config, x, w, xs, ws):
    return all_gather_fp8(axis_name, size, config, x, w, xs, ws), (x, w, xs, ws)


def _bwd(axis_name, size, config, res, dy):
    """With X the gathered dequantized rows and W = w * ws: dL/dX = dy @ W^T, reduce-scattered
    back to each device's rows (the all-gather's transpose), dL/dW = X^T @ dy; then as
    fp8.cotangents: dL/dx = xs * dL/dX_local (rounded to fp8), dL/dxs = sum(x * dL/dX_local)
    (summed over the axis by fit_vma where xs is shared), and the same for w."""
    del config
    x, w, xs, ws = res
    m, k = x.shape
    xf, wf = x.astype(jnp.float32), w.astype(jnp.float32)
    dyf = dy.astype(jnp.float32)
    gf = jax.lax.all_gather(x, axis_name, axis=0, tiled=True).astype(jnp.float32)  # fp8 bytes
    if scale_is_shared(xs, axis_name):
        gf = gf * xs
    else:
        scales = _gathered_scales(xs, axis_name)
        gf = (gf.reshape(size, m, k) * scales[:, None, None]).reshape(size * m, k)
    g_all = jnp.dot(dyf, (wf * ws).T, precision=_HI)  # dL/dX of the gathered rows [P*M, K]
    # As _fp8_overlapped_bwd: under check_vma=True the reduce-scatter's operand varies over the
    # axis (dy does, or is marked so); without it each device holds its own share.
    checked = bool(_vma.varying_axes(x) | _vma.varying_axes(w))
    if checked:
        g_all = autodiff.vary(g_all, {axis_name})
    g_x = jax.lax.psum_scatter(g_all, axis_name, scatter_dimension=0, tiled=True)  # [M, K]
    g_w = jnp.dot(gf.T, dyf, precision=_HI)  # dL/dW [K, N]
    fit = fp8.fit_vma
    dx = fp8.saturate(fit(g_x * xs, x), x.dtype)
    dw = fp8.saturate(fit(g_w * ws, w), w.dtype)
    dxs = fit(jnp.sum(g_x * xf), xs).astype(xs.dtype)
    dws = fit(jnp.sum(g_w * wf), ws).astype(ws.dtype)
    return dx, dw, dxs, dws


all_gather_fp8.defvjp(_fwd, _bwd)
