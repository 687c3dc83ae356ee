"""Gradients through the CUDA path (custom VJP around the FFI custom call) against autodiff of
the reference XLA ops, on 2+ GPUs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import fo_jax
from conftest import gpu_devices_or_skip, tp_or_skip
from numerics import assert_close, random_operands

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_grads_through_cuda_path_match_reference(collective):
    tp = tp_or_skip()
    devs = gpu_devices_or_skip(tp)
    assert fo_jax.cuda_module_available(), "GPU present but the CUDA module is not built"
    mesh = Mesh(np.array(devs), ("tp",))
    m, n, k = 1024, 512, 1024
    rng = np.random.default_rng(8)
    x, w, _, _ = random_operands(rng, m, k, n, jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    out_spec = P("tp", None) if collective == "reduce_scatter" else P()
    cfg = fo_jax.OverlapConfig(allow_fallback=False)

    def make(use_reference):
        def body(x, w):
            if use_reference:
                return fo_jax.reference.overlapped_matmul(x, w, "tp", collective)
            return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                            config=cfg)

        f = jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                          out_specs=out_spec)
        # value_and_grad: the loss needs the forward, so the custom call is not dead code.
        return jax.jit(jax.value_and_grad(
            lambda x, w: jnp.sum((f(x, w) * ct).astype(jnp.float32)), argnums=(0, 1)))

    fo = make(False)
    assert "fo_jax_overlapped_matmul_v2" in fo.lower(x, w).as_text()
    loss, (dx, dw) = fo(x, w)
    ref_loss, (rx, rw) = make(True)(x, w)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=2e-2)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert_close(dx, np.asarray(rx.astype(jnp.float32)), jnp.bfloat16)
    assert_close(dw, np.asarray(rw.astype(jnp.float32)), jnp.bfloat16)
