"""Hardware counters of fo_jax's GEMM beside XLA's, under Nsight Compute (ncu).

Time alone says how far a kernel trails; the counters say where its warps wait. This script runs
ncu on itself: the child process builds one shape's operands, compiles every method and warms it
with ncu's collection off (so XLA's autotuning is not profiled), then calls each method once
between cudaProfilerStart and cudaProfilerStop. ncu collects its full section set for every kernel
of those calls, with the warps' stall sampling per SASS instruction. The parent then exports
three text pages per shape from the report: the sections' details, every raw metric, and the
per-instruction source page (SASS with its stall samples), into OUT/ncu_<shape>.tar.gz
(dev/ncu_tile_split.py reads them).

Kernel replay: ncu runs each kernel once per pass and restores the memory it writes, so JAX's
pool is not preallocated here (XLA_PYTHON_CLIENT_PREALLOCATE=false). The clocks are left alone
(--clock-control none): the times are a boost clock's, as in the benchmarks.

Usage: python dev/probes_py/ncu_gemm_profile.py [--dtype D] [--shapes MxNxK ...]
       [--methods NAME ...] [--out DIR] [--ncu PATH] [--shape-timeout S]
--dtype is float8_e4m3fn (default; the weight stored [N, K]), bfloat16 or float16. A method is
xla.dot (XLA's dot; for fp8 its fp8 dot, fast accumulation), xla.dot_fp32acc (fp8 only: the same
at precision HIGHEST), fo_jax.own (the kernel fo_jax.matmul picks, never its handover to XLA) or
a row of fo_jax's table by name (an fp8 row with its own accumulation). Each method is checked
against a reference first (fp8: the dequantized float32 product; 16-bit: xla.dot).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")

DEFAULT_METHODS = ["xla.dot_fp32acc", "fp8_coop_128x192x128_c2", "xla.dot",
                   "fp8fast_pp_128x192x128_c2"]


def find_ncu(given: str | None) -> str:
    """The ncu binary: --ncu, PATH, or the newest Nsight Compute under /opt/nvidia."""
    for cand in ([given] if given else []) + [shutil.which("ncu") or ""] + sorted(
            glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True) + sorted(
            glob.glob("/usr/local/cuda*/bin/ncu"), reverse=True):
        if cand and os.access(cand, os.X_OK):
            return cand
    sys.exit("ncu_gemm_profile.py: no ncu found (give --ncu PATH)")


def profiler_api():
    """(start, stop) of the CUDA runtime's profiler control, which ncu's
    --profile-from-start off waits for; cudart binds JAX's device's primary context."""
    import nvidia  # noqa: PLC0415  (the CUDA runtime wheel that jax's CUDA plugin depends on)

    libs = [p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "**", "libcudart.so*"),
                                                          recursive=True)]
    if not libs:
        sys.exit("ncu_gemm_profile.py: no libcudart.so in the nvidia wheels")
    rt = ctypes.CDLL(sorted(libs)[0])

    def call(fn):
        err = fn()
        if err != 0:
            sys.exit(f"ncu_gemm_profile.py: {fn.__name__} returned CUDA error {err}")
    return (lambda: call(rt.cudaProfilerStart)), (lambda: call(rt.cudaProfilerStop))


def child(shape: str, dtype_name: str, methods: list) -> None:
    """Compile, check and warm every method, then one profiled call of each, in the given
    order."""
    sys.path.insert(0, _BENCHMARKS)
    import benchlib  # noqa: PLC0415
    import bench_gemm_sweep as sweep  # noqa: PLC0415
    import fo_jax  # noqa: PLC0415
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    benchlib.cuda_gpus_or_exit("ncu_gemm_profile.py")
    m, n, k = (int(v) for v in shape.split("x"))
    dtype = jnp.dtype(sweep.DTYPES[dtype_name])
    fp8 = dtype_name == sweep.FP8
    args = sweep.operands(m, n, k, dtype, seed=0)
    xla = {name: fn for name, _, fn in sweep.fp8_methods()} if fp8 else {"xla.dot": jnp.dot}
    fns = {}
    for name in methods:
        if name in xla:
            fns[name] = jax.jit(xla[name])
        else:
            config = benchlib.OWN_KERNEL if name == "fo_jax.own" else sweep.config_of(name)
            fns[name] = jax.jit(benchlib.fo_jax_fp8_nk(config) if fp8 else
                                (lambda x, w, config=config: fo_jax.matmul(x, w, config=config)))
    ref = sweep.reference(args, dtype)  # fp8; 16-bit: xla.dot's result
    if ref is None:
        ref = jax.jit(jnp.dot)(*args)
    ref = np.asarray(ref.astype(jnp.float32))
    for name, f in fns.items():
        got = np.asarray(f(*args).astype(jnp.float32))
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        tol = sweep.TOLERANCE[dtype_name]
        assert err <= tol, f"{shape} {name}: differs from the reference (rel err {err:.2e})"
        for _ in range(3):
            jax.block_until_ready(f(*args))
        print(f"{shape} {dtype_name} {name}: compiled, rel err {err:.1e}", flush=True)
    start, stop = profiler_api()
    jax.block_until_ready(args)
    start()
    for f in fns.values():  # one call each, in order: the report's kernels follow it
        jax.block_until_ready(f(*args))
    stop()
    print(f"{shape}: profiled order {' | '.join(fns)}", flush=True)


def export_pages(ncu: str, report: str, stem: str) -> list:
    """details / raw / source pages of a report as CSV files next to it; their paths."""
    pages = [("details", ["--page", "details"]), ("raw", ["--page", "raw"]),
             ("source", ["--page", "source", "--print-source", "sass"])]
    paths = []
    for page, flags in pages:
        path = f"{stem}_{page}.csv"
        with open(path, "w") as f:
            r = subprocess.run([ncu, "--import", report, "--csv", *flags], stdout=f,
                               stderr=subprocess.PIPE, text=True, check=False)
        print(f"  {page}: {os.path.getsize(path)} bytes" + (
            f", ncu exit {r.returncode}: {r.stderr.strip()[-400:]}" if r.returncode else ""),
            flush=True)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=["16384x8192x1024"])
    ap.add_argument("--dtype", default="float8_e4m3fn",
                    choices=["float8_e4m3fn", "bfloat16", "float16"])
    ap.add_argument("--methods", nargs="*",
                    help="default: XLA's dot(s) and fo_jax's own kernel(s), fp8: "
                         + " ".join(DEFAULT_METHODS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--shape-timeout", type=float, default=300,
                    help="seconds for one shape's ncu run, its compiles included")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.methods is None:
        args.methods = DEFAULT_METHODS if args.dtype == "float8_e4m3fn" else ["xla.dot",
                                                                              "fo_jax.own"]
    if args.child:
        child(args.child, args.dtype, args.methods)
        return
    ncu = find_ncu(args.ncu)
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    failed = []
    for i, shape in enumerate(args.shapes):
        stem = os.path.join(args.out, f"ncu_{shape}" + ("" if args.dtype == "float8_e4m3fn"
                                                          else f"_{args.dtype}"))
        t0 = time.time()
        print(f"[{i + 1}/{len(args.shapes)}] {shape} {args.dtype}: {ncu} on "
              f"{', '.join(args.methods)}",
              flush=True)
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--set", "full",
               "--import-source", "no", "--force-overwrite", "--export", stem,
               sys.executable, os.path.abspath(__file__), "--child", shape,
               "--dtype", args.dtype, "--methods", *args.methods]
        # Its own session: if ncu dies (it crashed once while XLA compiled), the profiled child
        # lives on holding this script's stdout, so the whole group is killed.
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.shape_timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        report = stem + ".ncu-rep"
        if rc != 0 or not os.path.exists(report):
            print(f"  ncu failed at {shape} (exit {rc}): no report", flush=True)
            failed.append(shape)
            continue
        files = export_pages(ncu, report, stem)
        with tarfile.open(stem + ".tar.gz", "w:gz") as tar:
            for path in files + ([report] if os.path.getsize(report) < 12 << 20 else []):
                tar.add(path, arcname=os.path.basename(path))
        for path in files + [report]:
            os.remove(path)
        print(f"  wrote {stem}.tar.gz ({os.path.getsize(stem + '.tar.gz')} bytes) in "
              f"{time.time() - t0:.0f} s", flush=True)
    if failed:
        sys.exit(f"ncu_gemm_profile.py: no report at {', '.join(failed)}")


if __name__ == "__main__":
    main()
