"""Where a benchmark sample's wall time goes: one traced batch of back-to-back calls, per GPU.

bench_overlap.py times batches of 20 back-to-back calls (wall clock, as the anchors). For
8192x8192x2048 reduce-scatter the device period of one call read 433 us while a batch took ~513 us
per call (docs/performance.md, 'How to measure'): this script splits a batch's wall time into the
time until each GPU's first kernel (dispatch and launch), the GPUs' spans from first to last
kernel, the idle time inside those spans (GPUs waiting for each other or for the host; the largest
gaps of GPUs 0 and 1 by the events around them), and the time from the last kernel's end until the
host sees the batch done. All from one JAX profiler trace (host and device events share its clock),
the batch wrapped in a TraceAnnotation.

Usage: python dev/probes_py/profile_batch.py [--shape MxNxK] [--collectives ...] [--calls 20]
Prints a summary per method and GPU (fo_jax, jax.baseline); writes nothing.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

import jax
import jax.numpy as jnp

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, _BENCHMARKS)  # benchlib
import benchlib  # noqa: E402

from fo_jax.bench import core as _benchcore  # noqa: E402

MARK = "fo_jax_profile_batch"


def host_mark_ns(trace_dir: str) -> tuple:
    """(start, end) ns of the TraceAnnotation MARK on the host plane."""
    from jax.profiler import ProfileData  # noqa: PLC0415

    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name == MARK:
                    return ev.start_ns, ev.start_ns + ev.duration_ns
    raise RuntimeError(f"no {MARK} event in the trace")


def busy_ns(events: list) -> float:
    """Length of the union of the events' [start, end) intervals."""
    total, cur0, cur1 = 0.0, None, None
    for _, s, e, _ in sorted(events, key=lambda ev: ev[1]):
        if cur1 is None or s > cur1:
            if cur1 is not None:
                total += cur1 - cur0
            cur0, cur1 = s, e
        else:
            cur1 = max(cur1, e)
    return total + (cur1 - cur0 if cur1 is not None else 0.0)


def idle_gaps(events: list, min_ns: float = 1e3) -> dict:
    """{(event before, event after): [count, total us]} of the idle gaps (no event on any
    stream of the GPU) longer than min_ns."""
    out: dict = {}
    evs = sorted(events, key=lambda ev: ev[1])
    last_end, last_name = evs[0][2], evs[0][0]
    for name, s, e, _ in evs[1:]:
        if s - last_end > min_ns:
            key = (benchlib.kernel_label(last_name), benchlib.kernel_label(name))
            c = out.setdefault(key, [0, 0.0])
            c[0] += 1
            c[1] += (s - last_end) / 1e3
        if e > last_end:
            last_end, last_name = e, name
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x8192x2048")
    ap.add_argument("--collectives", nargs="*", default=["reduce_scatter"])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--batches", type=int, default=2, help="traced batches per method")
    args = ap.parse_args()

    mesh = benchlib.tp_mesh_or_exit("profile_batch.py")
    m, n, k = _benchcore.parse_shape(args.shape)
    x, w = _benchcore.random_operands(mesh, m, n, k, jnp.bfloat16)
    calls = args.calls
    for collective in args.collectives:
        for method in ("fo_jax", "baseline"):
            f = _benchcore.build(mesh, collective, method)
            for _ in range(3):
                jax.block_until_ready(f(x, w))
            _, wall_ms = benchlib.dispatch_and_wall_ms(f, x, w, calls=calls)
            print(f"\n=== {collective} {args.shape} {method}: untraced wall {wall_ms * 1e3:.0f} "
                  f"us/call ({calls} back to back)")
            for b in range(args.batches):
                with tempfile.TemporaryDirectory() as tdir:
                    with jax.profiler.trace(tdir):
                        with jax.profiler.TraceAnnotation(MARK):
                            jax.block_until_ready([f(x, w) for _ in range(calls)])
                    h0, h1 = host_mark_ns(tdir)
                    per_gpu = benchlib.kernel_events(tdir)
                wall = (h1 - h0) / 1e3
                print(f"--- traced batch {b}: host {wall:.0f} us ({wall / calls:.0f} us/call)")
                for gpu in sorted(per_gpu):
                    evs = [e for e in per_gpu[gpu] if h0 <= e[1] <= h1]
                    if not evs:
                        continue
                    d0 = min(e[1] for e in evs)
                    d1 = max(e[2] for e in evs)
                    span = (d1 - d0) / 1e3
                    idle = span - busy_ns(evs) / 1e3
                    print(f"  GPU{gpu}: first kernel {(d0 - h0) / 1e3:6.0f} us after the batch "
                          f"starts; span {span:6.0f} us ({span / calls:4.0f}/call), idle in it "
                          f"{idle:5.0f} us ({idle / calls:3.0f}/call); last kernel ends "
                          f"{(h1 - d1) / 1e3:5.0f} us before the host sees the batch done")
                    if gpu in (0, 1) and b == args.batches - 1:
                        gaps = sorted(idle_gaps(evs).items(), key=lambda kv: -kv[1][1])
                        for (before, after), (count, total) in gaps[:6]:
                            print(f"      idle {total:6.0f} us in {count:3d} gaps: after "
                                  f"{before} -> before {after}")


if __name__ == "__main__":
    main()
