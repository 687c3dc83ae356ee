"""Worker of `python -m fo_jax.bench` for method xla.windowed_einsum (run in its own process).

XLA reads XLA_FLAGS once per process, so the parent starts this module with the windowed-einsum
flags set and the platform and TP it chose, and reads one "FO_JAX_ROW {json}" line per
(collective, shape) from its stdout. The GEMM is written the way XLA's SPMD partitioner (not
shard_map) sees it: jit of a dot of K-sharded operands (for all_gather: x's rows and w's columns
sharded) with NamedSharding outputs, so XLA itself inserts (and may window) the collective.
"""

from __future__ import annotations

import argparse
import json
import sys

WINDOWED_EINSUM_FLAGS = ("--xla_gpu_threshold_for_windowed_einsum_mib=0",
                         "--xla_gpu_multi_streamed_windowed_einsum=true")
ROW_PREFIX = "FO_JAX_ROW "


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--platform", choices=["gpu", "cpu"], required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shapes", nargs="+", required=True)
    ap.add_argument("--collectives", nargs="+", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()

    import jax  # noqa: PLC0415 (after the parent set XLA_FLAGS)
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: PLC0415

    from fo_jax import _cuda  # noqa: PLC0415
    from fo_jax.bench import core  # noqa: PLC0415

    devs = _cuda.gpu_devices() if args.platform == "gpu" else jax.devices("cpu")
    if len(devs) < args.tp:
        sys.exit(f"fo_jax.bench.xla_worker: TP {args.tp} needs {args.tp} {args.platform} devices, "
                 f"found {len(devs)}")
    mesh = Mesh(np.array(devs[:args.tp]), ("tp",))
    dtype = jnp.dtype(args.dtype)
    for collective in args.collectives:
        out = NamedSharding(mesh, {"reduce_scatter": P("tp", None),
                                   "all_gather": P(None, "tp")}.get(collective, P()))
        f = jax.jit(core.xla_matmul, out_shardings=out)
        ref_f = core.build(mesh, collective, "baseline")
        for s in args.shapes:
            m, n, k = core.parse_shape(s)
            row = dict(M=m, N=n, K=k, collective=collective, method="xla.windowed_einsum")
            try:
                x, w = core.operands(mesh, collective, m, n, k, dtype)
                y = f(x, w)
                assert y.dtype == dtype, y.dtype
                err = float(core.rel_err(y, ref_f(x, w)))
                if err > 2e-2:
                    raise AssertionError(f"wrong result (rel err {err:.2e})")
                row["ms"] = round(core.time_ms(f, x, w, reps=args.reps,
                                               trials=args.trials), 4)
            except Exception as e:  # noqa: BLE001 (recorded in the row; the parent reports it)
                row["ms"], row["error"] = None, repr(e)[:500]
            print(ROW_PREFIX + json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
