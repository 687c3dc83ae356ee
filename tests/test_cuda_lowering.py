"""Lowering the CUDA path for the "cuda" platform from CPU devices (no GPU needed): the overlap
primitive's result types pass shard_map's check_vma, and the custom call carries the mesh table
and group plan the FFI handler expects. Needs the compiled CUDA module (built wherever nvcc is)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh

NO_FALLBACK = fo_jax.OverlapConfig(allow_fallback=False, num_groups=2)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)])
def test_cuda_lowering_from_cpu(collective, mesh_shape):
    if not fo_jax.cuda_module_available():
        pytest.skip("CUDA module not built here (no nvcc at install time)")
    names = ("tp",) if len(mesh_shape) == 1 else ("data", "tp")
    mesh = cpu_mesh(mesh_shape, names)
    data = None if len(mesh_shape) == 1 else "data"
    if collective == "reduce_scatter":
        out_spec = P((data, "tp") if data else "tp", None)
    else:
        out_spec = P(data, None)
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                              config=NO_FALLBACK),
        mesh=mesh, in_specs=(P(data, "tp"), P("tp", None)), out_specs=out_spec))
    x = jnp.ones((1024, 512), jnp.bfloat16)
    w = jnp.ones((512, 256), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(f(x, w), np.float32), 512.0)  # CPU: reference
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "fo_jax_overlapped_matmul_ffi" in text
    for attr in ("mesh_rank", "mesh_group", "unique_ids", "group_begin", "nranks"):
        assert attr in text, attr
