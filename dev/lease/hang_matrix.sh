#!/usr/bin/env bash
# Diagnostic (device machine, after `dev/lease/gpu_run.sh info` installed fo_jax in /tmp/site): the
# many-calls probe in the variants that separate the causes of a multi-GPU hang
# (docs/troubleshooting.md, 'Diagnosing a stall'), each in its own process, logs in $OUT/hang_<tag>.log. VARIANTS picks tags (default: the
# first five; a tag ending in _gdb attaches cuda-gdb on a stall).
set -uo pipefail
R=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
cd /tmp
probe="python3 $R/dev/probes_py/many_calls_probe.py"
both="reduce_scatter,all_reduce"
# Placed inputs and a GEMM long enough (per GPU 8192x8192x2048, ~0.4 ms) that the host runs
# ahead and work waits on peers; small host-bound calls (the GPUs often wait for a peer's copy
# that the peer's thread is still enqueueing: the window of the driver-lock deadlock,
# docs/performance.md, 'Copies as graph launches').
long_calls="$both 200 100 8192 8192 8192"
short_calls="$both 1000 50 2048 2048 2048"
disrupt="env PROBE_PLACED=1 PROBE_DISRUPT"  # "$disrupt=KIND [VAR=value ...] $probe ..."
declare -A cmd=(
  [base_reshard]="env PROBE_METHOD=baseline $probe $both 1000 1000"
  [ar_reshard]="$probe all_reduce 1000 1000"
  [rs_ar_placed]="env PROBE_PLACED=1 $probe $both 1000 1000"
  [nccl_reshard]="env FO_JAX_TRANSPORT=nccl $probe $both 1000 1000"
  [rs_ar_reshard]="$probe $both 1000 1000"
  [rs_ar_reshard_gdb]="$probe $both 1000 1000"
  # Deliberate disruptions with calls in flight.
  [newkernel_lazy_gdb]="$disrupt=newkernel $probe $long_calls"
  [newkernel_eager]="$disrupt=newkernel CUDA_MODULE_LOADING=EAGER $probe $long_calls"
  [unload_lazy]="$disrupt=unload $probe $long_calls"
  [unload_eager]="$disrupt=unload CUDA_MODULE_LOADING=EAGER $probe $long_calls"
  [globals_small]="$disrupt=globals $probe $short_calls"
  [globals_small_nccl]="$disrupt=globals FO_JAX_TRANSPORT=nccl $probe $short_calls"
  [globals_thread]="$disrupt=globals_thread $probe $both 5000 100 2048 2048 2048"
)
for tag in ${VARIANTS:-base_reshard ar_reshard rs_ar_placed nccl_reshard rs_ar_reshard_gdb}; do
  echo "--- $tag"
  gdb=0; [[ $tag == *_gdb ]] && gdb=1
  limit=${LIMIT:-100}; (( gdb )) && limit=240
  HANG_GDB=$gdb bash "$R/dev/lease/hang_probe.sh" "$OUT/hang_$tag.log" "$limit" ${cmd[$tag]}
done
