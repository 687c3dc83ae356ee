"""The overlap rows of `python -m fo_jax.bench`: every method on every (collective, shape) over a
"tp" mesh of 2+ devices.

For "all_gather" a shape MxNxK is per GPU the gathered x[M, K] @ w[K, N] (each device holds
[M / TP, K] of x): fo_jax is overlapped_matmul(collective="all_gather") with the overlapped
all-gather opted in (core.gather_config; fo_jax.sequential stays on XLA's path), jax.baseline
XLA's all_gather then x @ w, gemm_only the [M, K] @ [K, N] GEMM on an already whole x, comm_only the
all_gather of x alone.

Each method is checked against jax.baseline first (a benchmark of a wrong result is worthless),
then the working ones are timed with their trials interleaved (A B C, C B A, ...) so that clock
and power drift hits all of them alike.
"""

from __future__ import annotations

from typing import Optional, Sequence

import fo_jax
from fo_jax.bench import core


def config_label(cfg: dict) -> str:
    """fo_jax[g4,sm100,c32] / fo_jax[g2+4+5+5,sm100,c32,pp_128x192x64_c2] for a config dict."""
    groups = cfg.get("num_groups")
    if cfg.get("group_tile_rows"):
        groups = "+".join(str(r) for r in cfg["group_tile_rows"])
    label = f"fo_jax[g{groups},sm{cfg['sm_budget']},c{cfg['nccl_max_ctas']}"
    return label + (f",{cfg['gemm_config']}]" if cfg.get("gemm_config") else "]")


def _methods(mesh, collective: str, m: int, n: int, k: int, dtype, on_gpu: bool,
             configs: Sequence[dict], extended: bool, chunks: Sequence[int],
             gpu_kind: Optional[str], total_sms: Optional[int]) -> dict:
    build = core.build
    seq = fo_jax.OverlapConfig(num_groups=1, sm_budget=1024)
    fns = {"fo_jax": build(mesh, collective, "fo_jax"),
           "fo_jax.sequential": build(mesh, collective, "fo_jax", seq)}
    if on_gpu:
        fns["fo_jax.nccl"] = build(mesh, collective, "fo_jax",
                                   fo_jax.OverlapConfig(transport="nccl"))
    if extended and on_gpu and total_sms is not None:
        from fo_jax.tuning import cache  # noqa: PLC0415

        tuned = cache.lookup(gpu_kind, collective, m, n, k, dtype, mesh.shape["tp"])
        if tuned is not None:
            fns["fo_jax.tuned"] = build(mesh, collective, "fo_jax", fo_jax.OverlapConfig(
                num_groups=tuned["num_groups"], sm_budget=total_sms - tuned["sms_for_nccl"],
                nccl_max_ctas=tuned["nccl_max_ctas"]))
    for cfg in configs:
        fns[config_label(cfg)] = build(mesh, collective, "fo_jax", fo_jax.OverlapConfig(**cfg))
    fns["jax.baseline"] = build(mesh, collective, "baseline")
    if extended:
        for c in chunks:
            fns[f"jax.chunked[c{c}]"] = build(mesh, collective, "chunked", chunks=c)
    fns["gemm_only"] = build(mesh, collective, "gemm_only")
    fns["comm_only"] = build(mesh, collective, "comm_only")
    return fns


def measure(mesh, shapes: Sequence[str], collectives: Sequence[str], dtype, res: core.Results,
            timing: dict, on_gpu: bool, configs: Sequence[dict] = (), extended: bool = True,
            chunks: Sequence[int] = (2, 4), tag: str = "") -> list:
    """Adds one row per (collective, shape, method) to `res`; returns the (collective, shape)
    pairs measured."""
    devices = list(mesh.devices.flat)
    total_sms = gpu_kind = None
    if on_gpu and extended:
        from fo_jax.tuning import measure as tuning_measure  # noqa: PLC0415

        total_sms = tuning_measure.num_sms(devices[0])
        gpu_kind = devices[0].device_kind
    work = [(c, s) for c in collectives for s in shapes]
    for i, (collective, s) in enumerate(work):
        m, n, k = core.parse_shape(s)
        where = f"[{i + 1}/{len(work)}] {collective} {s}"
        x, w = core.operands(mesh, collective, m, n, k, dtype, seed=i)
        # Methods timed on their own arguments (the rest share (x, w), trials interleaved).
        if collective == "all_gather":
            alone = {"comm_only": (x,), "gemm_only": (core.replicated(mesh, x), w)}
        else:
            alone = {"comm_only": (core.random_partials(mesh, m, n, dtype, seed=i + 1000),)}
        assert all(a.dtype == dtype for a in (x, w, *alone["comm_only"]))
        fns = _methods(mesh, collective, m, n, k, dtype, on_gpu, configs, extended, chunks,
                       gpu_kind, total_sms)
        path = core.path_of(mesh, collective, x, w)
        ref = fns["jax.baseline"](x, w)
        ok = {}
        for name, f in fns.items():
            core.progress(f"{where}: {name}: compile + check")
            args = alone.get(name, (x, w))
            extra = {"chunks": int(name[len("jax.chunked[c"):-1])} if "chunked" in name else {}
            if name.startswith("fo_jax") and name != "fo_jax.sequential":
                extra["path"] = path
            try:
                got = f(*args)
                assert got.dtype == dtype, (name, got.dtype)
                if name not in ("gemm_only", "comm_only"):
                    err = float(core.rel_err(got, ref))
                    assert err < 2e-2, f"{name}: wrong result (rel err {err:.2e})"
                ok[name] = extra
            except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
                core.progress(f"{where}: {name}: FAILED {e!r:.200}")
                res.add(M=m, N=n, K=k, collective=collective, method=name + tag, ms=None,
                        error=repr(e)[:500], **extra)
        on_xw = {name: fns[name] for name in ok if name not in alone}
        core.progress(f"{where}: timing {len(ok)} methods ({timing['trials']} x "
                      f"{timing['reps']} calls each, interleaved)")
        times = core.time_ms_interleaved(on_xw, x, w, **timing)
        for name, args in alone.items():
            if name in ok:
                times[name] = core.time_ms(fns[name], *args, **timing)
        for name in fns:
            if name in times:
                core.progress(f"{where}: {name}: {times[name]:.4f} ms")
                res.add(M=m, N=n, K=k, collective=collective, method=name + tag,
                        ms=round(times[name], 4), **ok[name])
        fns.clear()
    return work
