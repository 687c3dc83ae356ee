#!/usr/bin/env bash
# Diagnostic builds of one GEMM kernel for signal_cost_probe: each variant removes or weakens one
# step of the cooperative signal path (docs/gemm_performance.md, "The producer's signals": what
# the cooperative fp8 kernel's signals cost), so the variants are wrong as a library (their
# signals may come before the data, or not at all) and exist only to be timed. Each is
# .devbuild/variants/signal_cost_probe_NAME: the probe linked with the objects of
# build_gemm_selftest.sh (run that first), the one kernel recompiled from a copy of csrc/ with the
# variant's edits. `base` is the unedited kernel.
#   readwait   the stores' wait in the .read form (smem read, not writes complete)
#   nowait     no wait for the stores       nofence    no proxy fence after the wait
#   relaxed    the signal warp's add without release
#   nored      the signal warp takes each handoff but adds nothing          (*)
#   nohandoff  the consumers hand over only the CTA's last count            (*)
#   arith      the epilogue's group of a tile-row computed, not looked up (GroupCursor): right
#              only for the probe's equal groups (group_begin[i] = tiles_m * i / groups)
#   arith_nohandoff   both
# (*) counts are lost: run with --no-counter-check.
# Usage: dev/lease/build_signal_variants.sh [KERNEL [VARIANT...]]
#        (default: the fp8 cooperative 128x192, every variant)
# On the GPU machine: for v in .devbuild/variants/signal_cost_probe_*; do
#                       $v --config fp8_coop_128x192x128_c2 --no-counter-check; done
set -euo pipefail
cd "$(dirname "$0")/../.."
KERNEL=${1:-gemm_fp8_coop_128x192x128_c2_e4m3}
shift || true
NAMES=("$@")
if (( ${#NAMES[@]} == 0 )); then
  NAMES=(base readwait nowait nofence relaxed nored nohandoff arith arith_nohandoff)
fi
CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$(python3 -c 'import cutlass_library as c, os
print(os.path.join(os.path.dirname(c.__file__), "source", "include"))')}
OBJ=.devbuild/obj
OUTDIR=.devbuild/variants
for f in "$OBJ/main_signal_cost_probe.o" "$OBJ/signaling_gemm.o" "$OBJ/$KERNEL.o"; do
  [[ -f $f ]] || { echo "missing $f: run dev/lease/build_gemm_selftest.sh first"; exit 1; }
done
mkdir -p "$OUTDIR"
others=$(ls "$OBJ"/gemm_*.o | grep -v "/$KERNEL.o$")
for name in "${NAMES[@]}"; do
  src="$OUTDIR/$name/csrc"
  rm -rf "${OUTDIR:?}/$name" && mkdir -p "$OUTDIR/$name" && cp -r csrc "$src"
  python3 - "$name" "$src/kernels/signaling_gemm_kernel.cuh" <<'EOF'
import sys

# Each edit: (anchor, old, new): the first `old` after `anchor` becomes `new`.
WAIT = 'asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");'
ARITH = ("int group_of(int m_idx) {",
         "return group_cursor_.find(p_->group_begin, p_->num_groups, m_idx);",
         "return min(((m_idx + 1) * p_->num_groups - 1) / p_->tiles_m, p_->num_groups - 1);")
NOHANDOFF = ("void flush_signal(", "hand_over(pending_group_, pending_count_, last);",
             "if (last) hand_over(pending_group_, pending_count_, last);")
VARIANTS = {
    "base": [],
    "readwait": [("void flush_signal(", WAIT, WAIT.replace("wait_group", "wait_group.read"))],
    "nowait": [("void flush_signal(", WAIT, "")],
    "nofence": [("void flush_signal(", 'asm volatile("fence.proxy.async.global;" ::: "memory");',
                 "")],
    "relaxed": [("void signal(", "red.release.gpu", "red.relaxed.gpu")],
    "nored": [("void run_signal_warp(", "if (count > 0) signal(group, count);", "(void)group;")],
    "nohandoff": [NOHANDOFF],
    "arith": [ARITH],
    "arith_nohandoff": [ARITH, NOHANDOFF],
}
name, path = sys.argv[1], sys.argv[2]
if name not in VARIANTS:
    sys.exit(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
text = open(path).read()
for anchor, old, new in VARIANTS[name]:
    at = text.find(old, text.index(anchor))
    if at < 0:
        sys.exit(f"{old!r} not in {path} after {anchor!r}")
    text = text[:at] + new + text[at + len(old):]
open(path, "w").write(text)
EOF
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3 \
    -I"$src" -I"$CUTLASS_INCLUDE" -c "$src/kernels/generated/$KERNEL.cu" -o "$OUTDIR/$name/$KERNEL.o"
  nvcc -gencode=arch=compute_90a,code=sm_90a -o "$OUTDIR/signal_cost_probe_$name" \
    "$OBJ/main_signal_cost_probe.o" "$OBJ/signaling_gemm.o" $others "$OUTDIR/$name/$KERNEL.o" \
    -cudart static -ldl
  rm -rf "${OUTDIR:?}/$name"  # (the binary is what travels)
  echo "built $OUTDIR/signal_cost_probe_$name"
done
