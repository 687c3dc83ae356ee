"""GPU kernel time per call of several jitted functions, from few JAX profiler traces.

benchlib.kernel_ms_interleaved records one trace per method and round, which is exact but costs
a trace (a profiler start, stop and parse) per method: too slow for a sweep of a dozen methods
on 66 shapes. Here one trace per round holds every method, `calls` back-to-back calls each,
blocked on before the next method, in rotated order (_benchcore.rotated), and each kernel is
attributed to its method by, in this order:
  1. the XLA module named in the kernel event's stats: every function is jitted under its own
     name (`named_jit`), so its kernels carry "jit_trace_f<key>" (hlo_module, or the raw XLA
     annotation where the trace keeps only that); an event without one (a memset launched by a
     custom call, say) belongs to the nearest earlier event's method;
  2. else the host-side window of the method (a jax.profiler.TraceAnnotation around its calls,
     which ends after block_until_ready): a kernel starting inside it is the method's;
  3. else (neither works on this JAX) one trace per method, as benchlib does.
The result per method: the median over rounds of its kernel time per call (the sum of its
kernels' and memsets' durations over the round, divided by `calls`): no host or queue time.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile

import jax

from fo_jax import _benchcore

TAG_RE = re.compile(r"jit_trace_f(\d+)")
WINDOW = "trace_timing_method_"


def named_jit(fn, key: int):
    """jax.jit of fn(x, w) under the name trace_f<key> (its XLA module: jit_trace_f<key>)."""
    def wrapper(x, w):
        return fn(x, w)
    wrapper.__name__ = wrapper.__qualname__ = f"trace_f{key}"
    return jax.jit(wrapper)


def _read(trace_dir: str) -> tuple:
    """(GPU 0's kernels and memsets [(start_ns, end_ns, name, tag key or None)], host windows
    {key: (start_ns, end_ns)})."""
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
                    windows[int(ev.name[len(WINDOW):])] = (ev.start_ns,
                                                           ev.start_ns + ev.duration_ns)
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


def attribute_by_tag(events: list, keys) -> dict | None:
    """{key: [(duration_ns, kernel name)]} from the events' module tags; None if none has one."""
    out: dict = {k: [] for k in keys}
    current, seen = None, False
    for start, end, name, tag in events:
        if tag is not None:
            current, seen = tag, True
        if current in out:
            out[current].append((end - start, name))
    return out if seen else None


def attribute_by_window(events: list, windows: dict, keys) -> dict | None:
    """{key: [(duration_ns, kernel name)]} from the host windows; None unless every method has
    a window and every kernel starts inside one (the planes' clocks then agree)."""
    if set(keys) - set(windows):
        return None
    out: dict = {k: [] for k in keys}
    for start, end, name, _ in events:
        owner = [k for k in keys if windows[k][0] <= start <= windows[k][1]]
        if len(owner) != 1:
            return None
        out[owner[0]].append((end - start, name))
    return out


def _trace(run) -> tuple:
    with tempfile.TemporaryDirectory() as tdir:
        with jax.profiler.trace(tdir):
            run()
        return _read(tdir)


class TraceTimer:
    """Times {key: named_jit(f, key)} on the same arguments (see the module docstring). Keeps
    which attribution worked, so a JAX whose traces lack both is found out once."""

    def __init__(self, rounds: int = 5, calls: int = 5):
        self.rounds, self.calls = rounds, calls
        self.mode = "tag"  # "tag" -> "window" -> "per_method", downgraded when one fails

    def _round(self, fns: dict, order: list, args) -> dict:
        calls = self.calls
        if self.mode == "per_method":
            spans = {}
            for k in order:
                events, _ = _trace(lambda: jax.block_until_ready(
                    [fns[k](*args) for _ in range(calls)]))
                spans[k] = [(e - s, n) for s, e, n, _ in events]
            return spans

        def run():
            for k in order:
                with jax.profiler.TraceAnnotation(f"{WINDOW}{k}"):
                    jax.block_until_ready([fns[k](*args) for _ in range(calls)])

        events, windows = _trace(run)
        spans = attribute_by_tag(events, fns) if self.mode == "tag" else None
        if spans is None:
            spans = attribute_by_window(events, windows, fns)
            if spans is not None and self.mode == "tag":
                print("trace_timing: kernels carry no module name; attributing by host window",
                      file=sys.stderr)
                self.mode = "window"
        if spans is None:
            print("trace_timing: neither module names nor host windows attribute the kernels; "
                  "one trace per method from now on", file=sys.stderr)
            self.mode = "per_method"
            return self._round(fns, order, args)
        return spans

    def __call__(self, fns: dict, *args) -> dict:
        """{key: (median GPU ms per call, name of the kernel that took most of its time)}."""
        samples: dict = {k: [] for k in fns}
        kernels: dict = {k: {} for k in fns}
        for r in range(self.rounds):
            for k, evs in self._round(fns, _benchcore.rotated(list(fns), r), args).items():
                if not evs:
                    raise RuntimeError(f"method {k}: the profiler recorded no GPU kernel")
                samples[k].append(sum(d for d, _ in evs) / 1e6 / self.calls)
                for d, n in evs:
                    kernels[k][n] = kernels[k].get(n, 0) + d
        return {k: (sorted(s)[len(s) // 2], max(kernels[k], key=kernels[k].get))
                for k, s in samples.items()}


def short_kernel(name: str) -> str:
    """"fo_jax GEMM" for fo_jax's kernel, else the kernel's name without signature and template
    arguments (cuBLASLt's nvjet and CUTLASS names carry their tile shape and cluster)."""
    if "fo_jax" in name:
        return "fo_jax GEMM"
    return name.replace("void ", "").split("(")[0].split("<")[0].strip()[:96]
