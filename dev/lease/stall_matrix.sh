#!/usr/bin/env bash
# Diagnostic (device machine, after `dev/lease/gpu_run.sh info` installed fo_jax in /tmp/site): the
# overlap test file up to and including the 1000-calls tests, RUNS times per environment
# variant, each run in its own process with the stall watchdog armed (a stall prints the Python
# stacks and each GPU's fo_jax state, then ends the process). One summary line per run; logs in
# $OUT/stall_<variant>_<i>.log. It separates the causes of a multi-GPU stall (docs/troubleshooting.md,
# 'Hardware queues'): does it need XLA's per-call transfers (test_thousand_back_to_back_calls
# [placed] vs [resharded]), does it go away with more hardware queues
# (CUDA_DEVICE_MAX_CONNECTIONS=32) or with the flag waits in kernels (spin)? `import fo_jax` sets
# 32 itself when unset (default); conn8 is the CUDA default that stalled.
# Usage: OUT=... [RUNS=3] [VARIANTS="default conn8"] bash dev/lease/stall_matrix.sh (also conn32,
# conn1, spin)
set -uo pipefail
R=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 FO_JAX_REQUIRE_GPU=1
export FO_JAX_TEST_STALL_S=${FO_JAX_TEST_STALL_S:-25}
cd /tmp
declare -A envs=(
  [default]=""
  [conn32]="CUDA_DEVICE_MAX_CONNECTIONS=32"
  [conn8]="CUDA_DEVICE_MAX_CONNECTIONS=8"
  [conn1]="CUDA_DEVICE_MAX_CONNECTIONS=1"
  # Every flag wait of fo_jax as a 1-thread spin kernel instead of cuStreamWaitValue32 (the
  # queue probe: the spinning kernel's stream successor holds a shared queue just the same).
  [spin]="FO_JAX_SPIN_WAIT=1"
)
# The tests before the 1000-calls ones (the stall needs them: never seen in the test alone).
select="not async and not mesh and not process and not xla_coll and not unusable"
for v in ${VARIANTS:-default conn8}; do
  echo "$v: $(env ${envs[$v]} python3 -c 'import fo_jax, jax
from fo_jax import _hw_queues
jax.devices()
print(_hw_queues.status())' 2>&1 | tail -1)"
  for i in $(seq 1 "${RUNS:-3}"); do
    log="$OUT/stall_${v}_$i.log"
    env ${envs[$v]} timeout 200 python3 -m pytest -q -rs --tb=short --timeout 300 \
      -p no:cacheprovider -c "$R/pyproject.toml" "$R/tests/gpu/overlap/test_overlap_gpu.py" -k "$select" \
      > "$log" 2>&1
    rc=$?
    echo "$v run $i: rc=$rc $(grep -m1 -oE 'STALL after [0-9]+ s: .*|[0-9]+ passed.*' "$log")"
    grep "state: GPU" "$log" | grep -v "no copy-engine" | cut -c1-260
  done
done
