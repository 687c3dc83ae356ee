#!/usr/bin/env python3
"""Config table of the signaling GEMM and generator of its CUTLASS instantiations.

Writes csrc/kernels/generated/gemm_<name>_<dtype>.cu (one kernel each, so they compile in
parallel) and generated/gemm_config_table.inc (the table and dispatch arrays included by
signaling_gemm.cu). Run: python3 csrc/kernels/gemm_configs.py  (idempotent; CMake may prune
configs by deleting rows here and regenerating).
"""

from __future__ import annotations

import pathlib
from typing import NamedTuple


class GemmConfig(NamedTuple):
    name: str
    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int
    cluster_n: int
    pingpong: bool
    fast_accum: bool = False  # fp8 only: the FP8FastAccum schedules (see FP8_FAST_CONFIGS)
    # Accurate fp8 rows only: k-tiles whose partial sums stay in the tensor cores' accumulator
    # before they are added into the fp32 one (see FP8_CONFIGS).
    promotion_k_tiles: int = 1
    # The epilogue's stores in flight (0: CUTLASS's builder's 2); see TmaEpilogueInner.
    epi_stages_d: int = 0
    # Accurate fp8 rows only: CUTLASS's mma() instead of PromotingFp8Mainloop's (see
    # FP8_MMA_CONFIGS).
    cutlass_mma: bool = False
    # PromotingFp8Mainloop's rows only: CUTLASS's order of release and promotion
    # (fp8_promoting_mainloop.cuh, kReleaseAfterPromotion).
    late_release: bool = False


# SelectGemmConfig in signaling_gemm.cu refers to these names. Measured on H200 (kernel times from
# the JAX profiler, benchmarks/results/gemm_profile_h200_*.log): ping-pong 128x192 with a 2x1
# cluster is the fastest large tile (0.97-0.99x XLA's cuBLASLt kernel on the TP shapes; its
# epilogue overlaps the other warp group's MMA, which matters at K = 2048); the four large
# cooperative tiles are within ~1-4% of each other and 2-10% behind it; ping-pong 128x128 is the
# best small tile. Dropped after measuring: ping-pong 64x256 (0.6-0.75x cuBLAS), ping-pong 128x160
# (0.57-0.7x: N = 160 forces a 64-byte swizzle on the N-major B tile, and that build ran five
# 64x32 wgmmas per k-step, see _kernel_file's extended shapes) and a register->global (no TMA
# store) epilogue (0.83-0.97x).
CONFIGS: list[GemmConfig] = [
    GemmConfig("coop_128x256x64_c1", 128, 256, 64, 1, 1, False),
    GemmConfig("coop_128x256x64_c2", 128, 256, 64, 2, 1, False),
    GemmConfig("coop_256x128x64_c1", 256, 128, 64, 1, 1, False),
    GemmConfig("coop_256x128x64_c2", 256, 128, 64, 2, 1, False),
    GemmConfig("coop_128x128x64_c1", 128, 128, 64, 1, 1, False),
    GemmConfig("pp_128x128x64_c1", 128, 128, 64, 1, 1, True),
    GemmConfig("pp_128x128x64_c2", 128, 128, 64, 2, 1, True),
    GemmConfig("pp_128x192x64_c2", 128, 192, 64, 2, 1, True),
    # Candidates for small M and few tiles, measured against the rows above by
    # benchmarks/bench_gemm_sweep.py --configs all (fo_jax/_gemm_choice.py picks among all rows,
    # so a row that never wins there can be deleted). A 64-row ping-pong tile halves the tile
    # quantum along M: a problem of few tile-rows fills twice the SMs (the design shapes, with
    # many tiles, favour the 128-row tiles: ping-pong 64x256 lost there, see above). The 2x1
    # cluster multicasts B, the operand that dominates the traffic when M is small, which brings
    # their L2 bytes per flop down to those of pp_128x128x64_c1 or below. Cooperative 128x128
    # with a 2x1 cluster: the 128x128 quantum with B multicast, both warp groups on one tile.
    GemmConfig("pp_64x128x64_c2", 64, 128, 64, 2, 1, True),
    GemmConfig("pp_64x192x64_c2", 64, 192, 64, 2, 1, True),
    GemmConfig("pp_64x256x64_c2", 64, 256, 64, 2, 1, True),
    GemmConfig("coop_128x128x64_c2", 128, 128, 64, 2, 1, False),
]

# fp8 rows (float8_e4m3fn operands, bf16 output, GemmDtype::kE4M3): appended after the 16-bit
# rows so that their indices stay put. tile_k 128 (128 bytes of K per row, the 128-byte swizzle,
# as CUTLASS's fp8 examples use). Only these rows have fp8 kernels and they have no 16-bit ones;
# no source form (the planner never picks the copy-engine ring for fp8); the cooperative rows have
# the consumer form (CONSUMER_CONFIGS), for the fp8 all-gather. The mainloop is CUTLASS's
# accurate fp8 one (signaling_gemm_kernel.cuh), which holds two fp32 accumulators per output
# element (the tensor cores' partial sum and the running total): a warp group's share of the tile
# must stay at <= 96 x 128 / 128 threads, or the kernel spills (nvcc -Xptxas=-warn-spills:
# ping-pong 128x128 and cooperative 128x256 spill ~1 KB per thread). So: cooperative 128x192
# with a 2x1 cluster (bf16's large-tile winner, split over both warp groups), cooperative 128x128
# (few tiles) and ping-pong 64x192 with a 2x1 cluster (small M: the 64-row quantum); the wave
# model in SelectGemmConfig picks among them (benchmarks/bench_fp8.py --configs all).
# Promotion every 2 k-tiles (256 of K): CUTLASS's mainloop waits for every MMA in flight before
# each promotion, and halving those stalls makes the kernels faster, while the partial sums' error
# stays far below the operands' own fp8 rounding (docs/gemm_performance.md, "fp8", "Promotion
# interval": what was measured, and what still needs a committed result).
# Cooperative 128x192 keeps three epilogue stores in flight instead of the builder's two (its
# 128x32 subtiles then take 24 KB of shared memory and the mainloop keeps its 5 stages): no MMA
# runs during a cooperative epilogue, and a subtile that waits for an older store to leave shared
# memory holds up both warp groups. 0.3-3.0% faster on six shapes, most at K = 512; wider
# subtiles (fewer barriers) were slower or cost a mainloop stage (docs/gemm_performance.md,
# "Its epilogue's stores").
FP8_CONFIGS: list[GemmConfig] = [
    # fo_jax's mma() in CUTLASS's order of release and promotion (late_release): with fo_jax's
    # own order this tile ran 7-14% slower than with CUTLASS's mma() at K >= 6656 (50-60 ns a
    # k-tile); in CUTLASS's order it runs as CUTLASS's at long K and 1-8.5% faster at K <= 4096
    # (docs/gemm_performance.md, "The order of release and promotion").
    GemmConfig("fp8_coop_128x128x128_c1", 128, 128, 128, 1, 1, False, promotion_k_tiles=2,
               late_release=True),
    GemmConfig("fp8_coop_128x192x128_c2", 128, 192, 128, 2, 1, False, promotion_k_tiles=2,
               epi_stages_d=3),
    GemmConfig("fp8_pp_64x192x128_c2", 64, 192, 128, 2, 1, True, promotion_k_tiles=2),
]

# fp8 rows with fast accumulation (opt-in: OverlapConfig.fp8_fast_accumulation): CUTLASS's
# FP8FastAccum schedules keep the whole K sum in the tensor cores' accumulator, whose additions
# keep fewer mantissa bits than fp32 (XLA's fp8 dot at default precision does the same through
# cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM). One accumulator per output element, so the
# ping-pong tiles that spill with promotion fit, and a ping-pong epilogue overlaps the other warp
# group's MMA. Measured on one H100 (benchmarks/results/gemm_fp8_h100_2026-11-24_598fec1.jsonl):
# ping-pong 128x192 the fastest, 1.14x the accurate kernel at 8192x8192x7168 and 1.48x at
# 8192x4096x512; cooperative 128x256 and 128x192 with fast accumulation 3-28% behind it there,
# so not compiled; ping-pong 128x128 for few tiles (fo_jax/_fp8_fast_choice.py).
FP8_FAST_CONFIGS: list[GemmConfig] = [
    GemmConfig("fp8fast_pp_128x192x128_c2", 128, 192, 128, 2, 1, True, True),
    GemmConfig("fp8fast_pp_128x128x128_c1", 128, 128, 128, 1, 1, True, True),
]

# The large accurate fp8 tile promoting every k-tile (128 of K, CUTLASS's default): never picked,
# kept so that the promotion interval's speed and error can be measured side by side
# (benchmarks/bench_fp8.py --configs, dev/probes_py/fp8_accumulation_error.py) and for a user who
# wants the shortest partial sums (OverlapConfig(gemm_config=...)). Appended last so that the
# other rows' indices stay put.
FP8_PROMOTION_CONFIGS: list[GemmConfig] = [
    GemmConfig("fp8_coop_128x192x128_c2_p1", 128, 192, 128, 2, 1, False),
]

# Candidates that the library's rules never pick (SelectGemmConfig and fo_jax/_fp8_fast_choice.py
# name their rows); a table's fitted fp8 model may (fo_jax/_gemm_choice.py, select_fp8_config):
# compiled so that benchmarks/bench_gemm_sweep.py --dtype float8_e4m3fn --configs all times them
# against XLA's fp8 dot, which runs 128x160 tiles more often than any other on one H200 (the
# kernel names of benchmarks/results/gemm_sweep_h200_2026-11-30_75af5c9_fp8.jsonl). With a
# K-major weight N = 160 keeps the 128-byte swizzle (the 16-bit ping-pong 128x160 took a 64-byte
# one on its N-major B), and its wgmma is 64x160 (CuTe's extended shapes, _kernel_file). The
# accurate tile holds 2 x 80 accumulators per thread, under the spill line above. Appended last
# so that the other rows' indices stay put.
FP8_CANDIDATE_CONFIGS: list[GemmConfig] = [
    GemmConfig("fp8_coop_128x160x128_c2", 128, 160, 128, 2, 1, False, promotion_k_tiles=2),
    GemmConfig("fp8fast_pp_128x160x128_c2", 128, 160, 128, 2, 1, True, True),
]
# Twins of the two accurate fp8 rows that the overlaps use most, with CUTLASS's mma(), which
# zeroes both accumulators at every tile's start and adds the first interval's sums into zeros
# (fp8_promoting_mainloop.cuh); and cooperative 128x192 with fo_jax's mma() in CUTLASS's order of
# release and promotion, the order that made cooperative 128x128 as fast as CUTLASS's loop at
# long K (its row above) but that slows 128x192 (docs/gemm_performance.md, "The order of release
# and promotion"). Never picked, kept so that each loop can be timed beside its row
# (benchmarks/bench_gemm_sweep.py --configs, dev/mma_twin_report.py) and their outputs compared
# (tests/gpu/gemm/test_fp8_gpu.py). Appended last so that the other rows' indices stay put.
FP8_MMA_CONFIGS: list[GemmConfig] = [
    GemmConfig("fp8_coop_128x192x128_c2_cutlass_mma", 128, 192, 128, 2, 1, False,
               promotion_k_tiles=2, epi_stages_d=3, cutlass_mma=True),
    GemmConfig("fp8_coop_128x128x128_c1_cutlass_mma", 128, 128, 128, 1, 1, False,
               promotion_k_tiles=2, cutlass_mma=True),
    GemmConfig("fp8_coop_128x192x128_c2_late_release", 128, 192, 128, 2, 1, False,
               promotion_k_tiles=2, epi_stages_d=3, late_release=True),
]
# {twin: the row it copies}: a twin is named after its row and the MMA loop it takes.
MMA_TWIN_SUFFIXES = ("_cutlass_mma", "_late_release")
MMA_TWINS: dict[str, str] = {
    c.name: next(c.name.removesuffix(s) for s in MMA_TWIN_SUFFIXES if c.name.endswith(s))
    for c in FP8_MMA_CONFIGS}
# Rows that no choice picks: kept to be measured (dev/fit_gemm_table.py leaves them out).
MEASURE_ONLY_CONFIGS: list[GemmConfig] = FP8_PROMOTION_CONFIGS + FP8_MMA_CONFIGS
FP8_NAMES = {cfg.name for cfg in FP8_CONFIGS + FP8_FAST_CONFIGS + FP8_PROMOTION_CONFIGS
             + FP8_CANDIDATE_CONFIGS + FP8_MMA_CONFIGS}
TABLE: list[GemmConfig] = (CONFIGS + FP8_CONFIGS + FP8_FAST_CONFIGS + FP8_PROMOTION_CONFIGS
                           + FP8_CANDIDATE_CONFIGS + FP8_MMA_CONFIGS)

# Configs that also get a kernel with a source (D = A @ B + C; SignalingGemmArgs' addend): the
# copy-engine reduce-scatter's own band adds a received band in the GEMM's epilogue. Only the
# config the copy-engine shapes use (the source costs shared memory and a build minute each).
SOURCE_CONFIGS = {"pp_128x192x64_c2"}

# Configs that also get a consumer kernel (SignalingGemmArgs' wait_flags: A's bands arrive from
# other GPUs, the all-gather feeding the GEMM): the large tile the TP shapes use and the small one
# (fewer tiles than two waves; bands of any multiple of 128 rows).
# The fp8 rows' two cooperative tiles serve the fp8 all-gather (its rows need the consumer too).
# The fast-accumulation rows have it too (fo_jax/_plan.py's consumer_config_index picks them
# under OverlapConfig.fp8_fast_accumulation).
CONSUMER_CONFIGS = {"pp_128x192x64_c2", "pp_128x128x64_c1",
                    "fp8_coop_128x192x128_c2", "fp8_coop_128x128x128_c1",
                    "fp8fast_pp_128x192x128_c2", "fp8fast_pp_128x128x128_c1"}

DTYPES = {"bf16": "cutlass::bfloat16_t", "f16": "cutlass::half_t", "e4m3": "cutlass::float_e4m3_t"}
# D's type where it is not the input's (a template argument after kSource and kConsumer).
OUT_TYPE = {"e4m3": "cutlass::bfloat16_t"}


def _dtypes(cfg: GemmConfig) -> tuple:
    """The operand dtypes a row has kernels for."""
    return ("e4m3",) if cfg.name in FP8_NAMES else ("bf16", "f16")

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "generated"
GENERATOR = "csrc/kernels/gemm_configs.py"


def _symbol(cfg: GemmConfig, dtype: str) -> str:
    return f"{cfg.name}_{dtype}"


# Kernel kinds: "" the plain kernel (every config), "Source" the one with a source, "Consumer"
# the one that waits for A's bands. Per kind: what the file says it is, its template arguments
# kSource and kConsumer, and the configs that have it (None: all).
KINDS = {
    "": ("", ("false", "false"), None),
    "Source": (" with a source (addend)", ("true", "false"), SOURCE_CONFIGS),
    "Consumer": (" consumer (waits for A's bands)", ("false", "true"), CONSUMER_CONFIGS),
}


def _kinds(cfg: GemmConfig, dtype: str) -> tuple:
    if dtype not in _dtypes(cfg):
        return ()
    return tuple(k for k, (_, _, names) in KINDS.items() if names is None or cfg.name in names)


def _kernel_file(cfg: GemmConfig, dtype: str, kind: str) -> str:
    sym = _symbol(cfg, dtype)
    pp = "true" if cfg.pingpong else "false"
    what, flags, _ = KINDS[kind]
    # Template arguments after kPingpong, with the defaults they may leave out at the end.
    args = list(flags)
    defaults = ["false", "false"]
    args.append(OUT_TYPE.get(dtype, DTYPES[dtype]))
    defaults.append(DTYPES[dtype])
    if dtype in OUT_TYPE:
        what += ", bf16 out, scaled"
    args.append("true" if cfg.fast_accum else "false")
    defaults.append("false")
    if cfg.fast_accum:
        what += ", fast accumulation"
    args.append(str(cfg.promotion_k_tiles))
    defaults.append("1")
    if cfg.promotion_k_tiles != 1:
        what += f", promotion every {cfg.promotion_k_tiles} k-tiles"
    args.append(str(cfg.epi_stages_d))
    defaults.append("0")
    if cfg.epi_stages_d:
        what += f", {cfg.epi_stages_d} stores in flight"
    args.append("true" if cfg.cutlass_mma else "false")
    defaults.append("false")
    if cfg.cutlass_mma:
        what += ", CUTLASS's mma()"
    args.append("true" if cfg.late_release else "false")
    defaults.append("false")
    if cfg.late_release:
        what += ", released after the promotion"
    while args and args[-1] == defaults[len(args) - 1]:
        args.pop()
    src = "".join(", " + a for a in args)
    # CuTe's wgmma selector offers an N that is not a multiple of 64 (e.g. 64x160) only with
    # CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED; without it a 160-wide tile runs five 64x32 wgmmas,
    # each reading A from shared memory again. Defined only where such a tile needs it: the
    # extended shapes are a large header, and the other tiles select the same wgmma either way.
    extended = ("// A tile width that is not a multiple of 64: its wgmma is an extended shape.\n"
                "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED\n"
                if cfg.tile_n % 64 else "")
    return f"""// Generated by {GENERATOR}; do not edit (edit the table there and rerun it).
// Signaling GEMM instantiation: {cfg.name}, {dtype}{what}.
{extended}#include "../signaling_gemm_kernel.cuh"

namespace fo_jax::detail {{

using Cfg{kind}_{sym} = GemmKernelConfig<{DTYPES[dtype]}, {cfg.tile_m}, {cfg.tile_n}, {cfg.tile_k},
                                   {cfg.cluster_m}, {cfg.cluster_n}, {pp}{src}>;

cudaError_t RunGemm{kind}_{sym}(const GemmRun& run, cudaStream_t stream, std::string* error) {{
  return RunGemmImpl<Cfg{kind}_{sym}>(run, stream, error);
}}

cudaError_t LoadGemm{kind}_{sym}(int device, std::string* error) {{
  return LoadGemmImpl<Cfg{kind}_{sym}>(device, error);
}}

}}  // namespace fo_jax::detail
"""


def _table_file() -> str:
    lines = [
        f"// Generated by {GENERATOR}; do not edit (edit the table there and rerun it).",
        "// Config table and dispatch arrays; included by signaling_gemm.cu only.",
        "",
        "namespace fo_jax::detail {",
        "",
    ]
    for cfg in TABLE:
        for dtype in DTYPES:
            sym = _symbol(cfg, dtype)
            for kind in _kinds(cfg, dtype):
                lines.append(
                    f"cudaError_t RunGemm{kind}_{sym}(const GemmRun& run, cudaStream_t stream, "
                    "std::string* error);"
                )
                lines.append(f"cudaError_t LoadGemm{kind}_{sym}(int device, std::string* error);")
    lines += ["", "constexpr GemmTileConfig kGemmConfigs[] = {"]
    for cfg in TABLE:
        pp = "true" if cfg.pingpong else "false"
        fast = "true" if cfg.fast_accum else "false"
        lines.append(
            f'    {{"{cfg.name}", {cfg.tile_m}, {cfg.tile_n}, {cfg.tile_k}, '
            f"{cfg.cluster_m}, {cfg.cluster_n}, {pp}, {fast}, {cfg.promotion_k_tiles}}},"
        )
    lines += ["};", ""]
    for dtype in DTYPES:
        for kind, (what, _, _) in KINDS.items():
            if kind:
                what = what.strip()
                lines.append(f"// {what[0].upper()}{what[1:]} (nullptr: this config has none).")
            for fn, ret in (("Run", "RunGemmFn"), ("Load", "LoadGemmFn")):
                lines.append(f"constexpr {ret} k{fn}Gemm{kind}_{dtype}[] = {{")
                lines += [f"    &{fn}Gemm{kind}_{_symbol(cfg, dtype)},"
                          if kind in _kinds(cfg, dtype) else "    nullptr," for cfg in TABLE]
                lines.append("};")
        lines.append("")
    lines += ["}  // namespace fo_jax::detail", ""]
    return "\n".join(lines)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    wanted = set()
    for cfg in TABLE:
        for dtype in DTYPES:
            for kind in _kinds(cfg, dtype):
                path = OUT / f"gemm_{_symbol(cfg, dtype)}{'_' + kind.lower() if kind else ''}.cu"
                wanted.add(path.name)
                text = _kernel_file(cfg, dtype, kind)
                if not path.exists() or path.read_text() != text:
                    path.write_text(text)
    for stale in OUT.glob("gemm_*.cu"):
        if stale.name not in wanted:
            stale.unlink()
    table = OUT / "gemm_config_table.inc"
    text = _table_file()
    if not table.exists() or table.read_text() != text:
        table.write_text(text)


if __name__ == "__main__":
    main()
