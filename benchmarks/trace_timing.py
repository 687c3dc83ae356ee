"""GPU kernel time per call of several jitted functions, from few JAX profiler traces.

benchlib.kernel_ms_interleaved records one trace per method and round, which is exact but costs
a trace (a profiler start, stop and parse) per method: too slow for a sweep of a dozen methods
on 66 shapes. Here one trace per round holds `calls` calls of every method, interleaved call by
call (`schedule`: every method once per pass, forward and backward in turn, the start moving
from pair to pair), each call blocked on before the next. A GPU that clocks down as a trace
goes on (H100s and H200s at their power cap, on long GEMMs) then slows every method alike:
with each method's calls back to back instead, the methods late in a trace of 16 at M >= 8192
read up to 18% slower than the same kernel early in it (docs/gemm_performance.md, "The choice").
Each kernel is attributed to its method by, in this order:
  1. the XLA module named in the kernel event's stats: every function is jitted under its own
     name (`named_jit`), so its kernels carry "jit_trace_f<key>" (hlo_module, or the raw XLA
     annotation where the trace keeps only that);
  2. the host-side windows of its method (a jax.profiler.TraceAnnotation around each call,
     which ends after block_until_ready): a kernel starting inside one is the method's (a
     memset launched by a custom call may carry no module);
  3. the method of the nearest earlier event placed by 1.
If neither tags nor windows work on this JAX, one trace per method and round, as benchlib does.
The result per method: the median over rounds of its kernel time per call (the sum of its
kernels' and memsets' durations over the round, divided by `calls`): no host or queue time;
with the kernel that took most of that time and its share (Timing).
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile
import time
from typing import NamedTuple

import jax

from fo_jax.bench import core as _benchcore

TAG_RE = re.compile(r"jit_trace_f(\d+)")
WINDOW = "trace_timing_method_"


def named_jit(fn, key: int):
    """jax.jit of fn(*args) under the name trace_f<key> (its XLA module: jit_trace_f<key>)."""
    def wrapper(*args):
        return fn(*args)
    wrapper.__name__ = wrapper.__qualname__ = f"trace_f{key}"
    return jax.jit(wrapper)


def _read(trace_dir: str) -> tuple:
    """(GPU 0's kernels and memsets [(start_ns, end_ns, name, tag key or None)], host windows
    {key: [(start_ns, end_ns), ...]})."""
    from jax.profiler import ProfileData  # noqa: PLC0415

    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"no xplane.pb under {trace_dir}")
    events, windows = [], {}
    for plane in ProfileData.from_file(sorted(paths)[-1]).planes:
        is_gpu0 = (plane.name.startswith("/device:GPU:")
                   and plane.name.split(":")[2].split()[0] == "0")
        for line in plane.lines:
            for ev in line.events:
                if ev.name.startswith(WINDOW) and not plane.name.startswith("/device:"):
                    windows.setdefault(int(ev.name[len(WINDOW):]), []).append(
                        (ev.start_ns, ev.start_ns + ev.duration_ns))
                if not (is_gpu0 and line.name.startswith("Stream")):
                    continue
                tag = None
                for _, value in ev.stats:
                    hit = TAG_RE.search(value) if isinstance(value, str) else None
                    if hit:
                        tag = int(hit.group(1))
                        break
                events.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name, tag))
    return sorted(events), windows


def schedule(order: list, calls: int) -> list:
    """The keys of one trace in call order: `calls` passes over `order` in pairs, a pass
    started at method j (j = pair index, mod len(order)) and then the same pass backward, so
    that every method's calls spread over the whole trace, each pair places it as far after the
    middle of a pass as before it, and its neighbours change from pass to pass."""
    out = []
    for c in range(calls):
        j = (c // 2) % len(order)
        forward = order[j:] + order[:j]
        out += forward if c % 2 == 0 else forward[::-1]
    return out


def _window_of(start: int, windows: dict, keys) -> object:
    owner = [k for k in keys if any(s <= start <= e for s, e in windows.get(k, ()))]
    return owner[0] if len(owner) == 1 else None


def attribute(events: list, windows: dict, keys) -> dict | None:
    """{key: [(duration_ns, kernel name)]}: each event goes to the method its module tag names,
    else to the method whose host window holds its start, else to the method of the nearest
    earlier tagged event. None when neither tags nor windows place every event (or no method
    has a tag or a window)."""
    tagged = [(start, tag) for start, _, _, tag in events if tag is not None]
    if any(_window_of(start, windows, keys) not in (tag, None) for start, tag in tagged):
        windows = {}  # the host and GPU clocks disagree: trust the tags alone
    if not tagged and set(keys) - set(windows):
        return None
    out: dict = {k: [] for k in keys}
    current = None
    for start, end, name, tag in events:
        owner = tag if tag in out else _window_of(start, windows, keys)
        if tag in out:
            current = tag
        owner = owner if owner is not None else current
        if owner is None:
            return None
        out[owner].append((end - start, name))
    return out


def _trace(run) -> tuple:
    with tempfile.TemporaryDirectory() as tdir:
        with jax.profiler.trace(tdir):
            run()
        return _read(tdir)


class Timing(NamedTuple):
    """One method's timing: the median GPU ms per call, the kernel that took most of its time,
    and that kernel's share of the method's time (below 1: the call ran other kernels or
    memsets too, e.g. an elementwise fusion XLA did not fold into its GEMM)."""
    ms: float
    kernel: str
    share: float

    def row_fields(self, flops: float) -> dict:
        """A result row's timing fields: ms, tflops (of `flops` per call), kernel (shortened),
        kernel_share."""
        return dict(ms=round(self.ms, 5), tflops=round(flops / self.ms / 1e9, 1),
                    kernel=short_kernel(self.kernel), kernel_share=round(self.share, 3))


class TraceTimer:
    """Times {key: (named_jit(f, key), args)} (see the module docstring). Keeps which
    attribution worked, so a JAX whose traces support neither is found out once."""

    def __init__(self, rounds: int = 3, calls: int = 8):
        self.rounds, self.calls = rounds, calls
        self.mode = "one_trace"  # or "per_method" once a trace cannot be attributed
        self.traces = 0
        self.trace_s = 0.0  # wall time spent tracing (the sweep's budget reports it)

    def _trace(self, run) -> tuple:
        t0 = time.perf_counter()
        try:
            return _trace(run)
        finally:
            self.traces += 1
            self.trace_s += time.perf_counter() - t0

    def _round(self, fns: dict, order: list) -> dict:
        calls = self.calls
        if self.mode == "per_method":
            spans = {}
            for k in order:
                f, args = fns[k]
                events, _ = self._trace(lambda: jax.block_until_ready(
                    [f(*args) for _ in range(calls)]))
                spans[k] = [(e - s, n) for s, e, n, _ in events]
            return spans

        def run():
            for k in schedule(order, calls):
                f, args = fns[k]
                with jax.profiler.TraceAnnotation(f"{WINDOW}{k}"):
                    jax.block_until_ready(f(*args))

        events, windows = self._trace(run)
        spans = attribute(events, windows, fns)
        if spans is None:
            print("trace_timing: neither module names nor host windows attribute the kernels; "
                  "one trace per method from now on", file=sys.stderr)
            self.mode = "per_method"
            return self._round(fns, order)
        return spans

    def __call__(self, fns: dict) -> dict:
        """{key: Timing} for fns = {key: (named_jit(f, key), args)}."""
        samples: dict = {k: [] for k in fns}
        kernels: dict = {k: {} for k in fns}
        for r in range(self.rounds):
            for k, evs in self._round(fns, _benchcore.rotated(list(fns), r)).items():
                if not evs:
                    raise RuntimeError(f"method {k}: the profiler recorded no GPU kernel")
                samples[k].append(sum(d for d, _ in evs) / 1e6 / self.calls)
                for d, n in evs:
                    kernels[k][n] = kernels[k].get(n, 0) + d
        out = {}
        for k, s in samples.items():
            main = max(kernels[k], key=kernels[k].get)
            out[k] = Timing(sorted(s)[len(s) // 2], main,
                            kernels[k][main] / sum(kernels[k].values()))
        return out


def short_kernel(name: str) -> str:
    """"fo_jax GEMM" for fo_jax's kernel, else the kernel's name without signature and template
    arguments (cuBLASLt's nvjet and CUTLASS names carry their tile shape and cluster)."""
    if "fo_jax" in name:
        return "fo_jax GEMM"
    return name.replace("void ", "").split("(")[0].split("<")[0].strip()[:96]
