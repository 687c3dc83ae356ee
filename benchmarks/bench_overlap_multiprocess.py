"""Overlapped reduce-scatter, all-reduce and all-gather with one JAX process per GPU
(jax.distributed on one host), against plain JAX: the rows of bench_overlap.py for that launch
mode, each with "processes": N.

Starts N processes (one GPU each, local_device_ids=[i]) that build a TP=N mesh over all of them
and time, per shape (bf16; per-GPU x[M, K] @ w[K, N], K sharded over "tp"; the all-gather as
bench_overlap.py's: x[M, K] rows sharded, w[K, N] per GPU, the overlapped all-gather opted in):
  fo_jax             overlapped_matmul on the copy-engine transport across processes (CUDA IPC;
                     OverlapConfig(transport="copy_engine", allow_fallback=False): a call it
                     cannot take fails its row instead of running on NCCL or XLA's path;
                     unrequested, the reduce-scatter takes it wherever the lowering-time CUDA
                     IPC probe passes)
  fo_jax.nccl        the same on the NCCL transport
  jax.baseline       XLA dot + psum_scatter / psum, or all_gather + dot, inside shard_map
Each method is checked against jax.baseline first; times are the median of 5 x 20 back-to-back
calls, trials interleaved (fo_jax/bench/core.py), the same method as bench_overlap.py, so a row
compares with the single-process rows of the same shape (docs/design.md, "Copy engine across
processes"). The processes run with JAX's preallocated pool (one allocation per GPU, which the
copy-engine all-reduce and all-gather map in their peers), each a share of its GPU. Process 0
writes JSON Lines + a markdown table (overlap_tp{N}_processes{N}_{date}{tag}.*).

Then, once those processes have ended, one process with all N GPUs times fo_jax and jax.baseline
on the same shapes the same way (rows with "processes": 1, added to the same files), and the
markdown gets the comparison: per shape N-process / one-process time of fo_jax, and per
collective a PASS/FAIL line, every shape within 5% (fo_jax/bench/criteria.py,
processes_summary; issue 33's criterion at TP=4; NOT CHECKED off GPUs). --no-one-process skips it.

Usage: python benchmarks/bench_overlap_multiprocess.py [--processes N] [--shapes MxNxK ...]
       [--collectives reduce_scatter all_reduce all_gather] [--out benchmarks/results] [--tag TAG]
       [--no-one-process]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

DESIGN_SHAPES = ["4096x8192x2048", "8192x8192x2048", "8192x8192x7168", "16384x8192x7168",
                 "16384x8192x2048"]  # fo_jax/bench/core.py's (not imported: no JAX in the parent)
TIMEOUT_S = 1800


def _local_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def launch(args) -> int:
    """Starts the processes, streams process 0's output, returns the first non-zero exit."""
    n = args.processes or _local_gpus()
    if n < 2:
        sys.exit(f"{sys.argv[0]}: needs 2 or more GPUs (found {n}); set --processes")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = [sys.executable, os.path.abspath(__file__), "--worker"]
    # Process 0 names its files here, for the one-process run that adds to them.
    fd, stem_file = tempfile.mkstemp(prefix="fo_jax_processes_", suffix=".stem")
    os.close(fd)
    atexit.register(lambda: os.path.exists(stem_file) and os.remove(stem_file))
    passed = ["--shapes", *args.shapes, "--collectives", *args.collectives, "--out", args.out,
              "--tag", args.tag, "--processes", str(n), "--port", str(port),
              "--stem-file", stem_file]
    # JAX's preallocated pool (the copy-engine all-reduce maps each peer's), a part of each GPU
    # small enough for every process even if each claimed every GPU it sees.
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="true",
               XLA_PYTHON_CLIENT_MEM_FRACTION=str(round(0.8 / n, 3)))
    env.pop("XLA_CLIENT_MEM_FRACTION", None)
    procs = [subprocess.Popen([*worker, str(i), *passed], env=env, text=True,
                              stdout=None if i == 0 else subprocess.PIPE,
                              stderr=None if i == 0 else subprocess.STDOUT)
             for i in range(n)]
    codes = []
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"{sys.argv[0]}: process {i} ran past {TIMEOUT_S} s (killed them all)")
        codes.append(p.returncode)
        if p.returncode and out:
            print(f"--- process {i} (exit {p.returncode}) ---\n{out[-4000:]}", file=sys.stderr)
    failed = next((c for c in codes if c), 0)
    if failed or args.no_one_process:
        return failed
    # One process for all N GPUs, after the N processes have freed them. Host-platform (CPU)
    # devices per process multiply, so that a dry run's one process has the TP of the N.
    one_env = dict(env, XLA_FLAGS=re.sub(
        r"--xla_force_host_platform_device_count=(\d+)",
        lambda mt: f"--xla_force_host_platform_device_count={int(mt.group(1)) * n}",
        env.get("XLA_FLAGS", "")))
    p = subprocess.Popen([*worker, "0", *passed, "--one-process"], env=one_env, text=True)
    try:
        return p.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        sys.exit(f"{sys.argv[0]}: the one-process run ran past {TIMEOUT_S} s (killed)")


def work(args, proc: int) -> None:
    """One process: initialize jax.distributed, time every (collective, shape); with
    --one-process, the one process for all GPUs after the N, and the comparison."""
    import jax  # noqa: PLC0415

    if not args.one_process:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.processes,
                                   process_id=proc, local_device_ids=[proc])
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: PLC0415

    import fo_jax  # noqa: PLC0415
    from fo_jax.bench import core, criteria  # noqa: PLC0415

    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("tp",))
    tp, dtype = len(devices), jnp.bfloat16
    layout = 1 if args.one_process else args.processes
    base = {**core.device_info(devices), "dtype": "bfloat16", "tp": tp,
            "processes": layout, "platform": devices[0].platform}
    res = core.Results(base, echo=proc == 0)
    # Raises where the copy engine cannot run, and never hands a shape to XLA's path: every
    # fo_jax row on GPUs is the copy engine's.
    copy_engine = fo_jax.OverlapConfig(transport="copy_engine", allow_fallback=False)
    configs = {"fo_jax": copy_engine}
    # The fo_jax rows' path: the copy engine's on GPUs; on CPU devices the reference path runs.
    path = {"path": "cuda/copy_engine"} if base["platform"] == "gpu" else {}
    if not args.one_process:  # the one-process NCCL rows are bench_overlap.py's
        configs["fo_jax.nccl"] = fo_jax.OverlapConfig(transport="nccl")

    def operand(shape, spec, seed):
        # Each process draws only its own shard (a global draw would hold all of x per process).
        def shard(idx):
            rows, cols = (s.stop - s.start if s.start is not None else n
                          for s, n in zip(idx, shape))
            rng = np.random.default_rng((seed, *(s.start or 0 for s in idx)))
            scale = 1.0 / np.sqrt(shape[1]) if seed % 2 == 0 else 1.0
            return jnp.asarray(rng.standard_normal((rows, cols), np.float32) * scale, dtype)

        return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), shard)

    def scalar(a) -> float:
        return float(a.addressable_data(0))

    for i, (collective, s) in enumerate((c, s) for c in args.collectives for s in args.shapes):
        m, n, k = core.parse_shape(s)
        if collective == "all_gather":  # bench_overlap.py's operands (core.gather_operands)
            x = operand((m, k), P("tp", None), 2 * i)
            w = operand((k, tp * n), P(None, "tp"), 2 * i + 1)
        else:
            x = operand((m, tp * k), P(None, "tp"), 2 * i)
            w = operand((tp * k, n), P("tp", None), 2 * i + 1)
        fns = {name: core.build(mesh, collective, "fo_jax", cfg) for name, cfg in configs.items()}
        fns["jax.baseline"] = core.build(mesh, collective, "baseline")
        ref = fns["jax.baseline"](x, w)
        ok = {}
        for name, f in fns.items():
            try:
                err = scalar(core.rel_err(f(x, w), ref))
                assert err < 2e-2, f"{name}: wrong result (rel err {err:.2e})"
                ok[name] = f
            except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
                if proc == 0:
                    core.progress(f"{collective} {s}: {name}: FAILED {e!r:.300}")
                res.add(M=m, N=n, K=k, collective=collective, method=name, ms=None,
                        error=repr(e)[:500])
        times = core.time_ms_interleaved(ok, x, w)
        for name, ms in times.items():
            extra = path if name == "fo_jax" else {}
            res.add(M=m, N=n, K=k, collective=collective, method=name, ms=round(ms, 4), **extra)
    if args.one_process:
        _compare(args, res.rows, base, core, criteria)
        return
    if proc == 0:
        stem = os.path.join(args.out, f"overlap_tp{tp}_processes{args.processes}_"
                                      f"{base['date']}{args.tag}")
        res.write_jsonl(stem + ".jsonl")
        res.write_markdown(stem + ".md", f"# {core.provenance(base)}, {args.processes} "
                           f"processes\n\n{_speedup_table(res.rows, core)}")
        with open(args.stem_file, "w") as f:
            f.write(stem)
        core.progress(f"wrote {stem}.jsonl and .md")
    jax.distributed.shutdown()


def _speedup_table(rows: list, core) -> str:
    """Markdown: each method's time against jax.baseline of the same layout and shape."""
    out = []
    for r in rows:
        if r["ms"] is None or r["method"] == "jax.baseline":
            continue
        b = next(q for q in rows if q["method"] == "jax.baseline" and q["M"] == r["M"]
                 and q["N"] == r["N"] and q["K"] == r["K"]
                 and q["collective"] == r["collective"])
        speed = f"{b['ms'] / r['ms']:.3f}x" if b["ms"] else "-"
        out.append((r["collective"], f"{r['M']}x{r['N']}x{r['K']}", r["method"], r["ms"],
                    b["ms"], speed))
    return core.markdown_table(
        ("collective", "MxNxK", "method", "ms", "jax.baseline ms", "speedup"), out)


def _compare(args, one_rows: list, base: dict, core, criteria) -> None:
    """The one-process rows added to the N-process run's files (named in --stem-file by its
    process 0), the markdown rewritten with both tables, the comparison and the PASS/FAIL lines."""
    with open(args.stem_file) as f:
        stem = f.read().strip()
    if not stem:
        sys.exit(f"{sys.argv[0]}: the {args.processes} processes wrote no rows to compare with")
    path = stem + ".jsonl"
    with open(path) as f:
        many_rows = [json.loads(line) for line in f if line.strip()]
    many_tp = many_rows[0].get("tp") if many_rows else None
    if many_tp != base["tp"]:
        sys.exit(f"{sys.argv[0]}: the one process sees {base['tp']} devices, the "
                 f"{args.processes} processes had TP={many_tp}: no comparison")
    with open(path, "a") as f:
        for r in one_rows:
            f.write(json.dumps(r) + "\n")
    rows = many_rows + one_rows
    compared = criteria.processes_comparison(rows)
    table = core.markdown_table(
        ("collective", "MxNxK", "fo_jax one process, ms", f"{args.processes} processes, ms",
         "ratio"), [(c, s, one, many, f"{ratio:.3f}") for c, s, one, many, ratio in compared])
    lines = criteria.processes_summary(rows, args.processes, platform=base["platform"])
    text = (f"# {core.provenance(base)}, {args.processes} processes\n\n"
            f"{_speedup_table(many_rows, core)}\n\n"
            f"## One process for all {base['tp']} devices, right after (same shapes, same timing)"
            f"\n\n{_speedup_table(one_rows, core)}\n\n"
            f"## fo_jax in {args.processes} processes against one process\n\n{table}\n\n"
            "```\n" + "\n".join(lines) + "\n```\n")
    md = stem + ".md"
    with open(md, "w") as f:
        f.write(text)
    for line in lines:
        print(line, flush=True)
    core.progress(f"added the one-process rows to {path} and the comparison to {md}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=None,
                    help="processes (one GPU each; default: every GPU nvidia-smi lists)")
    ap.add_argument("--shapes", nargs="*", default=DESIGN_SHAPES)
    ap.add_argument("--collectives", nargs="*", default=["reduce_scatter"],
                    choices=["reduce_scatter", "all_reduce", "all_gather"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--no-one-process", action="store_true",
                    help="skip the one-process run and the comparison after the N processes")
    ap.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stem-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is None:
        sys.exit(launch(args))
    work(args, args.worker)


if __name__ == "__main__":
    main()
