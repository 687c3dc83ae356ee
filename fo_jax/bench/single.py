"""The single-GPU rows of `python -m fo_jax.bench` (one GPU, or --tp 1): no collective to overlap,
so what is left to measure is the GEMM and the cost of the op around it.

Per shape (x[M,K] @ w[K,N] on one device), all timed together, trials interleaved:
  xla.dot        jnp.dot(x, w): XLA's GEMM, as users write it
  fo_jax.matmul  fo_jax's GEMM (the CUDA kernel where the CUDA path applies)
  fo_jax         overlapped_matmul over a 1-device "tp" mesh, per collective: a plain GEMM,
                 the collective over one device being the identity
  jax.baseline   x @ w + psum_scatter / psum on the same 1-device mesh
The GEMM rows carry collective "none" and compare with xla.dot; the axis-size-1 rows compare with
jax.baseline, as the overlap rows do.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

import fo_jax
from fo_jax.bench import core

GEMM = "none"  # the collective field of the GEMM rows


def measure(device, shapes: Sequence[str], collectives: Sequence[str], dtype,
            res: core.Results, timing: dict, tag: str = "") -> list:
    """Adds one row per (shape, method) to `res`; returns the (collective, shape) pairs."""
    mesh = Mesh(np.array([device]), ("tp",))
    work = []
    for i, s in enumerate(shapes):
        m, n, k = core.parse_shape(s)
        where = f"[{i + 1}/{len(shapes)}] {s}"
        x, w = core.random_operands(mesh, m, n, k, dtype, seed=i)
        assert x.dtype == dtype and w.dtype == dtype
        # (collective, method) -> function of (x, w); the reference of each group first.
        fns = {(GEMM, "xla.dot"): jax.jit(core.xla_matmul),
               (GEMM, "fo_jax.matmul"): jax.jit(fo_jax.matmul)}
        for c in collectives:
            fns[(c, "jax.baseline")] = core.build(mesh, c, "baseline")
            fns[(c, "fo_jax")] = core.build(mesh, c, "fo_jax")
        refs, ok = {}, {}
        for (c, name), f in fns.items():
            core.progress(f"{where}: {name}{'' if c == GEMM else f' ({c}, tp=1)'}: "
                          "compile + check")
            extra = {"path": core.path_of(mesh, c, x, w)} if name == "fo_jax" else {}
            try:
                got = f(x, w)
                assert got.dtype == dtype, (name, got.dtype)
                if c in refs:
                    err = float(core.rel_err(got, refs[c]))
                    assert err < 2e-2, f"{name}: wrong result (rel err {err:.2e})"
                else:
                    refs[c] = got
                ok[(c, name)] = extra
            except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
                core.progress(f"{where}: {name}: FAILED {e!r:.200}")
                res.add(M=m, N=n, K=k, collective=c, method=name + tag, ms=None,
                        error=repr(e)[:500], **extra)
        core.progress(f"{where}: timing {len(ok)} methods ({timing['trials']} x "
                      f"{timing['reps']} calls each, interleaved)")
        timed = {f"{c}|{name}": fns[(c, name)] for c, name in ok}
        times = core.time_ms_interleaved(timed, x, w, **timing)
        for (c, name), extra in ok.items():
            ms = times[f"{c}|{name}"]
            core.progress(f"{where}: {name}{'' if c == GEMM else f' ({c})'}: {ms:.4f} ms")
            res.add(M=m, N=n, K=k, collective=c, method=name + tag, ms=round(ms, 4), **extra)
        work += [(c, s) for c in (GEMM, *collectives)]
        refs.clear()
        fns.clear()
    return work
