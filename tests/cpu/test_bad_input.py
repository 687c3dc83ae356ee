"""Every bad input fails at trace time with a TypeError/ValueError that names the problem."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import fo_jax
from conftest import cpu_mesh
from fo_jax import _checks


def run_tp(x, w, tp=2, **kw):
    mesh = cpu_mesh((tp,), ("tp",))
    kw.setdefault("axis_name", "tp")

    def body(x, w):
        return fo_jax.overlapped_matmul(x, w, **kw)

    f = jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(), check_vma=False)
    return jax.jit(f).trace(x, w)


X = jax.ShapeDtypeStruct((8, 16), jnp.bfloat16)
W = jax.ShapeDtypeStruct((16, 8), jnp.bfloat16)


def test_bad_ranks():
    with pytest.raises(ValueError, match=r"w must have rank 2 \(\[K, N\]\)"):
        run_tp(X, jax.ShapeDtypeStruct((16,), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"x must have rank 2 or more"):
        run_tp(jax.ShapeDtypeStruct((16,), jnp.bfloat16), W, collective="reduce_scatter")
    with pytest.raises(ValueError, match=r"x must have rank 1 or more"):
        run_tp(jax.ShapeDtypeStruct((), jnp.bfloat16), W, collective="all_reduce")
    with pytest.raises(ValueError, match=r"x must have rank 1 or more"):
        fo_jax.matmul(jnp.ones((), jnp.bfloat16), jnp.ones((16, 8), jnp.bfloat16))


def test_leading_dimensions_are_accepted():
    run_tp(jax.ShapeDtypeStruct((2, 8, 16), jnp.bfloat16), W)
    run_tp(jax.ShapeDtypeStruct((16,), jnp.bfloat16), W, collective="all_reduce")


def test_mismatched_contraction():
    with pytest.raises(ValueError, match="contraction sizes differ"):
        run_tp(X, jax.ShapeDtypeStruct((12, 8), jnp.bfloat16))


def test_mismatched_dtypes():
    with pytest.raises(TypeError, match="same dtype"):
        run_tp(X, jax.ShapeDtypeStruct((16, 8), jnp.float16))


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int32, jnp.float64 if jax.config.jax_enable_x64
                                   else jnp.uint8])
def test_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="unsupported dtype"):
        run_tp(jax.ShapeDtypeStruct((8, 16), dtype), jax.ShapeDtypeStruct((16, 8), dtype))


def test_rows_not_divisible_for_reduce_scatter():
    with pytest.raises(ValueError, match="divisible by the size of axis 'tp'"):
        run_tp(jax.ShapeDtypeStruct((6, 16), jnp.bfloat16), W, tp=4, collective="reduce_scatter")


def test_all_reduce_does_not_need_divisible_rows():
    run_tp(jax.ShapeDtypeStruct((6, 16), jnp.bfloat16), W, tp=4, collective="all_reduce")


def test_unknown_collective():
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        run_tp(X, W, collective="all_to_all")


def test_axis_not_bound_inside_shard_map():
    with pytest.raises(ValueError, match="axis name 'model' is not bound"):
        run_tp(X, W, axis_name="model")


def test_outside_shard_map():
    with pytest.raises(ValueError, match="is not bound"):
        jax.jit(lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp")).trace(X, W)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "all_gather"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn])
def test_axis_bound_by_vmap(collective, dtype):
    """An axis bound by jax.vmap(axis_name=...) names no devices to overlap across: the same
    trace-time ValueError for every collective and dtype (it used to fail inside JAX's batching
    rules), the weight batched or not, and from describe(). (With a JAX whose pmap is not a
    shard_map, a vmap axis outside every mesh cannot be told from a pmap one, and passes.)"""
    if not _checks.pmap_binds_a_mesh():
        pytest.skip("this JAX's pmap binds its axis without a mesh, as vmap does")
    x = jnp.ones((2, 8, 16), dtype)
    ws = {"batched": jnp.ones((2, 16, 8), dtype), "unbatched": jnp.ones((16, 8), dtype)}
    scales = {"x_scale": jnp.float32(1), "w_scale": jnp.float32(1)} if dtype != jnp.bfloat16 else {}
    msg = r"fo_jax.overlapped_matmul: axis name 'i' is bound by jax.vmap\(axis_name=...\)"
    for name, w in ws.items():
        def body(x, w):
            return fo_jax.overlapped_matmul(x, w, axis_name="i", collective=collective, **scales)

        in_axes = (0, 0) if name == "batched" else (0, None)
        with pytest.raises(ValueError, match=msg):
            jax.vmap(body, in_axes=in_axes, axis_name="i")(x, w)
    with pytest.raises(ValueError, match=r"fo_jax.describe: axis name 'i' is bound by jax.vmap"):
        jax.vmap(lambda x: fo_jax.describe(x, ws["unbatched"], axis_name="i",
                                           collective=collective), axis_name="i")(x)


def test_all_gather_matmul_errors_name_it():
    x = jnp.ones((2, 8, 16), jnp.bfloat16)
    w = jnp.ones((16, 8), jnp.bfloat16)
    if _checks.pmap_binds_a_mesh():
        with pytest.raises(ValueError, match=r"^fo_jax.all_gather_matmul: axis name 'i' is bound"):
            jax.vmap(lambda x: fo_jax.all_gather_matmul(x, w, axis_name="i")[0],
                     axis_name="i")(x)
    with pytest.raises(TypeError, match=r"^fo_jax.all_gather_matmul: unsupported dtype int32"):
        jax.jit(jax.shard_map(
            lambda x, w: fo_jax.all_gather_matmul(x, w, axis_name="tp")[0],
            mesh=cpu_mesh((2,), ("tp",)), in_specs=(P(), P()), out_specs=P(),
            check_vma=False)).trace(jax.ShapeDtypeStruct((8, 16), jnp.int32),
                                    jax.ShapeDtypeStruct((16, 8), jnp.int32))


def test_pmap_axis_is_a_mesh_axis():
    """pmap binds its axis over devices (a manual mesh axis): the check lets it through."""
    n = min(2, jax.local_device_count())
    y = jax.pmap(lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="p",
                                                     collective="all_reduce"),
                 axis_name="p")(jnp.ones((n, 4, 8), jnp.float32), jnp.ones((n, 8, 4), jnp.float32))
    assert y.shape == (n, 4, 4) and float(y[0, 0, 0]) == 8.0 * n


@pytest.mark.parametrize("name", ["force_reference", "allow_fallback"])
def test_config_flags_are_bools(name):
    with pytest.raises(ValueError, match=f"OverlapConfig.{name} must be True or False, got 'no'"):
        fo_jax.OverlapConfig(**{name: "no"})


def test_axis_name_must_be_a_string():
    with pytest.raises(TypeError, match="axis_name must be a str"):
        run_tp(X, W, axis_name=("tp",))


def test_config_type():
    with pytest.raises(TypeError, match="OverlapConfig"):
        run_tp(X, W, config={"num_groups": 2})


def test_not_an_array():
    with pytest.raises(TypeError, match="x must be a JAX array"):
        fo_jax.overlapped_matmul([[1.0]], W, axis_name="tp")


def test_matmul_checks_too():
    with pytest.raises(ValueError, match="contraction sizes differ"):
        jax.jit(fo_jax.matmul).trace(X, jax.ShapeDtypeStruct((12, 8), jnp.bfloat16))
