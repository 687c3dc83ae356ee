"""The CUDA forwards: JAX-side bindings of fo_jax's FFI targets.

- `matmul_cuda` / `signaling_gemm`: the signaling GEMM alone (target fo_jax_gemm_ffi).
- `overlapped_matmul_cuda`: GEMM + counter-gated NCCL collective (target
  fo_jax_overlapped_matmul_ffi), bound through a small primitive because its lowering needs the
  concrete mesh (to know each device's tensor-parallel group and rank; see _bootstrap.py).
Shapes and dtypes are validated by the callers (overlap.py); these only build the calls.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from fo_jax import _bootstrap, _cuda, _vma
from fo_jax._plan import GemmPlan

COLLECTIVE_CODES = {"reduce_scatter": 0, "all_reduce": 1}


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


def signaling_gemm(a: jax.Array, b: jax.Array, plan: GemmPlan, batch: int = 1,
                   signal: bool = True, d_init: jax.Array | None = None):
    """(d, counters): the raw kernel entry (batch > 1 writes the group-major remapped layout).
    With `d_init` the kernel writes into that buffer (aliased), so tests can poison it."""
    _cuda.register_targets()
    d = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype)
    counters = jax.ShapeDtypeStruct((plan.num_groups,), np.uint32)
    attrs = dict(config=np.int32(plan.config_index), batch=np.int32(batch),
                 group_begin=np.asarray(plan.group_begin, np.int32),
                 sm_budget=np.int32(plan.sm_budget), signal=bool(signal))
    if d_init is None:
        return jax.ffi.ffi_call("fo_jax_gemm_ffi", (d, counters))(a, b, **attrs)
    call = jax.ffi.ffi_call("fo_jax_gemm_into_ffi", (d, counters), input_output_aliases={2: 0})
    return call(a, b, d_init, **attrs)


def matmul_cuda(x: jax.Array, w: jax.Array, plan: GemmPlan) -> jax.Array:
    return signaling_gemm(x, w, plan, batch=1, signal=False)[0]


overlap_p = Primitive("fo_jax_overlapped_matmul")
overlap_p.multiple_results = True


@overlap_p.def_abstract_eval
def _overlap_abstract_eval(x, w, *, result_avals, **_):
    del x, w
    return result_avals


TRANSPORT_CODES = {"nccl": 0, "copy_engine": 1}
SUM_SPLIT_CODES = {"one": 0, "bands": 1, "rows": 2}  # PeerCollectiveArgs::SumSplit


def _overlap_lowering(ctx, x, w, *, result_avals, axis_name, collective, plan, nccl_max_ctas,
                      spin_wait, transport):
    del result_avals
    fn = "fo_jax.overlapped_matmul"
    mesh = _bootstrap.concrete_mesh_of(ctx.module_context.axis_context, fn)
    if axis_name not in mesh.axis_names:
        raise ValueError(f"{fn}: axis {axis_name!r} is not an axis of the lowering mesh "
                         f"{tuple(mesh.axis_names)}")
    mesh_attrs = _bootstrap.mesh_attributes(
        mesh, axis_name, nccl_max_ctas, jax.process_index(), jax.process_count(),
        _cuda.module().nccl_unique_id)
    rule = jax.ffi.ffi_lowering("fo_jax_overlapped_matmul_ffi")
    return rule(ctx, x, w, collective=np.int32(COLLECTIVE_CODES[collective]),
                config=np.int32(plan.config_index),
                group_begin=np.asarray(plan.group_begin, np.int32),
                sm_budget=np.int32(plan.sm_budget), nccl_max_ctas=np.int32(nccl_max_ctas),
                spin_wait=bool(spin_wait), transport=np.int32(TRANSPORT_CODES[transport]),
                rounds=np.int32(plan.rounds),
                sum_split=np.int32(SUM_SPLIT_CODES[plan.sum_split]),
                copy_options=np.int32(int(plan.flag_stream) | 2 * int(plan.acks_first)),
                ring=np.int32(plan.ring),
                **mesh_attrs)


mlir.register_lowering(overlap_p, _overlap_lowering, platform="cuda")


def overlapped_matmul_cuda(x: jax.Array, w: jax.Array, axis_name: str, collective: str,
                           axis_size: int, plan: GemmPlan, nccl_max_ctas: int,
                           spin_wait: bool = False, transport: str = "nccl") -> jax.Array:
    """psum / psum_scatter of x @ w computed by the overlapped CUDA pipeline (transport: "nccl"
    or "copy_engine", see fo_jax/_transport.py; the plan must match it)."""
    _cuda.register_targets()
    m, n = x.shape[0], w.shape[1]
    rs = collective == "reduce_scatter"
    # Operands with different varying axes (x varies over a data axis, w does not) are fine for
    # the custom call; the result varies over the union, minus the reduced axis for psum.
    like = (x, w)
    result_avals = (
        _result_aval(like, (m // axis_size if rs else m, n), x.dtype,
                     drop_axes=() if rs else (axis_name,)),
        # workspace: the GEMM's output, group-major (NCCL) or in natural row order (copy engine)
        _result_aval(like, (m, n) if rs else (1,), x.dtype),
        _result_aval(like, (plan.num_groups,), np.uint32),  # counters
    )
    outs = overlap_p.bind(x, w, result_avals=result_avals, axis_name=axis_name,
                          collective=collective, plan=plan, nccl_max_ctas=int(nccl_max_ctas),
                          spin_wait=bool(spin_wait), transport=transport)
    return outs[0]
