"""Per-device memory of fo_jax.flax.init_sharded on a GPU: XLA fuses the partitionable threefry
generator into the kernel that writes the parameter, so a device's compiled init holds its
shard and hardly anything else (on CPU the generator's state words and bits are extra buffers,
one shard each: tests/cpu/test_flax.py). With one GPU the shard is the whole parameter; a
device of a larger mesh runs the same program on its slice of the counters."""

import pytest

pytest.importorskip("flax", minversion="0.12", reason="fo_jax.flax needs flax 0.12 or later")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from conftest import gpu_devices_or_skip  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

from fo_jax.flax import ColumnParallelDense, RowParallelDense, init_program  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layer", ["row", "column"])
def test_init_holds_about_one_shard_per_gpu(layer):
    (dev,) = gpu_devices_or_skip(1)
    mesh = Mesh(np.array([dev]), ("tp",))
    n = 8192
    module, spec = {
        "row": (RowParallelDense(n, collective="all_reduce", use_bias=False), P(None, "tp")),
        "column": (ColumnParallelDense(n, use_bias=False), P()),
    }[layer]
    key = jax.random.key(0)
    x = jnp.zeros((8, n))
    program, _ = init_program(module, mesh, key, x, in_specs=(spec,))
    m = program.lower(key, x).compile().memory_analysis()
    shard = n * n * 4  # float32 kernel, one shard on one device
    assert m.output_size_in_bytes >= shard
    # The generator's temporaries: far below one shard (CPU needs three).
    assert m.temp_size_in_bytes <= shard // 16, (
        f"temporaries {m.temp_size_in_bytes / shard:.3f} shards")
    print(f"{layer}: output {m.output_size_in_bytes / 2**20:.1f} MiB, temporaries "
          f"{m.temp_size_in_bytes / 2**20:.2f} MiB")
