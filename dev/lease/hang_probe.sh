#!/usr/bin/env bash
# Diagnostic (device machine): runs one dev/probes_py/many_calls_probe.py command with its output in LOG;
# when the probe reports a stall ("STALLED <pid>", after its own dump), records the GPUs' load
# (nvidia-smi) and every host thread's native stack (cuda-gdb attached: the device image has no
# gdb) in LOG.stacks, then ends the probe. The whole command is killed after LIMIT_S seconds.
# HANG_GDB=0: no debugger (the probe's own dump only).
# Usage: dev/lease/hang_probe.sh LOG LIMIT_S python3 dev/probes_py/many_calls_probe.py ...
set -uo pipefail
log=$1 limit=$2; shift 2
gdb=${HANG_GDB:-1}
export PROBE_ATTACH_S=$(( gdb ? 120 : 0 ))
echo "=== $*" > "$log"
timeout -k 5 "$limit" "$@" >> "$log" 2>&1 &
runner=$!
while kill -0 "$runner" 2>/dev/null; do
  pid=$(grep -m1 -oE '^STALLED [0-9]+' "$log" | cut -d' ' -f2)
  if [[ -n "$pid" && $gdb == 1 ]]; then
    { nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
      timeout 100 cuda-gdb -q -batch -p "$pid" -ex "info threads" -ex "thread apply all bt 14" 2>&1
    } > "$log.stacks" 2>&1
    kill -9 "$pid" 2>/dev/null
    break
  fi
  sleep 1
done
wait "$runner"
rc=$?
echo "=== exit $rc" >> "$log"
tail -4 "$log"
exit 0
