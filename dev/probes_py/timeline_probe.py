"""Where a slow batch's time goes: untraced per-call, per-GPU timelines of fo_jax's reduce-scatter
(8192x8192x2048 unless --shape says otherwise) on all GPUs, batches of 20 back-to-back calls as
bench_overlap.py times them (docs/performance.md, 'What bounds the numbers'). The FFI handler
records CUDA events at fixed points of each call (csrc/comm/call_timeline.h) and the host times of
its entry and exit (and the copy thread's end of enqueueing); no profiler runs. Batches with the
timeline off are interleaved with batches with it on, to show what the recording costs.

Prints one line per recorded batch (wall per call, the per-call means of each phase, and each
copy's start and length) and then the same means over the fastest and the slowest third of the
batches; writes every row to OUT/timeline_probe.jsonl.

Usage: python dev/probes_py/timeline_probe.py [--out DIR] [--batches N] [--tag NAME] [--shape MxNxK]
       [VARIANT ...]
A variant is "fo_jax" with optional environment settings applied while its function is traced,
e.g. fo_jax:FO_JAX_CE_PEER_STORES=1 (default: fo_jax); variants run interleaved, batch by batch.
--tag names the build in the output, e.g. a commit, for comparing two processes.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

_BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, _BENCHMARKS)  # benchlib
import benchlib  # noqa: E402
import fo_jax  # noqa: E402,F401  (before JAX uses a GPU: 32 hardware queues)
import jax.numpy as jnp  # noqa: E402

from fo_jax import _cuda  # noqa: E402
from fo_jax.bench import core as _benchcore  # noqa: E402

CALLS = 20


def phases(rows, marks):
    """Per-call phase lengths (us) of one batch: {name: [values over GPUs and calls 1..]}."""
    col = {m: i for i, m in enumerate(marks)}
    by_gpu = {}
    for dev, _rank, call, us in rows:
        by_gpu.setdefault(dev, {})[call] = us
    out = {k: [] for k in ("period", "gemm", "tail", "idle_before", "host_lead", "ack_wait",
                           "last_copy_after_gemm", "sum1", "sum2", "host_interval", "handler",
                           "h_prep", "h_gemm", "h_copies", "h_sums")}
    starts = {}  # call -> [xla_start of each GPU]
    for calls in by_gpu.values():
        for c, us in sorted(calls.items()):
            get = lambda m: us[col[m]]  # noqa: E731
            starts.setdefault(c, []).append(get("xla_start"))
            if c == 0:
                continue  # the first call waits for the batch's start, not for anything inside
            prev = calls.get(c - 1)
            if prev is not None:
                out["period"].append(get("xla_start") - prev[col["xla_start"]])
                out["idle_before"].append(get("xla_start") - prev[col["call_end"]])
                out["host_interval"].append(get("host_enter") - prev[col["host_enter"]])
            # Where the handler's host time goes (between its host marks).
            out["handler"].append(get("host_exit") - get("host_enter"))
            out["h_prep"].append(get("host_prepared") - get("host_enter"))
            out["h_gemm"].append(get("host_gemm_launched") - get("host_prepared"))
            out["h_copies"].append(get("host_copies_enqueued") - get("host_gemm_launched"))
            out["h_sums"].append(get("host_exit") - get("host_copies_enqueued"))
            if "host_copies_issued" in col and not math.isnan(get("host_copies_issued")):
                # The copy thread: from the GEMM's launch to its last copy enqueued.
                out.setdefault("h_thread", []).append(get("host_copies_issued") -
                                                      get("host_gemm_launched"))
            out["gemm"].append(get("gemm_end") - get("xla_start"))
            out["tail"].append(get("call_end") - get("gemm_end"))
            out["host_lead"].append(get("xla_start") - get("host_exit"))
            out["ack_wait"].append(get("copy_acked") - get("copy_inputs"))
            sent = [us[col[m]] for m in marks if m.startswith("copy_sent") and
                    not math.isnan(us[col[m]])]
            if sent:
                out["last_copy_after_gemm"].append(max(sent) - get("gemm_end"))
            # Each copy: when it could start (its group done, the stream free) and how long it
            # ran, from the call's start.
            for i in range(sum(m.startswith("copy_go") for m in marks)):
                go, done = f"copy_go{i}", f"copy_done{i}"
                if not math.isnan(get(go)) and not math.isnan(get(done)):
                    out.setdefault(f"c{i}_go", []).append(get(go) - get("xla_start"))
                    out.setdefault(f"c{i}_dur", []).append(get(done) - get(go))
            out["sum1"].append(get("first_sum_end") - get("gemm_end"))
            if not math.isnan(get("second_sum_end")):
                out["sum2"].append(get("second_sum_end") - get("first_sum_end"))
    skew = [max(v) - min(v) for c, v in starts.items() if c > 0 and len(v) > 1]
    summary = {k: statistics.mean(v) for k, v in out.items() if v}
    summary["host_lead_min"] = min(out["host_lead"]) if out["host_lead"] else float("nan")
    summary["start_skew"] = statistics.mean(skew) if skew else float("nan")
    first = starts.get(0, [])
    summary["first_start_spread"] = max(first) - min(first) if first else float("nan")
    return summary


def fmt(s):
    keys = ("period", "gemm", "tail", "sum1", "sum2", "idle_before", "ack_wait",
            "last_copy_after_gemm", "start_skew", "host_lead", "host_lead_min",
            "first_start_spread", "host_interval", "handler", "h_prep", "h_gemm", "h_copies",
            "h_sums", "h_thread")
    copies = [f"{s[k]:.0f}+{s[k[:-2] + 'dur']:.0f}" for k in s if k.endswith("_go")]
    return " ".join(f"{k} {s[k]:.0f}" for k in keys if k in s) + (
        " | copies start+us " + " ".join(copies) if copies else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", type=int, default=30, help="recorded batches per pause setting")
    ap.add_argument("--tag", default="")
    ap.add_argument("--shape", default="8192x8192x2048", help="per-GPU MxNxK")
    ap.add_argument("variants", nargs="*", default=["fo_jax"])
    a = ap.parse_args()
    mesh = benchlib.tp_mesh_or_exit("timeline_probe.py")
    m, n, k = (int(v) for v in a.shape.split("x"))
    x, w = _benchcore.random_operands(mesh, m, n, k, jnp.bfloat16)
    fns = {v: benchlib.build_rs_variant(mesh, v, x, w) for v in a.variants}
    mod = _cuda.module()
    marks = mod.timeline_marks()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "timeline_probe.jsonl")
    with open(path, "a") as log:
        for pause in (0.0, 0.02):
            walls_off = {v: [] for v in fns}
            recorded = {v: [] for v in fns}
            for b, (v, f) in ((b, vf) for b in range(a.batches) for vf in fns.items()):
                tag = f"[{a.tag} {v}] "
                # Off, then on: the recording's cost shows as the difference of their walls.
                if pause:
                    time.sleep(pause)
                walls_off[v].append(benchlib.dispatch_and_wall_ms(f, x, w, calls=CALLS)[1] * 1e3)
                mod.timeline_start(CALLS)
                if pause:
                    time.sleep(pause)
                origin = mod.timeline_now_ns()
                wall = benchlib.dispatch_and_wall_ms(f, x, w, calls=CALLS)[1] * 1e3
                rows = mod.timeline_read(origin)
                mod.timeline_start(0)
                s = phases(rows, marks)
                recorded[v].append((wall, s))
                print(f"{tag}pause {pause * 1e3:.0f} ms batch {b}: wall {wall:.0f} us/call | "
                      f"{fmt(s)}", flush=True)
                log.write(json.dumps({"tag": a.tag, "variant": v, "pause_ms": pause * 1e3,
                                      "batch": b, "wall_us": wall, "marks": marks,
                                      "rows": rows}) + "\n")
            for v in fns:
                tag = f"[{a.tag} {v}] "
                print(f"{tag}pause {pause * 1e3:.0f} ms: wall us/call, timeline off: median "
                      f"{statistics.median(walls_off[v]):.0f}; on: median "
                      f"{statistics.median(r[0] for r in recorded[v]):.0f}", flush=True)
                rec = sorted(recorded[v], key=lambda r: r[0])
                third = max(1, len(rec) // 3)
                for name, part in (("fastest third", rec[:third]), ("slowest third", rec[-third:])):
                    keys = part[0][1].keys()
                    mean = {k: statistics.mean(r[1][k] for r in part) for k in keys}
                    print(f"{tag}pause {pause * 1e3:.0f} ms {name}: wall "
                          f"{statistics.mean(r[0] for r in part):.0f} | {fmt(mean)}", flush=True)
    print(f"rows: {path}")


if __name__ == "__main__":
    main()
