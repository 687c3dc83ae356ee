"""Every overlapped call carries the OverlapConfig fields its caller set (`explicit`) into its
lowering: across processes the plan-agreement check names a call by them
(_bootstrap.call_identity), so two calls with the same operands but different configs (e.g. the
copy engine requested, then the default) are two calls, not one call planned two ways."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="CUDA module not built here (no nvcc at install time)")

SIZE, M, K, N = 2, 512, 256, 512


def _overlap_params(jaxpr) -> list:
    """The params of every fo_jax_overlapped_matmul equation in `jaxpr` and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "fo_jax_overlapped_matmul":
            found.append(eqn.params)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found.extend(_overlap_params(inner))
    return found


def _call(collective, config, fp8):
    def bf16(x, w):
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                        config=config)

    def e4m3(x, w, a, b):
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                        config=config, x_scale=a, w_scale=b)

    return e4m3 if fp8 else bf16


def _specs(collective, fp8):
    if collective == "all_gather":
        ins, out = (P("tp", None), P(None, "tp")), P(None, "tp")
    else:
        ins = (P(None, "tp"), P("tp", None))
        out = P("tp", None) if collective == "reduce_scatter" else P()
    return (ins + (P(), P())) if fp8 else ins, out


def _operands(fp8):
    x = jax.random.normal(jax.random.key(0), (M * SIZE, K * SIZE), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (K * SIZE, N * SIZE), jnp.float32)
    if not fp8:
        return x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    xq, xs = fo_jax.quantize_fp8(x)
    wq, ws = fo_jax.quantize_fp8(w)
    return xq, wq, xs, ws


@pytest.mark.parametrize("fp8", [False, True], ids=["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "all_gather"])
def test_each_overlapped_call_carries_its_explicit_config(collective, fp8):
    from fo_jax import _bootstrap

    mesh = cpu_mesh((SIZE,), ("tp",))
    ins, out = _specs(collective, fp8)
    configs = (fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False),
               fo_jax.OverlapConfig(all_gather="overlap", allow_fallback=False,
                                    transport="nccl", num_groups=2))
    seen = []
    for config in configs:
        f = jax.shard_map(_call(collective, config, fp8), mesh=mesh, in_specs=ins,
                          out_specs=out)
        params = _overlap_params(jax.make_jaxpr(f)(*_operands(fp8)).jaxpr)
        assert len(params) == 1, (collective, fp8, len(params))
        assert params[0]["explicit"] == _bootstrap.explicit_config(config)
        seen.append(params[0]["explicit"])
    assert seen[0] != seen[1]
