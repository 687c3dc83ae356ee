#!/usr/bin/env bash
# Diagnostic builds of one GEMM kernel for signal_cost_probe: each variant weakens one step of
# the cooperative signal (docs/performance.md, "fp8": what the ~0.3 us per signal of the
# cooperative fp8 kernel is), so the variants are wrong as a library (their signals may come
# before the data) and exist only to be timed. Each is .devbuild/variants/signal_cost_probe_NAME:
# the probe linked with the objects of build_gemm_selftest.sh (run that first), the one kernel
# recompiled from a copy of csrc/ with the variant's edit. `base` is the unedited kernel.
# Usage: dev/lease/build_signal_variants.sh [KERNEL]   (default: the fp8 cooperative 128x192)
# On the GPU machine: for v in .devbuild/variants/signal_cost_probe_*; do
#                       $v --config fp8_coop_128x192x128_c2; done
set -euo pipefail
cd "$(dirname "$0")/../.."
KERNEL=${1:-gemm_fp8_coop_128x192x128_c2_e4m3}
CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$(python3 -c 'import cutlass_library as c, os
print(os.path.join(os.path.dirname(c.__file__), "source", "include"))')}
OBJ=.devbuild/obj
OUTDIR=.devbuild/variants
for f in "$OBJ/main_signal_cost_probe.o" "$OBJ/signaling_gemm.o" "$OBJ/$KERNEL.o"; do
  [[ -f $f ]] || { echo "missing $f: run dev/lease/build_gemm_selftest.sh first"; exit 1; }
done
HEADER=csrc/kernels/signaling_gemm_kernel.cuh
# name | the source line's text | its replacement (one line of HEADER, which must hold it once)
VARIANTS=(
  'base||'
  'readwait|cp.async.bulk.wait_group 0;" ::: "memory");|cp.async.bulk.wait_group.read 0;" ::: "memory");'
  'nofence|asm volatile("fence.proxy.async.global;" ::: "memory");|/* no proxy fence */'
  'relaxed|@p red.release.gpu.global.add.u32|@p red.relaxed.gpu.global.add.u32'
)
mkdir -p "$OUTDIR"
others=$(ls "$OBJ"/gemm_*.o | grep -v "/$KERNEL.o$")
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name from to <<< "$v"
  src="$OUTDIR/$name/csrc"
  rm -rf "$OUTDIR/$name" && mkdir -p "$OUTDIR/$name" && cp -r csrc "$src"
  if [[ -n $from ]]; then
    FROM=$from TO=$to python3 - "$src/kernels/signaling_gemm_kernel.cuh" <<'EOF'
import os, sys
path, old, new = sys.argv[1], os.environ["FROM"], os.environ["TO"]
text = open(path).read()
# The first occurrence from flush_signal() on: the cooperative flush's wait or fence, or the add
# in signal(), which follows it.
start = text.index("void flush_signal(")
at = text.find(old, start)
if at < 0:
    sys.exit(f"{old!r} not in {path} after flush_signal()")
open(path, "w").write(text[:at] + new + text[at + len(old):])
EOF
  fi
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3 \
    -I"$src" -I"$CUTLASS_INCLUDE" -c "$src/kernels/generated/$KERNEL.cu" -o "$OUTDIR/$name/$KERNEL.o"
  nvcc -gencode=arch=compute_90a,code=sm_90a -o "$OUTDIR/signal_cost_probe_$name" \
    "$OBJ/main_signal_cost_probe.o" "$OBJ/signaling_gemm.o" $others "$OUTDIR/$name/$KERNEL.o" \
    -cudart static -ldl
  echo "built $OUTDIR/signal_cost_probe_$name"
done
