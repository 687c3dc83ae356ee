#!/usr/bin/env bash
# Device run (from the repo root on a lent GPU machine): install the carried wheels (.whl/: the
# nvidia-cutlass wheel for the build, flax and its pure-Python dependencies for the tests), build
# fo_jax from this tree (pip, ~2.5 minutes on 16 cores), then the steps named in $STEPS:
#   tests           the whole suite (README's test command) with FO_JAX_REQUIRE_GPU=1; $TEST_PATHS
#                   (default tests) splits it over calls, e.g. "tests/gpu tests/cpu/test_[a-f]*"
#   gemm-tests      only $TESTS (file names, searched under tests/)
#   info, bench     python -m fo_jax.info / python -m fo_jax.bench ($BENCH_ARGS)
#   bench-overlap   benchmarks/bench_overlap.py ($BENCH_ARGS)
#   consumer-bench  benchmarks/bench_consumer_gemm.py ($CONSUMER_ARGS, e.g. --dtypes float8_e4m3fn)
#   fp8-bench       benchmarks/bench_fp8.py ($FP8_ARGS)
#   sweep           benchmarks/bench_gemm_sweep.py ($SWEEP_ARGS)
#   signal-bench    benchmarks/bench_signal_overhead.py (the producer's counters, bf16 and fp8)
#   py-probe        dev/probes_py/$PROBE (its arguments: $PROBE_ARGS; $OUT is exported)
#   sass-check      dev/sass_mainloop_check.py on the installed CUDA module (cuobjdump from PATH
#                   or next to nvcc): every GEMM kernel's main loop in the uniform datapath
#   selftest, gemm-probe  the carried .devbuild/gemm_selftest ($SELFTEST_ARGS, default --quick) and
#                   .devbuild/gemm_probe ($PROBE_SHAPES: MxNxK ...), built here by
#                   dev/lease/build_gemm_selftest.sh (carry both); they dlopen the cuBLAS wheel's
#                   libcublasLt.so.13, whose folder goes on LD_LIBRARY_PATH
#   signal-probe    the carried .devbuild/signal_cost_probe ($SIGNAL_PROBE_ARGS: see its top), built
#                   by the same script
#   autotune-out    $OUT/xla_autotune.tar.xz: XLA's autotuning results of this machine's benchmark
#                   steps (below), to copy here over dev/lease/xla_autotune_h200.tar.xz
#   refit           dev/fit_gemm_table.py on $REFIT_SWEEPS (sweep files by name, from $OUT, e.g. the
#                   sweep step's, or benchmarks/results/): this GPU model's table and its report
#                   into $OUT, and the table over the install, so later steps run with it
# SKIP_BUILD=1 reuses the previous call's install on a machine still warm. Logs and results go to
# $OUT; FO_JAX_COMMIT names the commit (the copied tree has no .git).
# The environment, $OUT, $R, stamp, and the install (or SKIP_BUILD=1: the previous one).
source "$(dirname "${BASH_SOURCE[0]}")/install_tree.sh"
cd /tmp
# The benchmark steps (sweep, fp8-bench, signal-bench) keep XLA's autotuning results per fusion in
# one folder, so that a dot XLA autotuned once (in an earlier call of the lease, or in an earlier
# lease: dev/lease/xla_autotune_h200.tar.xz, as autotune-out returns it) is compiled with the
# same pick without autotuning again: XLA's autotuning is most of a sweep's time (up to 160 s a
# shape at the largest). XLA keys each result by the fusion and the GPU's description, so a
# result of another GPU model is not used. The kernels XLA runs are its own picks either way;
# the tests autotune as usual.
AUTOTUNE=/tmp/xla_autotune; mkdir -p "$AUTOTUNE"
[[ -f "$R/dev/lease/xla_autotune_h200.tar.xz" ]] \
  && tar -xJf "$R/dev/lease/xla_autotune_h200.tar.xz" -C /tmp --skip-old-files
echo "XLA autotuning results: $(find "$AUTOTUNE" -type f | wc -l) in $AUTOTUNE"
BENCH_XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=$AUTOTUNE"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, fo_jax; print('jax', jax.__version__, jax.devices(), 'cuda module', fo_jax.cuda_module_available(), fo_jax.__file__)"
for step in ${STEPS:-tests}; do
  stamp "$step"
  case "$step" in
    tests) FO_JAX_REQUIRE_GPU=1 timeout ${TEST_TIMEOUT:-900} python3 -m pytest -q -rs -p no:cacheprovider \
             --rootdir "$R" -c "$R/pyproject.toml" $(cd "$R"; for t in ${TEST_PATHS:-tests}; do echo "$R/$t"; done) 2>&1 \
             | tee "$OUT/tests_full${TEST_LOG_TAG:-}.log" | tail -40;;
    gemm-tests) FO_JAX_REQUIRE_GPU=1 timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -rs -p no:cacheprovider \
             --rootdir "$R" -c "$R/pyproject.toml" $(for t in ${TESTS:?}; do find "$R/tests" -name "$t"; done) 2>&1 \
             | tee "$OUT/tests_sel.log" | tail -40;;
    fp8-bench) XLA_FLAGS="$BENCH_XLA_FLAGS" timeout ${FP8_TIMEOUT:-300} python3 "$R/benchmarks/bench_fp8.py" --out "$OUT" ${FP8_ARGS:-} 2>&1 | tail -25;;
    consumer-bench) timeout ${CONSUMER_TIMEOUT:-200} python3 "$R/benchmarks/bench_consumer_gemm.py" --out "$OUT" \
                      ${CONSUMER_ARGS:-} 2>&1 | tail -20;;
    sweep) XLA_FLAGS="$BENCH_XLA_FLAGS" timeout ${SWEEP_TIMEOUT:-560} python3 "$R/benchmarks/bench_gemm_sweep.py" ${SWEEP_ARGS:-} --out "$OUT" 2>&1 | tail -30;;
    signal-bench) XLA_FLAGS="$BENCH_XLA_FLAGS" timeout ${SIGNAL_TIMEOUT:-300} python3 "$R/benchmarks/bench_signal_overhead.py" --out "$OUT" ${SIGNAL_ARGS:-} 2>&1 | tail -40;;
    py-probe) OUT="$OUT" timeout ${PROBE_TIMEOUT:-300} python3 "$R/dev/probes_py/${PROBE:?}" ${PROBE_ARGS:-} 2>&1 \
                | tee "$OUT/${PROBE%.py}.log" | tail -60;;
    refit) sweeps=()  # copied into the tree's results, so that the table's SOURCE names them there
           for f in ${REFIT_SWEEPS:?}; do
             [[ -f "$OUT/$f" ]] && cp "$OUT/$f" "$R/benchmarks/results/"
             sweeps+=("benchmarks/results/$f")
           done
           # The fit writes the table of the sweeps' GPU model into the tree and names it.
           (cd "$R" && python3 dev/fit_gemm_table.py "${sweeps[@]}" --report "$OUT/gemm_fit.md" \
              > /dev/null 2> "$OUT/refit.log")
           table=$(sed -n 's/^wrote //p' "$OUT/refit.log")
           if [[ -n "$table" ]]; then
             cp "$table" "$OUT/" && cp "$table" /tmp/fo/fo_jax/_gemm_tables/
             grep -A4 "In geomean" "$OUT/gemm_fit.md"
           else
             tail -20 "$OUT/refit.log"
           fi;;
    sass-check) so=$(python3 -c 'import glob, os, fo_jax; print(glob.glob(os.path.join(os.path.dirname(fo_jax.__file__), "_fo_jax_cuda*.so"))[0])')
                cuobjdump=$(command -v cuobjdump || echo "$(dirname "$(command -v nvcc)")/cuobjdump")
                python3 "$R/dev/sass_mainloop_check.py" "$so" --cuobjdump "$cuobjdump" 2>&1 \
                  | tee "$OUT/sass_check.log" | head -20;;
    selftest|gemm-probe)
           cublas=$(python3 -c 'import nvidia, glob, os
print(next(os.path.dirname(p) for d in nvidia.__path__
           for p in glob.glob(d + "/**/libcublasLt.so.13", recursive=True)))')
           if [[ $step == selftest ]]; then
             LD_LIBRARY_PATH="$cublas:${LD_LIBRARY_PATH:-}" timeout ${SELFTEST_TIMEOUT:-300} \
               "$R/.devbuild/gemm_selftest" ${SELFTEST_ARGS:---quick} 2>&1 | tee "$OUT/gemm_selftest.log" | tail -30
           else
             LD_LIBRARY_PATH="$cublas:${LD_LIBRARY_PATH:-}" timeout ${PROBE_TIMEOUT:-300} \
               "$R/.devbuild/gemm_probe" ${PROBE_SHAPES:-} 2>&1 | tee "$OUT/gemm_probe.log"
           fi;;
    signal-probe) timeout ${PROBE_TIMEOUT:-300} "$R/.devbuild/signal_cost_probe" ${SIGNAL_PROBE_ARGS:-} 2>&1 \
                    | tee -a "$OUT/signal_cost_probe.log";;
    info) python3 -m fo_jax.info 2>&1 | tee "$OUT/info.log";;
    autotune-out) tar -cJf "$OUT/xla_autotune.tar.xz" -C /tmp xla_autotune \
                    && echo "$(find "$AUTOTUNE" -type f | wc -l) results, $(du -h "$OUT/xla_autotune.tar.xz" | cut -f1)";;
    bench-overlap) timeout ${BENCH_TIMEOUT:-300} python3 "$R/benchmarks/bench_overlap.py" --out "$OUT" \
                     ${BENCH_ARGS:-} 2>&1 | tail -30;;
    bench) timeout ${BENCH_TIMEOUT:-300} python3 -m fo_jax.bench --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tail -40;;
    *) echo "unknown step $step";;
  esac
done
stamp done
