#!/usr/bin/env bash
# Runs on a lent GPU machine, from the repo root: two builds of the CUDA library side by side.
# Installs this tree twice, against LIB_A and LIB_B (static libraries built here by
# dev/lease/build_cuda_lib.sh and carried, e.g. .devbuild/ab/lib_<commit>.a), then runs
# dev/probes_py/timeline_probe.py (per-call handler and device phases) and bench_overlap.py for each,
# alternating A B A B in separate processes. Knobs: LIB_A, LIB_B, TAG_A, TAG_B, FO_JAX_COMMIT,
# SHAPES, COLLS (bench_overlap.py), BATCHES, PROBE_SHAPE (timeline_probe.py), ROUNDS (pairs,
# default 2).
# Output: $OUT/lib_ab.log and the probes' files under $OUT/{probe,bench}_<side>_<round>.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: "${FO_JAX_COMMIT:?}" "${LIB_A:?}" "${LIB_B:?}"
R=$PWD
for side in a b; do
  lib=$LIB_A; [[ $side == b ]] && lib=$LIB_B
  rm -rf "/tmp/site_$side"
  python3 -m pip install -q --no-build-isolation --no-deps --target "/tmp/site_$side" \
    -C cmake.define.FO_JAX_PREBUILT_CUDA_LIB="$R/$lib" . > "/tmp/install_$side.log" 2>&1 \
    || { tail -30 "/tmp/install_$side.log"; exit 1; }
done
cd /tmp
log=$OUT/lib_ab.log
for i in $(seq "${ROUNDS:-2}"); do
  for side in a b; do
    tag=${TAG_A:-a}; [[ $side == b ]] && tag=${TAG_B:-b}
    echo "== round $i: $side ($tag)" | tee -a "$log"
    mkdir -p "$OUT/probe_${side}_$i" "$OUT/bench_${side}_$i"
    PYTHONPATH=/tmp/site_$side timeout 200 python3 "$R/dev/probes_py/timeline_probe.py" \
      --out "$OUT/probe_${side}_$i" --batches "${BATCHES:-8}" --tag "$tag" \
      --shape "${PROBE_SHAPE:-8192x8192x2048}" >> "$log" 2>&1
    PYTHONPATH=/tmp/site_$side timeout 200 python3 "$R/benchmarks/bench_overlap.py" \
      --out "$OUT/bench_${side}_$i" ${COLLS:+--collectives $COLLS} ${SHAPES:+--shapes $SHAPES} \
      >> "$log" 2>&1
    grep -h "third" "$log" | tail -4 | cut -c1-330
    grep -hE "\| fo_jax \| |jax\.baseline" "$OUT/bench_${side}_$i"/*.md
  done
done
