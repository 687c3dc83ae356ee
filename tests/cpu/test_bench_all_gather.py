"""The all_gather rows of `python -m fo_jax.bench` and benchmarks/bench_overlap.py on host CPU
devices: every method's function computes all_gather(x) @ w (or its part), the operands have the
documented layout, and the overlap and single-device flows write rows with the usual fields."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cpu_mesh

import fo_jax
from fo_jax import _cuda
from fo_jax.bench import core

M, N, K = 64, 48, 32  # per GPU: gathered x[M, K] @ w[K, N]


@pytest.fixture(autouse=True)
def _on_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _gathered_product(x, w, tp):
    """float64 reference: each device's [M, N] block (its columns of w), stacked along N."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    assert w64.shape == (K, tp * N)
    return x64 @ w64


@pytest.mark.parametrize("tp", [2, 4])
def test_every_method_computes_the_gathered_product(tp):
    mesh = cpu_mesh((tp,), ("tp",))
    x, w = core.gather_operands(mesh, M, N, K, jnp.bfloat16, seed=3)
    assert x.shape == (M, K) and w.shape == (K, tp * N)
    assert {s.data.shape for s in x.addressable_shards} == {(M // tp, K)}
    assert {s.data.shape for s in w.addressable_shards} == {(K, N)}
    want = _gathered_product(x, w, tp)
    for kind, args in (("fo_jax", (x, w)), ("baseline", (x, w)), ("chunked", (x, w)),
                       ("gemm_only", (core.replicated(mesh, x), w))):
        y = core.build(mesh, "all_gather", kind, chunks=2)(*args)
        assert y.dtype == jnp.bfloat16 and y.shape == (M, tp * N), kind
        assert {s.data.shape for s in y.addressable_shards} == {(M, N)}, kind
        err = np.linalg.norm(np.asarray(y, np.float64) - want) / np.linalg.norm(want)
        assert err < 1e-2, (kind, err)
    g = core.build(mesh, "all_gather", "comm_only")(x)
    assert {s.data.shape for s in g.addressable_shards} == {(M, K)}  # x whole on every device
    np.testing.assert_array_equal(np.asarray(g), np.tile(np.asarray(x), (tp, 1)))


def test_path_of_describes_the_local_shapes():
    mesh = cpu_mesh((4,), ("tp",))
    x, w = core.gather_operands(mesh, M, N, K, jnp.bfloat16)
    assert core.path_of(mesh, "all_gather", x, w) == "reference"  # CPU devices


def test_bench_run_with_two_gpus_times_the_all_gather_rows(tmp_path, monkeypatch):
    from fo_jax import bench

    monkeypatch.setattr(_cuda, "gpu_devices", lambda: jax.devices("cpu")[:2])
    monkeypatch.setattr(_cuda, "_warned_missing", True)
    rows = bench.run([f"{M}x{N}x{K}"], ["all_gather"], str(tmp_path), chunks=(2,),
                     windowed=False, plots=False)
    fields = {"device", "num_devices", "date", "commit", "dtype", "M", "N", "K", "method", "ms",
              "collective", "tp"}
    assert all(fields <= set(r) for r in rows)
    assert {(r["collective"], r["tp"], r["M"], r["N"], r["K"]) for r in rows} == {
        ("all_gather", 2, M, N, K)}
    assert {r["method"] for r in rows} >= {"fo_jax", "fo_jax.nccl", "fo_jax.sequential",
                                           "jax.baseline", "jax.chunked[c2]", "gemm_only",
                                           "comm_only"}
    assert all(r["ms"] is not None and not r.get("error") for r in rows), rows
    assert {r["commit"] for r in rows} == {fo_jax.build_info()["commit"]}
    md = (tmp_path / f"bench_tp2_{rows[0]['date']}.md").read_text()
    assert f"| all_gather | {M}x{N}x{K} | fo_jax |" in md


def test_bench_run_single_device_all_gather_rows(tmp_path, monkeypatch):
    from fo_jax import bench

    monkeypatch.setattr(_cuda, "gpu_devices", lambda: jax.devices("cpu")[:1])
    monkeypatch.setattr(_cuda, "_warned_missing", True)
    rows = bench.run([f"{M}x{N}x{K}"], ["all_gather"], str(tmp_path), windowed=False,
                     plots=False)
    assert {(r["collective"], r["method"]) for r in rows} == {
        ("none", "xla.dot"), ("none", "fo_jax.matmul"), ("all_gather", "jax.baseline"),
        ("all_gather", "fo_jax")}
    assert all(r["ms"] is not None for r in rows)
