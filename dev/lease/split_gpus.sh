#!/usr/bin/env bash
# One GPU per process (from the repo root on a lent multi-GPU machine, after gpu_suite.sh built
# the tree): gpu_suite.sh's single-GPU $STEPS (sweep, fp8-bench) once per GPU in parallel, GPU i
# (CUDA_VISIBLE_DEVICES=i) on the shapes in $SHAPES_i, so one lease times twice the shapes per
# call. Each process writes under a fresh folder of this run (/tmp/split.XXXXXX/g<i>, removed at
# the end: a second run at the same time, e.g. tests/cpu's test of this script, keeps its own);
# only its log (g<i>.log) and the files matching
# $KEEP (default '*.jsonl': a sweep's report is rebuilt from its rows with
# benchmarks/gemm_sweep_report.py) come back in $OUT, because a call returns at most 8 files.
#   SHAPES_0="MxNxK ..." SHAPES_1="MxNxK ..." STEPS=sweep \
#     SWEEP_ARGS="--dtype float8_e4m3fn --own" TAG=_fp8_small bash dev/lease/split_gpus.sh
# The shapes go to the sweep as --shapes (with --tag $TAG_g<i>) and to fp8-bench as --shapes.
# SKIP_BUILD=1 is implied: build first (gpu_suite.sh with STEPS=info), in the same call or an
# earlier one of the same lease. Other variables pass through to gpu_suite.sh (timeouts,
# FO_JAX_COMMIT: letters and digits only, since it names the result files).
set -uo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
KEEP=${KEEP:-*.jsonl}
gpus=()
for i in 0 1 2 3 4 5 6 7; do
  v="SHAPES_$i"
  [[ -n "${!v:-}" ]] && gpus+=("$i")
done
if [[ ${#gpus[@]} -eq 0 ]]; then echo "split_gpus.sh: set SHAPES_0, SHAPES_1, ..."; exit 2; fi
work=$(mktemp -d /tmp/split.XXXXXX)
echo "== work folder $work"
for i in "${gpus[@]}"; do
  v="SHAPES_$i"; shapes="${!v}"
  mkdir -p "$work/g$i"
  CUDA_VISIBLE_DEVICES=$i OUT="$work/g$i" SKIP_BUILD=1 \
    SWEEP_ARGS="${SWEEP_ARGS:-} --tag ${TAG:-}_g$i --shapes $shapes" \
    FP8_ARGS="${FP8_ARGS:-} --shapes $shapes" \
    bash "$here/gpu_suite.sh" > "$OUT/g$i.log" 2>&1 &
done
wait
n=0
for i in "${gpus[@]}"; do
  echo "== GPU $i"
  tail -6 "$OUT/g$i.log"
  # $KEEP is a glob: unquoted on purpose.
  for f in $work/g$i/$KEEP; do
    [[ -f "$f" ]] && cp "$f" "$OUT/" && n=$((n + 1))
  done
done
rm -rf "$work"
echo "== kept $n result files and ${#gpus[@]} logs in $OUT"
if (( n + ${#gpus[@]} > 8 )); then
  echo "WARNING: more than 8 files in \$OUT: a call returns at most 8; narrow KEEP"
fi
