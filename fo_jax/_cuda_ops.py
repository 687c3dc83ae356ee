"""The CUDA forwards: JAX-side bindings of fo_jax's FFI targets.

- `matmul_cuda` / `signaling_gemm`: the signaling GEMM alone (target fo_jax_gemm_v2); its fp8
  form `matmul_fp8_cuda` / `signaling_gemm_fp8` (target fo_jax_gemm_fp8_v1: the weight K-major,
  two float32 scalar scales as extra operands, bfloat16 output).
  A plan that splits K (GemmPlan.k_splits > 1) calls their split-K forms
  (fo_jax_gemm_split_k_v1, fo_jax_gemm_fp8_split_k_v1): a k_splits attribute, the split flags
  after the group counters in the counters result, and a third result for the partial sums.
- `overlapped_matmul_cuda`: GEMM + counter-gated collective (target fo_jax_overlapped_matmul_v2),
  bound through a small primitive because its lowering needs the concrete mesh (to know each
  device's tensor-parallel group and rank; see _bootstrap.py); its fp8 form
  `overlapped_matmul_fp8_cuda` (target fo_jax_overlapped_matmul_fp8_v1: the weight K-major, the
  two float32 scales as extra operands, bfloat16 results on which the collective runs).
Each call carries its plan (fo_jax/_plan.py) as ONE struct attribute, `plan`; enum values come
from the compiled module (csrc/fo_jax_module.cc), so Python and C++ cannot disagree on them.
Shapes and dtypes are validated by the callers (overlap.py); these only build the calls.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from fo_jax import _bootstrap, _cuda, _vma
from fo_jax._plan import GemmPlan, OverlapPlan, split_k_sizes

GEMM_TARGET = "fo_jax_gemm_v2"
GEMM_INTO_TARGET = "fo_jax_gemm_into_v2"
GEMM_FP8_TARGET = "fo_jax_gemm_fp8_v1"
GEMM_FP8_INTO_TARGET = "fo_jax_gemm_fp8_into_v1"
GEMM_SPLIT_K_TARGET = "fo_jax_gemm_split_k_v1"
GEMM_SPLIT_K_INTO_TARGET = "fo_jax_gemm_split_k_into_v1"
GEMM_FP8_SPLIT_K_TARGET = "fo_jax_gemm_fp8_split_k_v1"
OVERLAP_TARGET = "fo_jax_overlapped_matmul_v2"
OVERLAP_FP8_TARGET = "fo_jax_overlapped_matmul_fp8_v1"


def _result_aval(likes, shape, dtype, drop_axes=()):
    """The abstract value of a result: on the operands' mesh, varying over the union of their
    varying manual axes minus `drop_axes` (what psum does), so shard_map's check_vma sees the
    same types as on the reference path."""
    from jax.sharding import NamedSharding, PartitionSpec

    base = jax.typeof(likes[0])
    sharding = NamedSharding(base.sharding.mesh, PartitionSpec(*([None] * len(shape))))
    varying = frozenset().union(*(_vma.varying_axes(a) for a in likes)) - frozenset(drop_axes)
    aval = base.update(shape=tuple(shape), dtype=np.dtype(dtype), weak_type=False,
                       sharding=sharding)
    return _vma.with_varying(aval, varying)


def gemm_attribute(plan: GemmPlan) -> dict:
    """The GEMM part of a plan as the FFI struct csrc/ffi/plan_attrs.h decodes (GemmPlanAttr)."""
    return dict(config=np.int32(plan.config_index), batch=np.int32(plan.batch),
                group_begin=np.asarray(plan.group_begin, np.int32),
                sm_budget=np.int32(plan.sm_budget))


def overlap_attribute(plan: OverlapPlan) -> dict:
    """An overlap plan as the FFI struct csrc/ffi/plan_attrs.h decodes (OverlapPlanAttr)."""
    mod = _cuda.module()
    return dict(
        collective=np.int32(mod.Collective[plan.collective].value),
        transport=np.int32(mod.Transport[plan.transport].value),
        axis_size=np.int32(plan.axis_size),
        gemm=gemm_attribute(plan.gemm),
        nccl_max_ctas=np.int32(plan.nccl_max_ctas),
        rounds=np.int32(plan.rounds),
        ring=bool(plan.ring),
        sum_split=np.int32(mod.SumSplit[plan.sum_split].value),
        tiles_chunk=np.int32(plan.tiles_chunk),
    )


# jax.ffi.ffi_call takes one level of attributes (a dict of scalars); a plan is a struct with
# arrays and a nested struct, so fo_jax's calls go through this primitive, whose parameter is the
# attributes in a hashable form, turned back into dicts and arrays for ffi_lowering.
ffi_p = Primitive("fo_jax_ffi_call")
ffi_p.multiple_results = True


def _freeze(value):
    if isinstance(value, dict):
        return ("dict", tuple((k, _freeze(v)) for k, v in sorted(value.items())))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, tuple(value.tolist()))
    return ("scalar", value)


def _thaw(frozen):
    kind = frozen[0]
    if kind == "dict":
        return {k: _thaw(v) for k, v in frozen[1]}
    if kind == "array":
        return np.asarray(frozen[2], np.dtype(frozen[1]))
    return frozen[1]


@ffi_p.def_abstract_eval
def _ffi_abstract_eval(*args, result_avals, **_):
    del args
    return result_avals


@ffi_p.def_impl
def _ffi_impl(*args, **params):
    return jax.jit(functools.partial(ffi_p.bind, **params))(*args)  # eager: compile the call


def _ffi_lowering(ctx, *args, target, attrs, aliases, **_):
    rule = jax.ffi.ffi_lowering(target, operand_output_aliases=dict(aliases))
    return rule(ctx, *args, **_thaw(attrs))


mlir.register_lowering(ffi_p, _ffi_lowering)


def _ffi_call(target: str, args: tuple, result_avals: tuple, attrs: dict, aliases=()):
    return ffi_p.bind(*args, target=target, attrs=_freeze(attrs),
                      result_avals=tuple(result_avals), aliases=tuple(aliases))


def _gemm_results(like, rows: int, n: int, dtype, plan: GemmPlan) -> tuple:
    """Result avals of a GEMM call: d, the counters (and, splitting K, the split flags after
    them, then the partial sums)."""
    flags, partials = split_k_sizes(plan, rows // plan.batch, n)
    results = (_result_aval(like, (rows, n), dtype),
               _result_aval(like, (plan.num_groups + flags,), np.uint32))
    if plan.k_splits > 1:
        results += (_result_aval(like, (partials,), np.float32),)
    return results


def _gemm_attrs(plan: GemmPlan, signal: bool) -> dict:
    attrs = dict(plan=gemm_attribute(plan), signal=bool(signal))
    if plan.k_splits > 1:
        attrs["k_splits"] = np.int32(plan.k_splits)
    return attrs


def _d_and_counters(results, plan: GemmPlan, signal: bool) -> tuple:
    """(d, the group counters) of a GEMM call's results; counters None without signals (the
    kernel then leaves that result unwritten: csrc/ffi/gemm_ffi.cc)."""
    d, counters = results[0], results[1]
    if not signal:
        return d, None
    if plan.k_splits > 1:
        counters = counters[:plan.num_groups]
    return d, counters


def signaling_gemm(a: jax.Array, b: jax.Array, plan: GemmPlan, batch: Optional[int] = None,
                   signal: bool = True, d_init: jax.Array | None = None):
    """(d, counters): the raw kernel entry (a batch > 1 writes the group-major remapped layout);
    counters None when signal is False. `batch` must be the plan's (it is there for callers that
    name it). With `d_init` the kernel writes into that buffer (aliased), so tests can poison
    it."""
    if batch is not None and batch != plan.batch:
        raise ValueError(f"fo_jax.signaling_gemm: batch {batch} but the plan was made for "
                         f"batch {plan.batch}")
    _cuda.register_targets()
    results = _gemm_results((a, b), a.shape[0], b.shape[1], a.dtype, plan)
    attrs = _gemm_attrs(plan, signal)
    split = plan.k_splits > 1
    if d_init is None:
        out = _ffi_call(GEMM_SPLIT_K_TARGET if split else GEMM_TARGET, (a, b), results, attrs)
    else:
        out = _ffi_call(GEMM_SPLIT_K_INTO_TARGET if split else GEMM_INTO_TARGET,
                        (a, b, d_init), results, attrs, aliases=((2, 0),))
    return _d_and_counters(out, plan, signal)


def matmul_cuda(x: jax.Array, w: jax.Array, plan: GemmPlan) -> jax.Array:
    return signaling_gemm(x, w, plan, signal=False)[0]


def signaling_gemm_fp8(a: jax.Array, b_nk: jax.Array, a_scale: jax.Array, b_scale: jax.Array,
                       plan: GemmPlan, signal: bool = True, d_init: jax.Array | None = None):
    """(d, counters) of the fp8 kernel: a[B*m, k] and b_nk[n, k] (the weight K-major)
    float8_e4m3fn, a_scale and b_scale float32 scalars, d = a_scale * b_scale * (a @ b_nk^T) in
    bfloat16 (target fo_jax_gemm_fp8_v1); counters None when signal is False. With `d_init` the
    kernel writes into that buffer (aliased), so tests can poison it."""
    _cuda.register_targets()
    results = _gemm_results((a, b_nk), a.shape[0], b_nk.shape[0],
                            np.dtype(jax.numpy.bfloat16), plan)
    attrs = _gemm_attrs(plan, signal)
    args = (a, b_nk, a_scale, b_scale)
    if plan.k_splits > 1:
        if d_init is not None:
            raise ValueError("fo_jax.signaling_gemm_fp8: no aliased output with split K")
        out = _ffi_call(GEMM_FP8_SPLIT_K_TARGET, args, results, attrs)
    elif d_init is None:
        out = _ffi_call(GEMM_FP8_TARGET, args, results, attrs)
    else:
        out = _ffi_call(GEMM_FP8_INTO_TARGET, args + (d_init,), results, attrs,
                        aliases=((4, 0),))
    return _d_and_counters(out, plan, signal)


def matmul_fp8_cuda(x: jax.Array, w_nk: jax.Array, x_scale: jax.Array, w_scale: jax.Array,
                    plan: GemmPlan) -> jax.Array:
    return signaling_gemm_fp8(x, w_nk, x_scale, w_scale, plan, signal=False)[0]


overlap_p = Primitive("fo_jax_overlapped_matmul")
overlap_p.multiple_results = True


@overlap_p.def_abstract_eval
def _overlap_abstract_eval(*operands, result_avals, **_):
    del operands
    return result_avals


def _overlap_lowering(ctx, *operands, result_avals, axis_name, plan, explicit=()):
    """x, w (bf16/f16: target OVERLAP_TARGET) or x, w_nk, x_scale, w_scale (float8_e4m3fn:
    OVERLAP_FP8_TARGET)."""
    del result_avals
    fn = "fo_jax.overlapped_matmul"
    mesh = _bootstrap.concrete_mesh_of(ctx.module_context.axis_context, fn)
    if axis_name not in mesh.axis_names:
        raise ValueError(f"{fn}: axis {axis_name!r} is not an axis of the lowering mesh "
                         f"{tuple(mesh.axis_names)}")
    if mesh.shape[axis_name] != plan.axis_size:
        raise ValueError(f"{fn}: the plan is for {plan.axis_size} ranks, axis {axis_name!r} of "
                         f"the lowering mesh has {mesh.shape[axis_name]}")
    mod = _cuda.module()
    mesh_attrs = _bootstrap.overlap_mesh_attributes(
        mesh, axis_name, plan, ctx.avals_in, jax.process_index(), jax.process_count(),
        mod.nccl_unique_id, explicit, mod.register_group_unique_id)
    rule = jax.ffi.ffi_lowering(OVERLAP_FP8_TARGET if len(operands) == 4 else OVERLAP_TARGET)
    return rule(ctx, *operands, plan=overlap_attribute(plan), **mesh_attrs)


mlir.register_lowering(overlap_p, _overlap_lowering, platform="cuda")


def overlapped_matmul_cuda(x: jax.Array, w: jax.Array, axis_name: str,
                           plan: OverlapPlan, config=None) -> jax.Array:
    """psum / psum_scatter of x @ w computed by the overlapped CUDA pipeline, as `plan` says
    (fo_jax/_plan.py, plan_overlap); `config`, the call's OverlapConfig, names the call in the
    plan agreement between processes (fo_jax/_bootstrap.py)."""
    _cuda.register_targets()
    m, n = x.shape[0], w.shape[1]
    rs = plan.collective == "reduce_scatter"
    # Operands with different varying axes (x varies over a data axis, w does not) are fine for
    # the custom call; the result varies over the union, minus the reduced axis for psum.
    like = (x, w)
    result_avals = (
        _result_aval(like, (m // plan.axis_size if rs else m, n), x.dtype,
                     drop_axes=() if rs else (axis_name,)),
        # workspace: the GEMM's output, group-major (NCCL) or in natural row order (copy engine)
        _result_aval(like, (m, n) if rs else (1,), x.dtype),
        # the handler's third result (the all-gather's band flags): unwritten here, the GEMM
        # signals into its communicator's counters (csrc/comm/group_counters.h)
        _result_aval(like, (plan.num_groups,), np.uint32),
    )
    outs = overlap_p.bind(x, w, result_avals=result_avals, axis_name=axis_name, plan=plan,
                          explicit=_bootstrap.explicit_config(config))
    return outs[0]


def overlapped_matmul_fp8_cuda(x: jax.Array, w_nk: jax.Array, x_scale: jax.Array,
                               w_scale: jax.Array, axis_name: str, plan: OverlapPlan,
                               config=None) -> jax.Array:
    """psum / psum_scatter of (x * x_scale) @ (w_nk * w_scale)^T in bfloat16 by the overlapped
    CUDA pipeline: x[m, k] and w_nk[n, k] (the weight K-major) float8_e4m3fn, the scales float32
    scalars; the fp8 GEMM writes bfloat16 and the collective moves and sums that."""
    _cuda.register_targets()
    m, n = x.shape[0], w_nk.shape[0]
    rs = plan.collective == "reduce_scatter"
    bf16 = np.dtype(jax.numpy.bfloat16)
    like = (x, w_nk)
    result_avals = (
        _result_aval(like, (m // plan.axis_size if rs else m, n), bf16,
                     drop_axes=() if rs else (axis_name,)),
        _result_aval(like, (m, n) if rs else (1,), bf16),  # workspace, as overlapped_matmul_cuda
        _result_aval(like, (plan.num_groups,), np.uint32),  # unwritten, as above
    )
    outs = overlap_p.bind(x, w_nk, x_scale, w_scale, result_avals=result_avals,
                          axis_name=axis_name, plan=plan,
                          explicit=_bootstrap.explicit_config(config))
    return outs[0]


def all_gather_matmul_cuda(x: jax.Array, w: jax.Array, axis_name: str,
                           plan: OverlapPlan, config=None) -> tuple:
    """(all_gather(x) @ w, all_gather(x)) by the overlapped CUDA pipeline (the consumer GEMM
    reading the gathered rows as NCCL brings them), as `plan` says (fo_jax/_plan.py,
    plan_all_gather). The gathered x is the call's second result, an XLA buffer."""
    _cuda.register_targets()
    m, k, n = x.shape[0] * plan.axis_size, x.shape[1], w.shape[1]
    result_avals = (
        _result_aval((x, w), (m, n), x.dtype),
        _result_aval((x,), (m, k), x.dtype),  # the gathered x: x's varying axes, as all_gather
        _result_aval((x, w), (plan.num_groups,), np.uint32),  # one flag per band
    )
    outs = overlap_p.bind(x, w, result_avals=result_avals, axis_name=axis_name, plan=plan,
                          explicit=_bootstrap.explicit_config(config))
    return outs[0], outs[1]


def all_gather_matmul_fp8_cuda(x: jax.Array, w_nk: jax.Array, x_scale: jax.Array,
                               w_scale: jax.Array, axis_name: str, plan: OverlapPlan,
                               config=None) -> tuple:
    """(all_gather(x * x_scale) @ (w_nk * w_scale)^T in bfloat16, all_gather(x)) by the
    overlapped CUDA pipeline: x[m, k] and w_nk[n, k] float8_e4m3fn, one x_scale for every
    gathered row (the caller's to ensure: fo_jax/_fp8_all_gather.py), the consumer GEMM the fp8
    kernel's. The gathered x (fp8) is the call's second result."""
    _cuda.register_targets()
    m, k, n = x.shape[0] * plan.axis_size, x.shape[1], w_nk.shape[0]
    result_avals = (
        _result_aval((x, w_nk), (m, n), np.dtype(jax.numpy.bfloat16)),
        _result_aval((x,), (m, k), x.dtype),  # the gathered x: x's varying axes, as all_gather
        _result_aval((x, w_nk), (plan.num_groups,), np.uint32),  # one flag per band
    )
    outs = overlap_p.bind(x, w_nk, x_scale, w_scale, result_avals=result_avals,
                          axis_name=axis_name, plan=plan,
                          explicit=_bootstrap.explicit_config(config))
    return outs[0], outs[1]


CHECK_TARGET = "fo_jax_check_overlap_plan"
# The words of fo_jax_check_overlap_plan's output (csrc/ffi/plan_check_ffi.cc, PlanCheckWord),
# then one expected counter value per group (max_gemm_groups of them).
PLAN_CHECK_FIELDS = ("batch", "m", "n", "k", "config", "num_groups", "sm_budget",
                     "rotate_tile_rows", "rotate_period_tile_rows", "output_rows", "rank", "group")


@functools.lru_cache(maxsize=None)
def _register_cpu_targets() -> None:
    for name, capsule in _cuda.module().cpu_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")


def check_overlap_plan(plan_attr: dict, dtype, m: int, n: int, k: int, rank: int = 0,
                       mesh_attr: Optional[dict] = None, device: Optional[int] = None) -> dict:
    """Runs the overlap handler's own decoding of `plan_attr` (a dict as `overlap_attribute`
    makes it) and of a mesh table (`mesh_attr`, as _bootstrap.mesh_attributes makes it; default:
    one group of the plan's ranks on devices 0, 1, ...), and its validation of the plan, on the
    CPU, for operands x[m, k] @ w[k, n] of `dtype`; returns what the handler derives for device
    `device` (default: the device of `rank` in the default mesh): the GEMM's arguments, the
    device's rank and group (PLAN_CHECK_FIELDS) and each group's expected counter value
    ("expected"). An invalid plan raises with the handler's message. For tests: the host side
    of the handler runs without a GPU."""
    mod = _cuda.module()
    _register_cpu_targets()
    if mesh_attr is None:
        size = int(plan_attr["axis_size"])
        mesh_attr = dict(process=np.int32(0), device_process=np.zeros(size, np.int32),
                         device_ordinal=np.arange(size, dtype=np.int32),
                         device_rank=np.arange(size, dtype=np.int32),
                         device_group=np.zeros(size, np.int32))
        device = rank if device is None else device
    words = len(PLAN_CHECK_FIELDS) + int(mod.max_gemm_groups())
    attrs = dict(plan=plan_attr, mesh=mesh_attr,
                 dtype=np.int32(mod.GemmDtype[np.dtype(dtype).name].value),
                 m=np.int32(m), n=np.int32(n), k=np.int32(k), device=np.int32(device))
    with jax.default_device(jax.devices("cpu")[0]):
        (out,) = _ffi_call(CHECK_TARGET, (), (jax.core.ShapedArray((words,), np.int32),),
                           attrs)
    out = np.asarray(out)
    result = dict(zip(PLAN_CHECK_FIELDS, (int(v) for v in out)))
    groups = result["num_groups"]
    result["expected"] = [int(v) for v in out[len(PLAN_CHECK_FIELDS):][:groups]]
    return result
