"""flax.nnx tensor-parallel layers on top of `fo_jax.overlapped_matmul` and
`fo_jax.all_gather_matmul`: the nnx twins of the linen layers in `fo_jax.flax`, with the same
math and layouts: `RowParallelDense`, `ColumnParallelDense`, `ParallelMLP`,
`ParallelAttentionOutput`, `ParallelSelfAttention`, `ParallelTransformerBlock` (docs/layers.md).

A layer is built with GLOBAL sizes (like `nnx.Linear`), its parameters annotated with logical
names (`out_sharding`) and the mapping the layer needs (`sharding_rules`: its sharded name to
`axis_name`, the other names to None), so `nnx.get_partition_spec(state)` gives mesh
PartitionSpecs. It is applied inside `jax.shard_map` on local shards, the usual nnx way:

    model = fo_jax.nnx.init_sharded(lambda: Block(rngs=nnx.Rngs(0)), mesh)  # sharded arrays
    graphdef, state = nnx.split(model)
    specs = fo_jax.nnx.partition_specs(state)  # shard_map in_specs

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)

    y = jax.shard_map(apply, mesh=mesh, in_specs=(specs, P("tp")), out_specs=P("tp"))(state, x)

Called where `axis_name` is not bound (outside shard_map, or a mesh without it) a layer raises
ValueError saying so. Logical axis rules (`nn.logical_axis_rules` / `flax.core.spmd`) may restate
the layers' mapping; rules that map a dimension elsewhere raise ValueError (at construction, in
`partition_specs`/`init_sharded`, and when the layer runs).

Parameters are created with eager sharding (nnx's `use_eager_sharding`) only where a mesh is set
(`jax.set_mesh`); elsewhere they are plain arrays with the annotations, so the layers build with
or without a mesh. Needs flax >= 0.12 (the `out_sharding` metadata); `import fo_jax` does not
import flax.
"""

from fo_jax.flax._logical import logical_rules
from fo_jax.nnx._init import init_program, init_sharded, partition_specs
from fo_jax.nnx.layers import (
    ColumnParallelDense,
    ParallelAttentionOutput,
    ParallelMLP,
    RowParallelDense,
)
from fo_jax.nnx.transformer import ParallelSelfAttention, ParallelTransformerBlock

__all__ = [
    "ColumnParallelDense",
    "ParallelAttentionOutput",
    "ParallelMLP",
    "ParallelSelfAttention",
    "ParallelTransformerBlock",
    "RowParallelDense",
    "init_program",
    "init_sharded",
    "logical_rules",
    "partition_specs",
]
