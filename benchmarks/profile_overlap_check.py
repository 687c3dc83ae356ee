"""Whether each collective of a profiled step overlapped a GEMM, read from a JAX profiler trace.

benchmarks/train_tp_transformer.py --profile DIR writes one step of each method under
DIR/<method>; this script reads such a trace (the .xplane.pb that jax.profiler writes, or a Chrome
trace .trace.json.gz / perfetto_trace.json.gz) and, per GPU, classifies each kernel or copy on a
GPU stream by name:
  communication  NCCL kernels, peer-to-peer memcpys (the copy-engine transport)
  GEMM           cuBLAS / cuBLASLt (nvjet), CUTLASS, fo_jax's GEMM kernels
and groups the communication events by the XLA op that launched them (the event's hlo_op, else
its name): one group is one collective (an fo_jax custom call, or one XLA all-gather /
reduce-scatter). The copy engine's peer copies carry no op (fo_jax's copy thread issues them,
not XLA): each belongs to the last fo_jax custom call on its GPU that started before it. A group
overlapped when at least --min-fraction of its communication time (the union of its events'
intervals) runs while a GEMM kernel runs on the same GPU.

PASS when every GPU has at least --expect overlapped groups (train_tp_transformer's four
collectives per layer: --expect 4 x layers); the exit status is 1 on FAIL, 2 when the trace
holds no GPU events. --json FILE writes every communication event with its overlap.

Usage: python benchmarks/profile_overlap_check.py TRACE_DIR_OR_FILE [--expect N]
       [--min-fraction 0.5] [--json FILE] [--events]
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
from typing import Iterable, Optional, Sequence

COMM_RE = re.compile(r"nccl|memcpy\s*(p2p|ptop|peer)|memcpyp2p|peer", re.IGNORECASE)
GEMM_RE = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|wgmma|fo_jax", re.IGNORECASE)
# fo_jax's helper kernels (flag waits, band sums, test fills) carry "fo_jax" but are no GEMM.
NOT_GEMM_RE = re.compile(r"SpinWait|BandSum|FillUniform|CompareBits|ScaleKernel|memset|memcpy",
                         re.IGNORECASE)
OP_STATS = ("hlo_op", "tf_op", "long_name")


@dataclasses.dataclass(frozen=True)
class Event:
    """One kernel or copy on a GPU stream."""

    gpu: int
    name: str
    start_ns: int
    end_ns: int
    op: str = ""  # the XLA op that launched it, where the trace says


def kind(name: str, extra_comm: Optional[re.Pattern] = None,
         extra_gemm: Optional[re.Pattern] = None) -> Optional[str]:
    """"comm", "gemm" or None for a GPU event's name (extra_*: patterns given on the command
    line, for kernel names this script does not know)."""
    if COMM_RE.search(name) or (extra_comm and extra_comm.search(name)):
        return "comm"
    if (GEMM_RE.search(name) and not NOT_GEMM_RE.search(name)) or (
            extra_gemm and extra_gemm.search(name)):
        return "gemm"
    return None


def _gpu_of(process_name: str) -> Optional[int]:
    """0 for "/device:GPU:0", "/device:GPU:0 (...)" and the like; None for other planes."""
    hit = re.match(r"/device:GPU:(\d+)", process_name)
    return int(hit.group(1)) if hit else None


def find_trace(path: str) -> str:
    """The trace file itself, or the newest .xplane.pb (else .json.gz) under a folder."""
    if os.path.isfile(path):
        return path
    for pattern in ("*.xplane.pb", "*.json.gz"):
        found = glob.glob(os.path.join(path, "**", pattern), recursive=True)
        if found:
            return max(found, key=os.path.getmtime)
    raise FileNotFoundError(f"profile_overlap_check: no .xplane.pb or .json.gz under {path!r} "
                            "(write one with jax.profiler.trace, e.g. train_tp_transformer.py "
                            "--profile DIR)")


def read_xplane(path: str) -> list:
    from jax.profiler import ProfileData  # noqa: PLC0415 (jax only for .xplane.pb)

    events = []
    for plane in ProfileData.from_file(path).planes:
        gpu = _gpu_of(plane.name)
        if gpu is None:
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):  # not the derived "XLA Ops" / "Steps" lines
                continue
            for ev in line.events:
                stats = dict(ev.stats)
                op = next((str(stats[s]) for s in OP_STATS if stats.get(s)), "")
                events.append(Event(gpu, ev.name, int(ev.start_ns),
                                    int(ev.start_ns + ev.duration_ns), op))
    return events


def read_chrome(path: str) -> list:
    """Events of a Chrome trace (ph "X", ts / dur in microseconds) on GPU processes' stream
    threads, named by the process_name / thread_name metadata."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    trace = data["traceEvents"] if isinstance(data, dict) else data
    procs, threads = {}, {}
    for e in trace:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    events = []
    for e in trace:
        if e.get("ph") != "X":
            continue
        gpu = _gpu_of(procs.get(e["pid"], ""))
        if gpu is None or not threads.get((e["pid"], e.get("tid")), "").startswith("Stream"):
            continue
        args = e.get("args", {})
        op = next((str(args[s]) for s in OP_STATS if args.get(s)), "")
        start = int(round(float(e["ts"]) * 1e3))
        events.append(Event(gpu, e["name"], start, start + int(round(float(e["dur"]) * 1e3)), op))
    return events


def read(path: str) -> list:
    """The GPU stream events of a trace file or folder (see find_trace)."""
    path = find_trace(path)
    return read_xplane(path) if path.endswith(".xplane.pb") else read_chrome(path)


def _union(intervals: Iterable[tuple]) -> list:
    out: list = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(intervals: Sequence) -> int:
    return sum(e - s for s, e in intervals)


def _intersection(a: Sequence, b: Sequence) -> int:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def attribute_peer_copies(events: Sequence[Event]) -> list:
    """The events, each communication event without an op given the op of the last fo_jax
    custom call (an op named fo_jax*) on its GPU that started before it: the call whose copy
    thread issued it (a call's copies start after its first kernel or memset and may end after
    its GEMM). Copies before any such call keep no op."""
    starts: dict = {}  # gpu -> {op: first start}
    for e in events:
        if e.op.startswith("fo_jax"):
            mine = starts.setdefault(e.gpu, {})
            mine[e.op] = min(mine.get(e.op, e.start_ns), e.start_ns)
    calls = {gpu: tuple(zip(*sorted((s, op) for op, s in ops.items())))
             for gpu, ops in starts.items()}  # gpu -> (call starts, their ops), by start
    out = []
    for e in events:
        if not e.op and kind(e.name) == "comm" and e.gpu in calls:
            call_starts, ops = calls[e.gpu]
            i = bisect.bisect_right(call_starts, e.start_ns)  # calls started by e's start
            if i:
                e = dataclasses.replace(e, op=ops[i - 1])
        out.append(e)
    return out


def analyse(events: Sequence[Event], min_fraction: float = 0.5, extra_comm=None,
            extra_gemm=None) -> dict:
    """{gpu: {"collectives": [{op, events, comm_us, overlapped_us, fraction, overlapped}],
    "events": [{name, op, start_us, dur_us, overlap_us}], "gemm_us", "other": [(us, name)]}}
    ("other": the unclassified kernels taking most time, to spot a name this script misses)."""
    out = {}
    events = attribute_peer_copies(events)
    for gpu in sorted({e.gpu for e in events}):
        mine = [e for e in events if e.gpu == gpu]
        kinds = [kind(e.name, extra_comm, extra_gemm) for e in mine]
        gemm = _union((e.start_ns, e.end_ns) for e, k in zip(mine, kinds) if k == "gemm")
        comm = [e for e, k in zip(mine, kinds) if k == "comm"]
        other: dict = {}
        for e, k in zip(mine, kinds):
            if k is None:
                other[e.name] = other.get(e.name, 0) + (e.end_ns - e.start_ns) / 1e3
        groups: dict = {}
        for e in comm:
            groups.setdefault(e.op or e.name, []).append(e)
        collectives = []
        for op, evs in groups.items():
            busy = _union((e.start_ns, e.end_ns) for e in evs)
            hidden = _intersection(busy, gemm)
            total = _length(busy)
            frac = hidden / total if total else 0.0
            collectives.append(dict(op=op, events=len(evs), start_us=busy[0][0] / 1e3,
                                    comm_us=total / 1e3, overlapped_us=hidden / 1e3,
                                    fraction=frac, overlapped=frac >= min_fraction))
        collectives.sort(key=lambda c: c["start_us"])
        out[gpu] = dict(
            gemm_us=_length(gemm) / 1e3, collectives=collectives,
            other=sorted(((us, n) for n, us in other.items()), reverse=True)[:8],
            events=[dict(name=e.name, op=e.op, start_us=e.start_ns / 1e3,
                         dur_us=(e.end_ns - e.start_ns) / 1e3,
                         overlap_us=_intersection([(e.start_ns, e.end_ns)], gemm) / 1e3)
                    for e in sorted(comm, key=lambda e: e.start_ns)])
    return out


def report(result: dict, expect: int, show_events: bool = False) -> tuple:
    """(lines, passed): per GPU its collectives, then one PASS/FAIL line."""
    lines, passed = [], bool(result)
    for gpu, r in result.items():
        done = sum(c["overlapped"] for c in r["collectives"])
        lines.append(f"GPU {gpu}: {len(r['collectives'])} collectives "
                     f"({sum(c['events'] for c in r['collectives'])} communication events), "
                     f"{done} overlapped with a GEMM; GEMM busy {r['gemm_us']:.1f} us")
        for c in r["collectives"]:
            lines.append(f"  {'overlapped' if c['overlapped'] else 'NOT overlapped':>14}  "
                         f"{c['fraction']:6.1%} of {c['comm_us']:9.1f} us  {c['events']:4d} "
                         f"events  {c['op'][:100]}")
        if done < expect and r["other"]:
            lines.append("  unclassified kernels taking most time (--comm-regex / --gemm-regex "
                         "add names): " + "; ".join(f"{n[:60]} {us:.0f} us"
                                                     for us, n in r["other"]))
        if show_events:
            for e in r["events"]:
                lines.append(f"    {e['start_us']:14.1f} us {e['dur_us']:9.1f} us  overlap "
                             f"{e['overlap_us']:9.1f} us  {e['name'][:80]}  [{e['op'][:40]}]")
        passed = passed and done >= expect
    verdict = "PASS" if passed else "FAIL"
    what = (f"every GPU has >= {expect} collectives overlapped with a GEMM" if result
            else "the trace holds no GPU stream events")
    lines.append(f"{verdict} profile overlap: {what}")
    return lines, passed


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("trace", help="a trace file, or a folder holding one (searched recursively)")
    ap.add_argument("--expect", type=int, default=1,
                    help="overlapped collectives each GPU must show (4 x layers for one "
                    "train_tp_transformer step)")
    ap.add_argument("--min-fraction", type=float, default=0.5,
                    help="share of a collective's communication time that must overlap a GEMM")
    ap.add_argument("--comm-regex", default=None, help="more communication kernel names")
    ap.add_argument("--gemm-regex", default=None, help="more GEMM kernel names")
    ap.add_argument("--json", default=None, help="write the per-event analysis here")
    ap.add_argument("--events", action="store_true", help="also print every event")
    a = ap.parse_args(argv)
    path = find_trace(a.trace)
    events = read(path)
    pattern = lambda p: re.compile(p, re.IGNORECASE) if p else None  # noqa: E731
    result = analyse(events, a.min_fraction, pattern(a.comm_regex), pattern(a.gemm_regex))
    print(f"trace: {path} ({len(events)} GPU stream events)")
    lines, passed = report(result, a.expect, a.events)
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"trace": path, "expect": a.expect, "min_fraction": a.min_fraction,
                       "passed": passed, "gpus": result}, fh, indent=1)
    if not result:
        return 2
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
