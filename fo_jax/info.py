"""`python -m fo_jax.info`: what fo_jax finds on this machine, and what it would do with it.

Prints fo_jax's version and build commit, the jax/jaxlib versions, the platform, each GPU
(ordinal, name, SMs, memory), whether fo_jax's CUDA module loads (and why not), NCCL's version,
the CUDA hardware-queue setting, and which path and transport `overlapped_matmul` would take on a
mesh of all local GPUs for each collective, with the reason (fo_jax.describe, evaluated
abstractly: nothing runs on a GPU), then what this process holds outside XLA: communicators,
copy-engine states and device memory (`device_resources`, which a program calls after its
overlapped calls). On a machine without GPUs it says so and describes a mesh of the host CPU
devices instead. Paste its output into bug reports.

    python -m fo_jax.info [--shape 8192x8192x2048] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
from typing import Optional, Sequence

EXAMPLE_SHAPE = "8192x8192x2048"  # per-GPU x[M, K] @ w[K, N] of the description


def describe_on_mesh(mesh, axis: str, collective: str, x_shape: Sequence[int],
                     w_shape: Sequence[int], dtype, config=None):
    """fo_jax.describe for overlapped_matmul over `axis` of `mesh`, with global operands
    x[M, K*P] and w[K*P, N] sharded along K, as a user's shard_map would see them. Abstract
    evaluation only (jax.eval_shape): no compilation, no device work."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    import fo_jax  # noqa: PLC0415

    found = []

    def body(x, w):
        found.append(fo_jax.describe(x, w, axis_name=axis, collective=collective, config=config))
        return jnp.zeros((), jnp.float32)

    f = jax.shard_map(body, mesh=mesh, in_specs=(P(None, axis), P(axis, None)), out_specs=P())
    jax.eval_shape(f, jax.ShapeDtypeStruct(tuple(x_shape), dtype),
                   jax.ShapeDtypeStruct(tuple(w_shape), dtype))
    return found[0]


def _total_memory(ordinal: int) -> Optional[int]:
    """Total memory of CUDA device `ordinal` in bytes, from the driver; None if unavailable."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev, mem = ctypes.c_int(), ctypes.c_size_t()
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return None
        if lib.cuDeviceTotalMem_v2(ctypes.byref(mem), dev) != 0:
            return None
        return int(mem.value)
    except (OSError, AttributeError):
        return None


def _gpu_line(d) -> str:
    ordinal = getattr(d, "local_hardware_id", None)
    ordinal = d.id if ordinal is None else ordinal
    sms = getattr(d, "core_count", None)
    mem = _total_memory(ordinal)
    if mem is not None:
        mem_s = f"{mem / 2**30:.1f} GiB"
    else:
        try:
            mem_s = f"{d.memory_stats()['bytes_limit'] / 2**30:.1f} GiB available to XLA"
        except Exception:  # noqa: BLE001 (a report line must not end the report)
            mem_s = "memory unknown"
    return (f"GPU {d.id}: {d.device_kind}, CUDA ordinal {ordinal}, "
            f"{sms if sms is not None else 'unknown'} SMs, {mem_s}")


def _nccl_line(module_loaded: bool) -> str:
    if module_loaded:
        from fo_jax import _cuda  # noqa: PLC0415

        v = int(_cuda.module().nccl_version())
        return f"{v // 10000}.{v // 100 % 100}.{v % 100} (the library fo_jax's CUDA module loaded)"
    try:
        from importlib import metadata  # noqa: PLC0415

        wheel = metadata.version("nvidia-nccl-cu13")
    except Exception:  # noqa: BLE001 (not installed)
        return "not found (pip install nvidia-nccl-cu13)"
    return f"nvidia-nccl-cu13 {wheel} installed (not loaded: fo_jax's CUDA module is not available)"


def device_resources() -> dict:
    """What fo_jax holds outside XLA in this process, from its CUDA module (nothing runs on a
    GPU): "communicators", one dict per communicator (device, rank, nranks, group: index of its
    tensor-parallel group's unique id, nccl_max_ctas, copy_engine: whether it has a copy-engine
    state, epoch: that state's call count); "memory", one dict per (device, kind) of device
    memory fo_jax allocated itself (bytes and allocations held now, bytes freed so far:
    superseded receive buffers); "bytes_by_device", the bytes held per device. Empty lists when
    the CUDA module is not available. docs/troubleshooting.md, "Memory outside XLA's pool"."""
    from fo_jax import _cuda  # noqa: PLC0415

    if not _cuda.module_available(warn=False):
        return dict(communicators=[], memory=[], bytes_by_device={})
    mod = _cuda.module()
    comms = [dict(device=d, rank=r, nranks=p, group=g, nccl_max_ctas=c, copy_engine=ce, epoch=e)
             for d, r, p, g, c, ce, e in mod.comm_resources()]
    memory = [dict(device=d, kind=kind, bytes=b, allocations=a, freed_bytes=f)
              for d, kind, b, a, f in mod.device_memory()]
    by_device: dict = {}
    for row in memory:
        by_device[row["device"]] = by_device.get(row["device"], 0) + row["bytes"]
    return dict(communicators=comms, memory=memory, bytes_by_device=by_device)


def _resource_lines() -> list:
    """The report's lines about what this process holds outside XLA (device_resources)."""
    res = device_resources()
    comms = res["communicators"]
    lines = [f"held outside XLA by this process: {len(comms)} communicator"
             f"{'s' if len(comms) != 1 else ''}, "
             f"{sum(c['copy_engine'] for c in comms)} copy-engine state(s)"]
    for device, total in sorted(res["bytes_by_device"].items()):
        kinds = ", ".join(f"{r['kind']} {r['bytes'] / 2**20:.1f} MiB"
                          for r in res["memory"] if r["device"] == device and r["bytes"])
        lines.append(f"  GPU {device}: {total / 2**20:.1f} MiB ({kinds or 'none'})")
    return lines


def _timeout_line() -> str:
    """FO_JAX_COMM_TIMEOUT_S as the CUDA module is given it when it loads (fo_jax/_env.py)."""
    from fo_jax import _env  # noqa: PLC0415

    seconds = _env.comm_timeout_s()
    if seconds <= 0:
        return ("off (FO_JAX_COMM_TIMEOUT_S unset or 0: a partner that stops without a word is "
                "waited for, as in XLA's collectives)")
    return (f"{seconds:g} s (FO_JAX_COMM_TIMEOUT_S: a call not completed that long fails its "
            "group; a copy-engine GPU still stuck as long again ends the process, exit 70)")


def _gemm_table_line() -> str:
    """Which GPU model's measurements fo_jax's GEMM choice reads here (fo_jax/_gemm_tables)."""
    from fo_jax import _gemm_choice  # noqa: PLC0415

    kind = _gemm_choice.device_kind()
    fitted = _gemm_choice.table().DEVICE
    if kind == fitted:
        return f"fitted on this GPU model ({kind})"
    if kind is None:
        return f"{fitted}'s (no GPU here; lowering for a GPU without a table of its own)"
    return (f"{fitted}'s: no sweep of {kind} yet (benchmarks/bench_gemm_sweep.py --configs all, "
            "then dev/fit_gemm_table.py, fits one)")


def report(shape: str = EXAMPLE_SHAPE, dtype: str = "bfloat16") -> list:
    """The lines `python -m fo_jax.info` prints."""
    import jax  # noqa: PLC0415
    import jaxlib  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh  # noqa: PLC0415

    import fo_jax  # noqa: PLC0415
    from fo_jax import _cuda, _hw_queues  # noqa: PLC0415
    from fo_jax.bench.core import parse_shape  # noqa: PLC0415

    info = fo_jax.build_info()
    built = {True: "built with its CUDA module", False: "CPU-only build (no CUDA module)",
             None: "source checkout (not built by pip)"}[info["cuda_built"]]
    lines = [f"fo_jax {info['version']} (commit {info['commit']}, from {info['commit_source']}; "
             f"{built}) at {os.path.dirname(os.path.abspath(fo_jax.__file__))}",
             f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python "
             f"{platform.python_version()}, {platform.system()} {platform.machine()}"]
    try:
        backend = jax.default_backend()
    except RuntimeError as e:
        backend = f"none ({e})"
    lines.append(f"platform: JAX default backend {backend}")
    gpus = _cuda.gpu_devices()
    if gpus:
        lines.append(f"GPUs: {len(gpus)}")
        lines += ["  " + _gpu_line(d) for d in gpus]
    else:
        lines.append("GPUs: none (JAX sees no CUDA GPU; fo_jax runs its reference path here)")
    loaded = _cuda.module_available(warn=False)
    if loaded:
        lines.append(f"CUDA module: loads ({len(_cuda.register_targets())} FFI targets)")
    else:
        lines.append(f"CUDA module: not available: {_cuda.unavailable_reason()}")
    lines.append(f"NCCL: {_nccl_line(loaded)}")
    lines.append(f"hardware queues: {_hw_queues.status()}")
    lines.append(f"progress timeout: {_timeout_line()}")
    lines.append(f"GEMM choice table: {_gemm_table_line()}")
    devs = gpus or jax.devices("cpu")
    kind = "local GPU" if gpus else "host CPU device"
    m, n, k = parse_shape(shape)
    p = len(devs)
    lines.append(f"overlapped_matmul on a mesh of the {p} {kind}{'s' if p != 1 else ''} "
                 f"(axis 'tp' of size {p}), {dtype}, per-GPU x[{m},{k}] @ w[{k},{n}]:")
    mesh = Mesh(np.array(devs), ("tp",))
    for collective in ("reduce_scatter", "all_reduce"):
        try:
            c = describe_on_mesh(mesh, "tp", collective, (m, p * k), (p * k, n), dtype)
            transport = f" transport={c.transport}" if c.transport else ""
            lines.append(f"  {collective}: path={c.path}{transport} ({c.reason})")
        except Exception as e:  # noqa: BLE001 (say what failed, go on)
            lines.append(f"  {collective}: cannot describe: {e!r}")
    if loaded:
        lines += _resource_lines()
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fo_jax.info",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default=EXAMPLE_SHAPE,
                    help="per-GPU MxNxK of the path description (x[M,K] @ w[K,N])")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args(argv)
    # A report, not a job: take no more GPU memory than it needs, so that it can run beside one.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    print("\n".join(report(args.shape, args.dtype)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
