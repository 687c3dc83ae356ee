"""`init_sharded`: initialize linen tensor-parallel layers with about one shard per device.

How: the module is initialized inside shard_map with the fo_jax layers' sharded parameters
replaced by placeholders, while each layer records the PRNG key its initializer receives (the
key the unsharded layer would get: same module path, same draw order). Each sharded parameter is
then drawn by its own initializer on its GLOBAL shape under jit with the parameter's NamedSharding
as output sharding. With JAX's partitionable threefry (`jax_threefry_partitionable`, JAX's
default) the random bits of an element depend only on the key and the element's global
index, so XLA partitions the generator and every device computes only its shard. The
placeholders are never returned, so XLA drops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fo_jax.flax import _boxes

# Collection holding the captured keys during init_sharded (never returned).
KEYS = "fo_jax_init_keys"


@dataclasses.dataclass(frozen=True)
class _Draw:
    """How to draw one sharded parameter on its global shape."""

    init: Callable[..., jax.Array]  # (key, global_shape, dtype), as the unsharded twin calls it
    shape: tuple
    dtype: Any
    impl: Any  # PRNG impl of a typed key; None for a raw uint32 key

    def __call__(self, key_data: jax.Array) -> jax.Array:
        key = key_data if self.impl is None else jax.random.wrap_key_data(key_data,
                                                                           impl=self.impl)
        return self.init(key, self.shape, self.dtype)


class _Capture:
    """Records, per parameter path, the key and global draw of each sharded parameter."""

    def __init__(self):
        self.draws: dict[tuple, _Draw] = {}

    @contextlib.contextmanager
    def active(self):
        prev = getattr(_state, "capture", None)
        _state.capture = self
        try:
            yield
        finally:
            _state.capture = prev

    def param(self, module: nn.Module, name: str, box: Callable, draw: Callable,
              local_shape: tuple, global_shape: tuple, dtype: Any) -> jax.Array:
        """Creates parameter `name` as a zero placeholder and records its key and global draw."""
        seen = {}

        def placeholder(key, shape, dtype):
            seen["key"] = key
            return jnp.zeros(shape, dtype)

        value = module.param(name, box(placeholder), local_shape, dtype)
        key = seen["key"]
        typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        module.put_variable(KEYS, name, jax.random.key_data(key) if typed else key)
        self.draws[(*module.scope.path, name)] = _Draw(
            draw, tuple(global_shape), dtype, jax.random.key_impl(key) if typed else None)
        return value


_state = threading.local()


def active_capture() -> _Capture | None:
    """The capture of the init_sharded being traced in this thread, if any."""
    return getattr(_state, "capture", None)


def init_program(module: nn.Module, mesh: Mesh, rngs: Any, *args: Any,
                 in_specs: Sequence[PartitionSpec], rules: Any = None,
                 check_vma: bool = True) -> tuple[Callable, Callable]:
    """The jitted init of `init_sharded` and the function that turns its output into variables.

    Returns (program, finish): `finish(program(rngs, *args))` is `init_sharded`'s result;
    `program.lower(rngs, *args).compile().memory_analysis()` is its per-device memory.
    """
    capture = _Capture()
    specs_in = (PartitionSpec(), *in_specs)

    def local_init(rngs, *args):
        with capture.active():
            return module.init(rngs, *args)

    with _boxes.rules_context(rules):
        abstract = jax.eval_shape(
            jax.shard_map(local_init, mesh=mesh, in_specs=specs_in, out_specs=PartitionSpec(),
                          check_vma=False), rngs, *args)
        flat = traverse_util.flatten_dict(abstract)
        drawn = {("params", *path): d for path, d in capture.draws.items()}
        kept = [k for k in flat if k[0] != KEYS and k not in drawn]
        kept_specs = {k: _boxes.leaf_spec(flat[k]) for k in kept}
        drawn_specs = {k: _boxes.leaf_spec(flat[k]) for k in drawn}
    key_specs = {k: PartitionSpec() for k in drawn}

    def local(rngs, *args):
        variables = traverse_util.flatten_dict(local_init(rngs, *args))
        return ({k: variables[k] for k in kept},
                {k: variables[(KEYS, *k[1:])] for k in drawn})

    def program(rngs, *args):
        with _boxes.rules_context(rules):
            values, keys = jax.shard_map(local, mesh=mesh, in_specs=specs_in,
                                         out_specs=(kept_specs, key_specs),
                                         check_vma=check_vma)(rngs, *args)
            return values, {k: drawn[k](keys[k]) for k in drawn}

    def shardings(specs):
        return {k: NamedSharding(mesh, s) for k, s in specs.items()}

    jitted = jax.jit(program, out_shardings=(shardings(kept_specs), shardings(drawn_specs)))

    def finish(out):
        values, params = out
        values = dict(values)
        for k, v in params.items():
            values[k] = flat[k].replace_boxed(v)  # the layer's box, holding the global value
        return traverse_util.unflatten_dict(values)

    return jitted, finish


def init_sharded(module: nn.Module, mesh: Mesh, rngs: Any, *args: Any,
                 in_specs: Sequence[PartitionSpec], rules: Any = None,
                 check_vma: bool = True) -> Any:
    """Initializes `module` (built from fo_jax.flax layers) for use inside `jax.shard_map` and
    returns its variables as global arrays, sharded as the layers hold them.

    Memory: each device computes only its shard of every sharded parameter (plus the generator's
    temporaries, a few buffers the size of one shard) instead of the whole parameter. Measured
    per-device compiled memory (`memory_analysis()` of `init_program`) for one [8192, 8192]
    float32 kernel (256 MiB) on CPU devices: on 4, this init needs 192 MiB temporaries + 64 MiB
    output (CPU's threefry loop keeps two uint32 state words and the drawn bits, one shard each);
    on 8, 96 + 32 MiB. On a GPU, XLA fuses the generator into the kernel that writes the
    parameter: one H100's compiled init of the same kernel holds its output and temporaries
    under 1/16 of it (tests/gpu/flax/test_init_memory_gpu.py), so about one shard per device.
    Drawing the whole kernel on every device and slicing it, as `module.init` inside shard_map
    does, needs 1024 MiB + the shard on either. Only with
    `jax_threefry_partitionable` (JAX's default) does XLA partition the generator; without it
    each device generates the whole parameter's bits (288 MiB temporaries on 4 devices). Layers
    under lifted transforms that do not carry fo_jax's key collection (`nn.scan`, `nn.vmap`)
    draw their parameters whole and slice them, like `module.init` inside shard_map (same
    values).

    Values: every fo_jax parameter equals what the unsharded twin (`nn.Dense`, `nn.DenseGeneral`
    with the same names) draws from the same `rngs`: both call the same initializer with the
    same key on the same global shape, so the flag `jax_threefry_partitionable` changes the draws
    of both alike. Bitwise on CPU (tested for lecun_normal, uniform, orthogonal and bfloat16
    parameters, flag on and off); across platforms the float transform of the random bits (e.g.
    erf_inv for normal draws) may round differently, so compare with a twin on the same platform.
    Other variables are created inside shard_map as `module.init` creates them there:
    per-device draws from the replicated key on local shapes.

    Boxes: the variables keep their boxes (`ShardMapLogicallyPartitioned`: logical names).
    `fo_jax.flax.partition_specs(variables)` gives the shard_map in_specs for `module.apply`,
    `nn.get_sharding(variables, mesh)` the jit shardings, `nn.unbox(variables)` plain arrays.

    Args:
      module: a module built from fo_jax.flax layers (anything `module.init` accepts).
      mesh: the mesh; its axis names must include the layers' `axis_name`.
      rngs: PRNG key (or dict of keys) for `module.init`, replicated on every device.
      *args: example inputs (global arrays) for `module.init`.
      in_specs: one PartitionSpec per input in `args`.
      rules: logical axis rules to check the layers' layouts against (default: the active
        `nn.logical_axis_rules`); a rule that maps a layer's dimension elsewhere raises.
      check_vma: forwarded to `jax.shard_map`.

    Returns:
      The variables collection, partitioned as annotated (replicated where not annotated).
    """
    program, finish = init_program(module, mesh, rngs, *args, in_specs=in_specs, rules=rules,
                                   check_vma=check_vma)
    return finish(program(rngs, *args))
