#!/usr/bin/env bash
# Dry run of multi_gpu_runs.sh's plumbing on a machine without GPUs (from the repo root, fo_jax
# installed): a stand-in nvidia-smi reports $NGPU (2) H200s, JAX gets as many host CPU devices,
# and every step runs with short limits. What it checks is the script, not fo_jax: each step must
# start its command and write its log and summary lines (the GPU steps then fail on
# FO_JAX_REQUIRE_GPU or --require-gpu, as they should without GPUs; train runs its tiny CPU model).
# Run it after any change to the device-run scripts: a lent multi-GPU machine may be gone by the
# second call. Output in $OUT (default /tmp/fo_jax_dry_run).
set -uo pipefail
NGPU=${NGPU:-2}; OUT=${OUT:-/tmp/fo_jax_dry_run}; BIN=$(mktemp -d)
rm -rf "$OUT"; mkdir -p /tmp/fo/fo_jax  # SKIP_BUILD=1 wants an install dir; the local one is used
cat > "$BIN/nvidia-smi" <<SMI
#!/usr/bin/env bash
for i in \$(seq 0 $((NGPU - 1))); do
  if [[ "\$*" == "-L" ]]; then echo "GPU \$i: NVIDIA H200 (UUID: GPU-dry-\$i)"
  else echo "NVIDIA H200, 143771 MiB, 0.0 (dry run)"; fi
done
SMI
chmod +x "$BIN/nvidia-smi"
PATH="$BIN:$PATH" OUT="$OUT" XLA_FLAGS="--xla_force_host_platform_device_count=$NGPU" \
  FO_JAX_COMMIT=dry SKIP_BUILD=1 TRAIN_REQUIRE= TRAIN_D_MODEL=256 TRAIN_STEPS=2 \
  OVERLAP_TESTS_TIMEOUT=120 BENCH_TIMEOUT=60 TRAIN_TIMEOUT=200 RELIABILITY_TIMEOUT=60 PROCESSES_TIMEOUT=60 \
  MULTIPROCESS_TIMEOUT=60 MULTIPROCESS_ARGS="--shapes 256x512x512" FP8_BENCH_TIMEOUT=60 \
  STEPS="${STEPS:-overlap-tests bench train processes reliability multiprocess fp8-bench}" \
  bash "$(dirname "${BASH_SOURCE[0]}")/multi_gpu_runs.sh"
rc=$?; rm -rf "$BIN"
# A step that could not start its command (rc 126/127) is the failure this run looks for.
if grep -qE "rc 12[67] " "$OUT"/summary_*.txt; then echo "DRY RUN FAILED: a step did not start"; exit 1; fi
echo "dry run: every step started (exit $rc); logs in $OUT"
