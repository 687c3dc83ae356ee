"""The tile configuration of an fp8 GEMM with fast accumulation (OverlapConfig.
fp8_fast_accumulation) where the GPU's table has no fitted fp8 model for the shape
(fo_jax/_gemm_choice.py, select_fp8_config): a wave model over the two compiled fast rows.

A persistent kernel's time is its waves (cluster tiles over the co-resident cluster slots,
rounded up: a last partial wave costs nearly a whole one) times the cost of one wave. A wave of
ping-pong 128x192 tiles (2x1 clusters) costs WAVE_COST_192 times a wave of ping-pong 128x128
tiles for 1.5x the work, measured on one H100 (docs/gemm_performance.md, "fp8"); the cheaper one is
the pick. The accurate fp8 rows have the same model in the kernel library (SelectGemmConfig,
csrc/kernels/signaling_gemm.cu).
"""

from __future__ import annotations

from typing import Sequence

from fo_jax import _gemm_choice

LARGE = "fp8fast_pp_128x192x128_c2"
SMALL = "fp8fast_pp_128x128x128_c1"
WAVE_COST_192 = 1.34


def select(rows: int, n: int, sm_budget: int, configs: Sequence[dict]) -> int:
    """Index into `configs` (the compiled table) of the fast-accumulation row for rows x n
    outputs on sm_budget SMs (GemmPlan's convention: 0 all, < 0 all but that many)."""
    names = [c["name"] for c in configs]
    if LARGE not in names or SMALL not in names:
        raise ValueError("OverlapConfig(fp8_fast_accumulation=True): the compiled CUDA module "
                         "has no fast-accumulation fp8 kernels; rebuild fo_jax "
                         "(csrc/kernels/gemm_configs.py, FP8_FAST_CONFIGS)")
    sms = _gemm_choice.resolve_sms(sm_budget, _gemm_choice.device_sms())
    large, small = configs[names.index(LARGE)], configs[names.index(SMALL)]
    waves_large = _gemm_choice.waves(large, rows, n, 1, sms)[2]
    waves_small = _gemm_choice.waves(small, rows, n, 1, sms)[2]
    return names.index(SMALL if waves_small <= WAVE_COST_192 * waves_large else LARGE)
