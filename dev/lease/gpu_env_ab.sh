#!/usr/bin/env bash
# Runs on a lent GPU machine, after dev/lease/gpu_run.sh has installed this tree into /tmp/site (run
# it first in the same command, e.g. with the `info` step): bench_overlap.py under two
# environments of the same build, alternating A B A B, each in its own process, so a planning
# override (FO_JAX_CE_PARTS, FO_JAX_CE_RING, ...) can be compared with the default side by
# side. Knobs: ENV_A, ENV_B (space-separated NAME=VALUE, may be empty), FO_JAX_COMMIT, SHAPES,
# COLLS, ROUNDS (pairs, default 2), LIMIT (seconds per run, default 150). Results: $OUT/envab_*.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: "${FO_JAX_COMMIT:?}"
R=$PWD
cd /tmp
for i in $(seq "${ROUNDS:-2}"); do
  for side in a b; do
    if [[ $side == a ]]; then envs=${ENV_A:-}; else envs=${ENV_B:-}; fi
    echo "== pair $i: $side (${envs:-default})"
    # shellcheck disable=SC2086
    env $envs timeout "${LIMIT:-150}" python3 "$R/benchmarks/bench_overlap.py" \
      --out "/tmp/envab_${side}_$i" ${COLLS:+--collectives $COLLS} ${SHAPES:+--shapes $SHAPES} \
      > "/tmp/envab_${side}_$i.log" 2>&1 || tail -20 "/tmp/envab_${side}_$i.log"
    { echo "## $side, pair $i: ${envs:-default}"; cat /tmp/envab_${side}_$i/*.md; echo; } \
      >> "$OUT/envab.md" 2>/dev/null
    grep -hE "\| fo_jax \| |jax\.baseline" /tmp/envab_${side}_$i/*.md || true
  done
done
