"""Flax (linen) tensor-parallel layers on top of `fo_jax.overlapped_matmul`.

Layers: `RowParallelDense`, `ColumnParallelDense`, `ParallelMLP`, `ParallelAttentionOutput`,
and the transformer layers built from them, `ParallelSelfAttention` and
`ParallelTransformerBlock` (flax.nnx twins in `fo_jax.nnx`; docs/layers.md). They run inside
`jax.shard_map` on local shards and reduce over one mesh axis, `axis_name` (default "tp");
called where that axis is not bound (outside shard_map, or a mesh without it) they raise
ValueError saying so.

Parameters carry logical axis names (`ShardMapLogicallyPartitioned`, a no-constraint
`nn.LogicallyPartitioned`): by default "embed" for d_model, "mlp" for d_ff, "heads" and "kv" for
attention heads and head_dim; each layer's `kernel_axes` (ParallelMLP: `embed_axis`,
`mlp_axis`) renames them. Inside shard_map a layer holds exactly one parameter dimension split
over its axis_name ("mlp" / "heads" by default) and every other one whole:

    variables = fo_jax.flax.init_sharded(model, mesh, key, x, in_specs=(P("tp"),))
    specs = fo_jax.flax.partition_specs(variables)  # mesh PartitionSpecs: shard_map in_specs
    y = jax.shard_map(model.apply, mesh=mesh, in_specs=(specs, P("tp")), out_specs=P("tp"))(
        variables, x)

With Flax's logical-axis tools, include `fo_jax.flax.logical_rules("tp")` (maps "mlp" and
"heads" to "tp") in your rules: `with nn.logical_axis_rules(rules):`
`nn.logical_to_mesh(nn.get_partition_spec(variables))` then gives the same specs, and
`nn.get_sharding(variables, mesh)` the NamedSharding of every parameter. Rules that map a
layer's dimension anywhere else (its sharded name to another mesh axis, or a whole dimension to
any mesh axis) raise ValueError when the layer runs, and in `partition_specs`/`init_sharded`.

`init_sharded` draws each sharded parameter on its global shape with the parameter's sharding
as output sharding, so each device computes only its shard (per-device memory: the shard plus
the generator's temporaries, a few buffers of the shard's size; see its docstring for measured
numbers), and the values equal the unsharded twins' (`nn.Dense`, `nn.DenseGeneral`) draws from
the same key. `init_program` gives the same init as a jitted function, to inspect its compiled
memory.

Importing this package needs flax; `import fo_jax` does not import it.
"""

from fo_jax.flax._boxes import (
    ShardMapLogicallyPartitioned,
    ShardMapPartitioned,
    partition_specs,
    with_partitioning,
)
from fo_jax.flax._init import init_program, init_sharded
from fo_jax.flax._logical import logical_rules
from fo_jax.flax.linen import (
    ColumnParallelDense,
    ParallelAttentionOutput,
    ParallelMLP,
    RowParallelDense,
)
from fo_jax.flax.transformer import ParallelSelfAttention, ParallelTransformerBlock

__all__ = [
    "ColumnParallelDense",
    "ParallelAttentionOutput",
    "ParallelMLP",
    "ParallelSelfAttention",
    "ParallelTransformerBlock",
    "RowParallelDense",
    "ShardMapLogicallyPartitioned",
    "ShardMapPartitioned",
    "init_program",
    "init_sharded",
    "logical_rules",
    "partition_specs",
    "with_partitioning",
]
