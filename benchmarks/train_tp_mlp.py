"""Trains a stack of tensor-parallel transformer MLP blocks on a (data x tensor) mesh, twice:
built from fo_jax.flax.ParallelMLP (overlapped_matmul with its custom VJP; the reference path on
CPU, whatever path overlapped_matmul takes on GPUs) and from plain flax nn.Dense + lax.psum /
psum_scatter. Both start from the same parameters and data; per-step losses must agree.

Times one whole jitted training step (forward, backward, optax SGD update), median over --steps
after a warm-up step on a throwaway copy of the state. Run: python benchmarks/train_tp_mlp.py
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import sys
import time

# 8 host devices for CPU runs; only affects the CPU platform, so harmless next to GPUs. Must be
# set before jax is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# Prefer an installed fo_jax (it has the compiled CUDA module when built); fall back to this
# checkout when none is installed or the installed copy predates fo_jax.flax.
_SPEC = importlib.util.find_spec("fo_jax")
if _SPEC is None or not os.path.exists(
        os.path.join(os.path.dirname(_SPEC.origin), "flax", "__init__.py")):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import fo_jax
from fo_jax.flax import ParallelMLP, init_sharded, partition_specs

LOSS_RTOL = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}


class DensePsumMLP(nn.Module):
    """The same MLP from plain nn.Dense on local shards + explicit collectives (the baseline)."""

    d_ff: int
    collective: str
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        tp = jax.lax.axis_size("tp")
        if self.collective == "reduce_scatter":
            x = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
        h = nn.gelu(nn.Dense(self.d_ff // tp, dtype=self.dtype, name="up")(x))
        y = nn.Dense(x.shape[-1], use_bias=False, dtype=self.dtype, name="down")(h)
        if self.collective == "reduce_scatter":
            y = jax.lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
        else:
            y = jax.lax.psum(y, "tp")
        return y + self.param("down_bias", nn.initializers.zeros_init(), (x.shape[-1],))


class Block(nn.Module):
    """Pre-LayerNorm residual block around `mlp` (fo_jax.flax.ParallelMLP or DensePsumMLP)."""

    mlp: type
    d_ff: int
    collective: str
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(dtype=self.dtype, name="ln")(x)
        return x + self.mlp(self.d_ff, collective=self.collective, dtype=self.dtype,
                            name="mlp")(h)


class Stack(nn.Module):
    mlp: type
    layers: int
    d_ff: int
    collective: str
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        for i in range(self.layers):
            x = Block(self.mlp, self.d_ff, self.collective, self.dtype, name=f"block{i}")(x)
        return x


def to_dense_psum(tree):
    """fo_jax params (or specs) -> the DensePsumMLP layout: the row bias moves out of "down"."""
    out = {}
    for name, block in tree["params"].items():
        mlp = block["mlp"]
        out[name] = {"ln": block["ln"], "mlp": {
            "up": mlp["up"], "down": {"kernel": mlp["down"]["kernel"]},
            "down_bias": mlp["down"]["bias"]}}
    return {"params": out}


def path_taken(mesh, collective, dtype, rows, d_ff, d_model) -> str:
    """fo_jax.describe for the down-projection's local shapes."""
    seen = {}
    tp = mesh.shape["tp"]

    def body(h, w):
        seen["c"] = fo_jax.describe(h, w, axis_name="tp", collective=collective)
        return h

    h = jax.ShapeDtypeStruct((rows * tp, d_ff), dtype)
    w = jax.ShapeDtypeStruct((d_ff, d_model), dtype)
    jax.eval_shape(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp")),
                                 out_specs=P(None, "tp")), h, w)
    return f"{seen['c'].path} ({seen['c'].reason})"


def run(args, mesh, devices, collective):
    dtype = jnp.dtype(args.dtype)
    data = mesh.shape["data"]
    x_spec = P(("data", "tp")) if collective == "reduce_scatter" else P("data")
    kx, kt, kp = jax.random.split(jax.random.key(args.seed), 3)
    x = jax.random.normal(kx, (args.batch, args.seq, args.d_model), jnp.float32).astype(dtype)
    target = jax.random.normal(kt, x.shape, jnp.float32).astype(dtype)
    x = jax.device_put(x, NamedSharding(mesh, x_spec))
    target = jax.device_put(target, NamedSharding(mesh, x_spec))

    fo_model = Stack(ParallelMLP, args.layers, args.d_ff, collective, dtype)
    base_model = Stack(DensePsumMLP, args.layers, args.d_ff, collective, dtype)
    variables = init_sharded(fo_model, mesh, kp, x, in_specs=(x_spec,))
    fo_specs = partition_specs(variables)  # mesh layout (nn.get_partition_spec: logical names)
    fo_params = nn.unbox(variables)
    models = {
        "fo_jax_flax": (fo_model, fo_params, fo_specs),
        "dense_psum": (base_model, to_dense_psum(fo_params), to_dense_psum(fo_specs)),
    }
    opt = optax.sgd(args.lr, momentum=0.9)
    rows = args.batch // data // (mesh.shape["tp"] if collective == "reduce_scatter" else 1)
    results = {}
    for method, (model, params, specs) in models.items():
        apply = jax.shard_map(model.apply, mesh=mesh, in_specs=(specs, x_spec),
                              out_specs=x_spec)

        def loss_fn(params, x, target, apply=apply):
            out = apply(params, x).astype(jnp.float32)
            return jnp.mean(jnp.square(out - target.astype(jnp.float32)))

        @jax.jit
        def step(params, opt_state, x, target, loss_fn=loss_fn):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, target)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        state = (params, opt.init(params))
        jax.block_until_ready(step(*state, x, target))  # warm-up: compile, throwaway result
        losses, times = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            p, o, loss = jax.block_until_ready(step(*state, x, target))
            times.append((time.perf_counter() - t0) * 1e3)
            state = (p, o)
            losses.append(float(loss))
        assert all(a.dtype == b.dtype for a, b in zip(jax.tree.leaves(state[0]),
                                                     jax.tree.leaves(params)))
        results[method] = (losses, float(np.median(times)))

    print(f"\n== {collective}: mesh data={data} x tp={mesh.shape['tp']}, {args.dtype}, "
          f"{args.layers} layers, d_model {args.d_model}, d_ff {args.d_ff}, "
          f"x [{args.batch}, {args.seq}, {args.d_model}]")
    path = path_taken(mesh, collective, dtype, rows * args.seq, args.d_ff // mesh.shape["tp"],
                      args.d_model)
    print(f"   overlapped_matmul path: {path}")
    print(f"   {'step':>4}  {'fo_jax_flax loss':>17}  {'dense_psum loss':>17}  {'rel diff':>9}")
    fo_losses, base_losses = results["fo_jax_flax"][0], results["dense_psum"][0]
    worst = 0.0
    for i, (a, b) in enumerate(zip(fo_losses, base_losses)):
        rel = abs(a - b) / max(abs(b), 1e-6)
        worst = max(worst, rel)
        print(f"   {i:>4}  {a:>17.7f}  {b:>17.7f}  {rel:>9.2e}")
    for method, (_, ms) in results.items():
        print(f"   {method:<12} median step {ms:9.2f} ms")
    tol = LOSS_RTOL[args.dtype]
    assert worst <= tol, f"losses differ: worst relative difference {worst:.3e} > {tol:.0e}"
    assert fo_losses[-1] < fo_losses[0], "the loss did not decrease"

    rows_out = []
    for method, (losses, ms) in results.items():
        rows_out.append({
            "device": devices[0].device_kind, "num_devices": len(devices),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": fo_jax.build_info()["commit"], "dtype": args.dtype, "method": method,
            "ms": round(ms, 4),
            "what": "train_step", "collective": collective, "data": data,
            "tp": mesh.shape["tp"], "layers": args.layers, "d_model": args.d_model,
            "d_ff": args.d_ff, "batch": args.batch, "seq": args.seq, "steps": args.steps,
            "final_loss": losses[-1], "max_rel_loss_diff": worst, "path": path,
        })
    return rows_out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=sorted(LOSS_RTOL))
    parser.add_argument("--mesh", default=None,
                        help="data,tp (default: 2,4 on CPU, 1,<all GPUs> on GPU)")
    parser.add_argument("--collective", default="both",
                        choices=["both", "reduce_scatter", "all_reduce"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16, help="divisible by data * tp")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="append JSON Lines here (e.g. benchmarks/results/train_tp_mlp.jsonl)")
    args = parser.parse_args(argv)

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    devices = gpus or jax.devices("cpu")
    if args.mesh:
        data, tp = (int(v) for v in args.mesh.split(","))
    else:
        data, tp = (1, len(devices)) if gpus else (2, 4)
    if data * tp > len(devices):
        sys.exit(f"--mesh {data},{tp} needs {data * tp} devices, have {len(devices)}")
    mesh = Mesh(np.array(devices[:data * tp]).reshape(data, tp), ("data", "tp"))
    print(f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}); "
          f"jax {jax.__version__}; mesh data={data} x tp={tp}")

    collectives = (["reduce_scatter", "all_reduce"] if args.collective == "both"
                   else [args.collective])
    rows = []
    for collective in collectives:
        rows += run(args, mesh, devices[:data * tp], collective)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        print(f"\nappended {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
