"""fp8 (float8_e4m3fn) GEMM on a GPU: every fp8 tile configuration against a float64 reference of
the dequantized operands, outputs poisoned before each run; fo_jax.matmul's fp8 path end to end;
overlapped_matmul with fp8 operands over an axis of size 1.

Tolerance: quantize_fp8's outputs are exact fp8 values, so the float64 product of the dequantized
operands is the exact answer; the kernel's only errors are its accumulation and the one bf16
rounding of the output (2^-8 relative). Accumulation: the tensor cores add fp8 products into a
partial sum that keeps ~13 fraction bits relative to the block's largest product, and fo_jax's
accurate fp8 rows add that partial sum into float32 registers every 8 MMAs (256 of K; the _p1
row every 4, 128 of K); each block's error is then at most ~2^-13 x 256 x its largest |product|,
i.e. ~2^-10 of the sum of its |products| for random data (largest ~4x the mean). So
|y - ref| <= 2^-8 |ref| + 2^-9 sum_k |x_ik w_kj|, twice that accumulation bound (the second
term also covers entries that cancel to near zero). A wrong layout, a missing scale or a
skipped k-block is off by far more: sum_k |x w| is only ~sqrt(K) times |ref| for random data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
from conftest import gemm_config_table, gpu_devices_or_skip
from numerics import group_major_layout

pytestmark = pytest.mark.gpu

POISON = float("nan")


def _fp8_configs():
    from fo_jax import _plan

    return [c for c in _plan.gemm_configs() if "float8_e4m3fn" in c.get("dtypes", ())]


def _operands(m, k, n, seed):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = 2.0 * jax.random.normal(kx, (m, k), jnp.float32)
    w = 0.1 * jax.random.normal(kw, (k, n), jnp.float32)
    return (*fo_jax.quantize_fp8(x), *fo_jax.quantize_fp8(w))


def _check(y, xq, xs, wq, ws):
    X = np.asarray(xq, np.float64) * float(xs)
    W = np.asarray(wq, np.float64) * float(ws)
    ref = X @ W
    mag = np.abs(X) @ np.abs(W)
    got = np.asarray(y, np.float64)
    assert np.all(np.isfinite(got)), "poisoned (NaN) outputs left"
    err = np.abs(got - ref)
    bound = 2.0**-8 * np.abs(ref) + 2.0**-9 * mag
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (worst, got[worst], ref[worst], bound[worst])
    # In norm the roundings average out (bf16's is ~2^-9 rms): a skipped k-block would not.
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel <= 2.0**-7, rel


# Odd multiples of 16 (K) and of 8 (M, N), small M, and a few tiles' worth of rows.
SHAPES = [(128, 256, 128), (8, 16, 8), (72, 208, 40), (1000, 784, 1032), (4096, 1024, 4096),
          (32, 7168, 1536)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_configs_against_float64(shape):
    gpu_devices_or_skip(1)
    configs = _fp8_configs()
    if not configs:
        pytest.skip("the compiled CUDA module has no fp8 kernels")
    from fo_jax import _cuda_ops, _plan

    m, k, n = shape
    xq, xs, wq, ws = _operands(m, k, n, seed=m + k + n)
    for cfg in configs:
        config = _plan.row_config(cfg["name"], num_groups=1)
        plan = _plan.plan_matmul("test", jnp.dtype(jnp.float8_e4m3fn), m, n, k, config)
        d_init = jnp.full((m, n), POISON, jnp.bfloat16)
        f = jax.jit(lambda x, w, a, b, d, plan=plan: _cuda_ops.signaling_gemm_fp8(
            x, w.T, a, b, plan, signal=False, d_init=d))
        y, _ = f(xq, wq, xs, ws, d_init)
        _check(y, xq, xs, wq, ws)


def test_fp8_signals_every_group():
    gpu_devices_or_skip(1)
    if not _fp8_configs():
        pytest.skip("the compiled CUDA module has no fp8 kernels")
    from fo_jax import _cuda_ops, _plan

    m, k, n = 2048, 512, 768
    xq, xs, wq, ws = _operands(m, k, n, seed=5)
    for cfg in _fp8_configs():
        config = _plan.row_config(cfg["name"], num_groups=4)
        plan = _plan.plan_matmul("test", jnp.dtype(jnp.float8_e4m3fn), m, n, k, config)
        y, counters = jax.jit(lambda x, w, a, b, plan=plan: _cuda_ops.signaling_gemm_fp8(
            x, w.T, a, b, plan))(xq, wq, xs, ws)
        _check(y, xq, xs, wq, ws)
        tiles_n = -(-n // cfg["tile_n"])
        bounds = plan.group_begin
        want = [(bounds[g + 1] - bounds[g]) * tiles_n for g in range(len(bounds) - 1)]
        np.testing.assert_array_equal(np.asarray(counters), want)


@pytest.mark.parametrize("shape", [(200, 1024, 4096), (8, 208, 1040)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp8_split_k_against_float64(shape):
    """Split K on every cooperative fp8 row (each split promotes its partial sums as the
    unsplit kernel does; the final one adds the splits' float32 sums): within _check's bound,
    counters complete."""
    gpu_devices_or_skip(1)
    from fo_jax import _cuda_ops, _plan

    m, k, n = shape
    xq, xs, wq, ws = _operands(m, k, n, seed=m + k)
    rows = [c for c in _fp8_configs() if not c["pingpong"]]
    if not rows:
        pytest.skip("the compiled CUDA module has no cooperative fp8 rows")
    for cfg in rows:
        for splits in (2, 5):
            config = _plan.row_config(cfg["name"], num_groups=2, k_splits=splits)
            plan = _plan.plan_matmul("test", jnp.dtype(jnp.float8_e4m3fn), m, n, k, config)
            assert plan.k_splits == min(splits, -(-k // cfg["tile_k"]))
            f = jax.jit(lambda x, w, a, b, plan=plan: _cuda_ops.signaling_gemm_fp8(
                x, w.T, a, b, plan))
            assert "fo_jax_gemm_fp8_split_k_v1" in f.lower(xq, wq, xs, ws).as_text()
            y, counters = f(xq, wq, xs, ws)
            _check(y, xq, xs, wq, ws)
            tiles_n = -(-n // cfg["tile_n"])
            bounds = plan.group_begin
            want = [(bounds[g + 1] - bounds[g]) * tiles_n for g in range(len(bounds) - 1)]
            np.testing.assert_array_equal(np.asarray(counters), want, err_msg=cfg["name"])


# k-tiles of 128: one (the first interval only, cut short), two (exactly one interval), three
# and five (a last interval of one), four, and a K that ends inside a k-tile (fp8 K: multiples
# of 16).
MMA_FORMS_K = (128, 256, 384, 512, 640, 1040)


@pytest.mark.parametrize("pair", sorted(gemm_config_table().MMA_TWINS.items()),
                         ids=lambda p: p[0])
@pytest.mark.parametrize("k", MMA_FORMS_K)
def test_fp8_own_mma_sums_as_cutlass_mma(k, pair):
    """PromotingFp8Mainloop's mma() (no zeroed accumulators, the first interval's sums written
    straight to the fp32 accumulator; a stage released before or after the promotion) adds the
    same partial sums in the same order as CUTLASS's, so for each MMA twin and its row
    (gemm_configs.py MMA_TWINS) the outputs of a tile are equal element for element (a zero may
    differ in sign), unsplit and with K split 2 and 3 ways, and each is within _check's bound.
    Random operands of both signs, several tiles in each direction."""
    gpu_devices_or_skip(1)
    from fo_jax import _cuda_ops, _plan

    names = {c["name"] for c in _fp8_configs()}
    if not set(pair) <= names:
        pytest.skip("the compiled CUDA module lacks the two fp8 rows")
    m, n = 520, 392
    xq, xs, wq, ws = _operands(m, k, n, seed=k)
    k_tiles = -(-k // 128)
    alive = []  # every output stays allocated, so that no run can find another's in its buffer
    for splits in sorted({1, min(2, k_tiles), min(3, k_tiles)}):
        outs = []
        for name in pair:
            config = _plan.row_config(name, num_groups=2, k_splits=splits)
            plan = _plan.plan_matmul("test", jnp.dtype(jnp.float8_e4m3fn), m, n, k, config)
            assert plan.k_splits == splits
            if splits == 1:  # poisoned output (split K has no aliased form)
                d_init = jnp.full((m, n), POISON, jnp.bfloat16)
                y, _ = jax.jit(lambda x, w, a, b, d, plan=plan: _cuda_ops.signaling_gemm_fp8(
                    x, w.T, a, b, plan, d_init=d))(xq, wq, xs, ws, d_init)
            else:
                y, _ = jax.jit(lambda x, w, a, b, plan=plan: _cuda_ops.signaling_gemm_fp8(
                    x, w.T, a, b, plan))(xq, wq, xs, ws)
            alive.append(y)
            _check(y, xq, xs, wq, ws)
            outs.append(np.asarray(y, np.float64))
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=f"{pair} k={k} splits={splits}")


def test_fp8_matmul_end_to_end():
    gpu_devices_or_skip(1)
    m, k, n = 512, 1024, 768
    xq, xs, wq, ws = _operands(m, k, n, seed=11)
    y = jax.jit(lambda x, w, a, b: fo_jax.matmul(x, w, x_scale=a, w_scale=b))(xq, wq, xs, ws)
    assert y.dtype == jnp.bfloat16
    _check(y, xq, xs, wq, ws)
    yt = jax.jit(lambda x, w, a, b: fo_jax.matmul(x, w, x_scale=a, w_scale=b,
                                                  w_transposed=True))(xq, wq.T, xs, ws)
    np.testing.assert_array_equal(np.asarray(yt, np.float32), np.asarray(y, np.float32))
    # Gradients and vmap take the same kernel in the forward.
    g = jax.grad(lambda a: jnp.sum(fo_jax.matmul(xq, wq, x_scale=a, w_scale=ws)
                                   .astype(jnp.float32)))(xs)
    assert np.isfinite(float(g))


def test_fp8_partial_sums_stay_short_on_same_sign_data():
    """Operands of one sign make every product add in the same direction, the worst case for
    the tensor cores' accumulator, which drops the bits of each product below its precision
    relative to the running partial sum: the error grows with the partial sums' length, not as
    _check's random-data estimate. Measured on one H100 at K = 8192
    (dev/probes_py/fp8_accumulation_error.py): 5.5e-4 of the norm promoting every 128 of K,
    1.9e-3 every 256 (the default rows), 0.14 with the whole K in that accumulator (fast
    accumulation). So each accurate row must stay within one bf16 rounding plus 2^-7 of the
    sum, and 2^-7 in norm, which a fast-accumulation row misses by far (checked too, so the
    bounds are known to tell the two apart)."""
    gpu_devices_or_skip(1)
    from fo_jax import _plan

    m, k, n = 256, 8192, 384
    kx, kw = jax.random.split(jax.random.key(29))
    xq, xs = fo_jax.quantize_fp8(jax.random.uniform(kx, (m, k), jnp.float32))
    wq, ws = fo_jax.quantize_fp8(jax.random.uniform(kw, (k, n), jnp.float32))
    X = np.asarray(xq, np.float64) * float(xs)
    W = np.asarray(wq, np.float64) * float(ws)
    ref = X @ W  # every term positive: ref is also the sum of |products|
    checked = 0
    for c in _fp8_configs():
        cfg = _plan.row_config(c["name"])
        y = jax.jit(lambda a, b, s, t, cfg=cfg: fo_jax.matmul(a, b, x_scale=s, w_scale=t,
                                                                config=cfg))(xq, wq, xs, ws)
        got = np.asarray(y, np.float64)
        assert np.all(np.isfinite(got)), c["name"]
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        if c.get("fast_accum"):
            assert rel > 2.0**-6, (c["name"], rel)
            continue
        assert c.get("promotion_k_tiles") in (1, 2), c
        worst = float(np.max(np.abs(got - ref) / ref))
        assert worst <= 2.0**-8 + 2.0**-7, (c["name"], worst)
        assert rel <= 2.0**-7, (c["name"], rel)
        checked += 1
    assert checked >= 2


FAST = fo_jax.OverlapConfig(fp8_fast_accumulation=True)


def test_fp8_matmul_handed_to_xla_keeps_its_numerics(monkeypatch):
    """Where the table hands an fp8 GEMM to XLA's fp8 dot (a weight stored [N, K]; here a table
    that says so for this shape), the program holds no fo_jax GEMM and the result stays within
    fo_jax's bounds: _check's on random data (its 2^-8 |ref| term covers the handover's second
    rounding and its scales' product rounded to bf16, each at most 2^-9); on same-sign data at
    K = 8192 the fp32 promotion's bounds of test_fp8_partial_sums_stay_short_on_same_sign_data
    (XLA's dot at precision HIGHEST promotes as fo_jax's default kernels do). XLA's
    fast-accumulating dot (fp8_fast_accumulation=True) stays within 2^-6 in norm there: 6.1e-3
    measured on one H200 with cuBLASLt writing the product in float32 (its fast fp8 kernels
    lose far fewer bits on this data than fo_jax's fast kernels, 0.14 on one H100)."""
    gpu_devices_or_skip(1)
    from conftest import use_gemm_table

    m, k, n = 256, 8192, 384
    use_gemm_table(monkeypatch, points={"float8_e4m3fn": ((m, n, k, 0.5),),
                                        "float8_e4m3fn_fast": ((m, n, k, 0.5),)})
    xq, xs, wq, ws = _operands(m, k, n, seed=31)
    call = jax.jit(lambda x, w, a, b, cfg=None: fo_jax.matmul(
        x, w, x_scale=a, w_scale=b, w_transposed=True, config=cfg), static_argnames="cfg")
    text = call.lower(xq, wq.T, xs, ws).as_text()
    assert "fo_jax_gemm" not in text and "dot_general" in text
    _check(call(xq, wq.T, xs, ws), xq, xs, wq, ws)

    kx, kw = jax.random.split(jax.random.key(37))
    xq, xs = fo_jax.quantize_fp8(jax.random.uniform(kx, (m, k), jnp.float32))
    wq, ws = fo_jax.quantize_fp8(jax.random.uniform(kw, (k, n), jnp.float32))
    ref = (np.asarray(xq, np.float64) * float(xs)) @ (np.asarray(wq, np.float64) * float(ws))
    got = np.asarray(call(xq, wq.T, xs, ws), np.float64)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert float(np.max(np.abs(got - ref) / ref)) <= 2.0**-8 + 2.0**-7, rel
    assert rel <= 2.0**-7, rel
    fast = np.asarray(call(xq, wq.T, xs, ws, cfg=FAST), np.float64)
    assert "fo_jax_gemm" not in call.lower(xq, wq.T, xs, ws, cfg=FAST).as_text()
    assert np.linalg.norm(fast - ref) / np.linalg.norm(ref) <= 2.0**-6


def _fast_rows_or_skip():
    from fo_jax import _plan

    if not _plan.gemm_configs_for(jnp.float8_e4m3fn, True):
        pytest.skip("the compiled CUDA module has no fast-accumulation fp8 kernels")


@pytest.mark.parametrize("shape", [(512, 1024, 768), (1000, 1032, 784), (2048, 16384, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp8_fast_accumulation_against_float64(shape):
    """fo_jax.matmul with fp8_fast_accumulation runs a fast-accumulation row and stays close
    to the float64 product: the tensor cores' accumulator keeps fewer mantissa bits than float32,
    so the bounds are looser than _check's at long K, but a lost k-block (about 9% in norm at
    K = 16384) would fail them."""
    gpu_devices_or_skip(1)
    _fast_rows_or_skip()
    from fo_jax import _plan

    m, k, n = shape
    assert _plan.plan_matmul("t", jnp.dtype(jnp.float8_e4m3fn), m, n, k,
                             FAST).config_name.startswith("fp8fast_")
    xq, xs, wq, ws = _operands(m, k, n, seed=m + k + n + 1)
    y = jax.jit(lambda x, w, a, b: fo_jax.matmul(x, w, x_scale=a, w_scale=b, config=FAST))(
        xq, wq, xs, ws)
    X = np.asarray(xq, np.float64) * float(xs)
    W = np.asarray(wq, np.float64) * float(ws)
    ref, mag = X @ W, np.abs(X) @ np.abs(W)
    got = np.asarray(y, np.float64)
    assert np.all(np.isfinite(got))
    err = np.abs(got - ref)
    assert np.all(err <= 2.0**-8 * np.abs(ref) + 2.0**-8 * mag), float(np.max(err / mag))
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel <= 2.0**-6, rel


def test_fp8_fast_accumulation_overlapped_axis_size_one():
    devices = gpu_devices_or_skip(1)
    _fast_rows_or_skip()
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(devices[:1]), ("tp",))
    m, k, n = 1024, 512, 256
    xq, xs, wq, ws = _operands(m, k, n, seed=17)

    def body(x, w, a, b):
        c = fo_jax.describe(x, w, axis_name="tp", collective="reduce_scatter", config=FAST)
        assert c.path == "cuda" and "fast accumulation" in c.reason, c
        return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective="reduce_scatter",
                                        x_scale=a, w_scale=b, config=FAST)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(), P()),
                              out_specs=P("tp", None)))
    _check(f(xq, wq, xs, ws), xq, xs, wq, ws)


def test_fp8_overlapped_axis_size_one():
    devices = gpu_devices_or_skip(1)
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(devices[:1]), ("tp",))
    m, k, n = 1024, 512, 256
    xq, xs, wq, ws = _operands(m, k, n, seed=13)
    for collective in ("reduce_scatter", "all_reduce"):
        def body(x, w, a, b, collective=collective):
            c = fo_jax.describe(x, w, axis_name="tp", collective=collective)
            assert c.path == "cuda", c
            return fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=collective,
                                            x_scale=a, w_scale=b)

        out = P("tp", None) if collective == "reduce_scatter" else P()
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(), P()),
                                  out_specs=out))
        _check(f(xq, wq, xs, ws), xq, xs, wq, ws)


@pytest.mark.parametrize("batch", [2, 4])
@pytest.mark.parametrize("m", [72, 200])
def test_fp8_batched_remap(batch, m):
    """The reduce-scatter producer's layout with bands that are not whole tiles (the launcher
    runs the last group as a launch of its own, D as [batch, rows, n]): scaled right, every
    tile counted."""
    gpu_devices_or_skip(1)
    if not _fp8_configs():
        pytest.skip("the compiled CUDA module has no fp8 kernels")
    from fo_jax import _cuda_ops, _plan

    n, k = 392, 208
    xq, xs, wq, ws = _operands(batch * m, k, n, seed=batch * m)
    X = np.asarray(xq, np.float64) * float(xs)
    W = np.asarray(wq, np.float64) * float(ws)
    for cfg in _fp8_configs():
        config = _plan.row_config(cfg["name"], num_groups=3)
        plan = _plan.plan_gemm("test", jnp.dtype(jnp.float8_e4m3fn), m, n, k, batch, config, 1,
                               0)
        d_init = jnp.full((batch * m, n), POISON, jnp.bfloat16)
        y, counters = jax.jit(lambda x, w, a, b, d, plan=plan: _cuda_ops.signaling_gemm_fp8(
            x, w.T, a, b, plan, d_init=d))(xq, wq, xs, ws, d_init)
        got = np.asarray(y, np.float64)
        assert np.all(np.isfinite(got)), cfg["name"]
        ref = group_major_layout(X @ W, plan, batch, m)
        mag = group_major_layout(np.abs(X) @ np.abs(W), plan, batch, m)
        assert np.all(np.abs(got - ref) <= 2.0**-8 * np.abs(ref) + 2.0**-10 * mag), cfg["name"]
        tiles_n = -(-n // plan.tile_n)
        b = plan.group_begin
        want = [batch * (b[g + 1] - b[g]) * tiles_n for g in range(plan.num_groups)]
        np.testing.assert_array_equal(np.asarray(counters), want)
