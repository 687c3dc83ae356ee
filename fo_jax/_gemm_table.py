"""GEMM choice table (fo_jax/_gemm_choice.py): not fitted yet.

Written by dev/fit_gemm_table.py from benchmarks/bench_gemm_sweep.py --configs all; do not edit
(rerun the script). Empty: fo_jax keeps the kernel library's tile rule and never hands a GEMM to
XLA.
"""

DEVICE = ""
SOURCE = ""
# {dtype: {config name: (a, b, b_avg, g)}}, us: coefficients of fo_jax/_gemm_choice.features.
MODEL: dict = {}
# {dtype: ((M, N, K, ms(xla.dot) / ms(fo_jax's chosen config)), ...)}, as measured.
XLA_POINTS: dict = {}
XLA_THRESHOLD = 0.98  # prefer XLA's dot where the estimated ratio is below this
