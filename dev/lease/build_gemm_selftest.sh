#!/usr/bin/env bash
# Builds the GEMM probes of dev/probes against the kernels of csrc/kernels only (no comm, no NCCL),
# with static cudart, for running on the GPU machine: .devbuild/gemm_selftest (the signaling GEMM
# self-test), .devbuild/gemm_probe (fo_jax vs stock CUTLASS vs cuBLASLt timing), both of which
# dlopen cuBLAS, and .devbuild/signal_cost_probe (what the signals cost, per group count). The
# same three are CMake targets with -DFO_JAX_BUILD_DEV=ON (dev/CMakeLists.txt); this script
# compiles only the GEMM kernels they need, so it is faster from scratch.
# Usage: dev/lease/build_gemm_selftest.sh [-j JOBS]   (CUTLASS_INCLUDE overrides the header path)
#        TOOLS=signal_cost_probe dev/lease/build_gemm_selftest.sh   (only the tools named; the
#        signal probe alone needs no cuBLAS headers, so it builds where the wheel is missing)
set -euo pipefail
cd "$(dirname "$0")/../.."
JOBS=2
if [[ "${1:-}" == "-j" ]]; then JOBS="$2"; fi
NVCC=${NVCC:-nvcc}
# CUTLASS headers from the nvidia-cutlass wheel; cuBLAS headers (types only: the tools
# dlopen libcublas) from the nvidia-cublas wheel (pip install nvidia-cublas).
CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$(python3 -c 'import cutlass_library as c, os
print(os.path.join(os.path.dirname(c.__file__), "source", "include"))')}
TOOLS=${TOOLS:-gemm_selftest gemm_probe signal_cost_probe}
CUBLAS_FLAGS=()  # the signal probe includes no cuBLAS header
if [[ " $TOOLS " == *" gemm_selftest "* || " $TOOLS " == *" gemm_probe "* ]]; then
  CUBLAS_INCLUDE=${CUBLAS_INCLUDE:-$(python3 -c 'import nvidia, os
p = [os.path.join(x, "cu13", "include") for x in nvidia.__path__]
print(next(x for x in p if os.path.exists(os.path.join(x, "cublasLt.h"))))')}
  CUBLAS_FLAGS=(-I"$CUBLAS_INCLUDE")
fi
FLAGS=(-std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3
       -Icsrc -I"$CUTLASS_INCLUDE" -Xptxas=-warn-spills)
OBJ=.devbuild/obj
mkdir -p "$OBJ"
python3 csrc/kernels/gemm_configs.py
# Drop objects of configs no longer in the table.
for o in "$OBJ"/gemm_*.o; do
  [[ -e "$o" ]] || continue
  b=$(basename "${o%.o}")
  [[ -f "csrc/kernels/generated/$b.cu" ]] || rm -f "$o" "$o.log"
done
SRCS=(csrc/kernels/signaling_gemm.cu csrc/kernels/generated/gemm_*.cu)
compile() {
  local src=$1 obj=$OBJ/$(basename "${1%.cu}").o
  local newer=0 dep
  for dep in "$src" csrc/kernels/*.cuh csrc/kernels/*.h csrc/kernels/generated/*.inc; do [[ "$dep" -nt "$obj" ]] && newer=1; done
  if [[ ! -f "$obj" || $newer == 1 ]]; then
    "$NVCC" "${FLAGS[@]}" -c "$src" -o "$obj" 2>&1 | tee "$obj.log" | grep -E "error|warning|C7510" || true
    [[ -f "$obj" && "$obj" -nt "$src" ]] || { echo "compile failed: $src"; cat "$obj.log"; return 1; }
  fi
}
pids=()
for src in "${SRCS[@]}"; do
  compile "$src" &
  pids+=($!)
  while (( $(jobs -rp | wc -l) >= JOBS )); do sleep 1; done
done
for p in "${pids[@]}"; do wait "$p"; done
for tool in $TOOLS; do
  "$NVCC" "${FLAGS[@]}" "${CUBLAS_FLAGS[@]}" -c "dev/probes/$tool.cu" -o "$OBJ/main_$tool.o"
  "$NVCC" -gencode=arch=compute_90a,code=sm_90a -o ".devbuild/$tool" "$OBJ/main_$tool.o" \
    "$OBJ"/signaling_gemm.o "$OBJ"/gemm_*.o -cudart static -ldl
  echo "built .devbuild/$tool"
done
