#!/usr/bin/env bash
# Runs on a lent GPU machine, from the repo root, after a gpu_suite.sh call of the same machine
# (its carried wheels in /tmp/site give CUTLASS's headers): one developer probe (dev/probes,
# $PROBE, default gemm_ring_probe) built from this tree (B) and from an older tree carried in
# .devbuild/old (A), each with its own kernel library (CMake with FO_JAX_BUILD_DEV=ON, ~2 minutes
# each on 16 cores), then run alternately A B A B ($ROUNDS pairs, default 2) with $PROBE_ARGS,
# so a kernel change is timed against the code before it on one GPU in one call. Make the old
# tree here with
#   git archive <commit> CMakeLists.txt cmake csrc dev fo_jax pyproject.toml README.md \
#     | tar -x -C .devbuild/old
# and carry .devbuild/old. Knobs: FO_JAX_COMMIT, OLD_COMMIT (for the log). Output:
# $OUT/probe_ab.log and each side's build log.
set -uo pipefail
SKIP_BUILD=1 source "$(dirname "${BASH_SOURCE[0]}")/install_tree.sh"
probe=${PROBE:-gemm_ring_probe}
log=$OUT/probe_ab.log
for side in a b; do
  tree=$R; [[ $side == a ]] && tree=$R/.devbuild/old
  stamp "build $probe ($side)"
  { cmake -S "$tree" -B "/tmp/probe_$side" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFO_JAX_BUILD_DEV=ON -DPython_EXECUTABLE="$(command -v python3)" \
    && ninja -C "/tmp/probe_$side" "$probe"; } > "$OUT/probe_build_$side.log" 2>&1 \
    || { tail -30 "$OUT/probe_build_$side.log"; exit 1; }
done
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
echo "A = ${OLD_COMMIT:-old tree}, B = ${FO_JAX_COMMIT:-this tree}, $(date -u +%F)" | tee -a "$log"
for i in $(seq "${ROUNDS:-2}"); do
  for side in a b; do
    stamp "round $i: $side" | tee -a "$log"
    timeout 120 "/tmp/probe_$side/dev/$probe" ${PROBE_ARGS:-} 2>&1 | tee -a "$log" | grep -E "timing|PASS|FAIL|HANG"
  done
done
stamp done
