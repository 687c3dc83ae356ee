#!/usr/bin/env bash
# Builds the signaling GEMM self-test (csrc/tools/gemm_selftest.cu + csrc/kernels) into
# .devbuild/gemm_selftest, with static cudart, for running on the GPU machine.
# Usage: tools/build_gemm_selftest.sh [-j JOBS]   (CUTLASS_INCLUDE overrides the header path)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=2
if [[ "${1:-}" == "-j" ]]; then JOBS="$2"; fi
NVCC=${NVCC:-nvcc}
CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))')}
CUBLAS_INCLUDE=${CUBLAS_INCLUDE:-$(python3 -c 'import nvidia, os; p=[os.path.join(x,"cu13","include") for x in nvidia.__path__]; print(next(x for x in p if os.path.exists(os.path.join(x,"cublas_api.h"))))')}
FLAGS=(-std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3
       -I"$CUTLASS_INCLUDE" -Xptxas=-warn-spills)
OBJ=.devbuild/obj
mkdir -p "$OBJ"
python3 csrc/kernels/gemm_configs.py
SRCS=(csrc/kernels/signaling_gemm.cu csrc/kernels/generated/gemm_*.cu)
compile() {
  local src=$1 obj=$OBJ/$(basename "${1%.cu}").o
  if [[ ! -f "$obj" || "$src" -nt "$obj" || csrc/kernels/signaling_gemm_kernel.cuh -nt "$obj" \
        || csrc/kernels/signaling_gemm.h -nt "$obj" ]]; then
    "$NVCC" "${FLAGS[@]}" -c "$src" -o "$obj" 2>&1 | tee "$obj.log" | grep -E "error|warning|C7510" || true
    [[ -f "$obj" && "$obj" -nt "$src" ]] || { echo "compile failed: $src"; cat "$obj.log"; return 1; }
  fi
}
export -f compile; export NVCC OBJ; export FLAGS_STR="${FLAGS[*]}"
pids=()
for src in "${SRCS[@]}"; do
  compile "$src" &
  pids+=($!)
  while (( $(jobs -rp | wc -l) >= JOBS )); do sleep 1; done
done
for p in "${pids[@]}"; do wait "$p"; done
"$NVCC" "${FLAGS[@]}" -I"$CUBLAS_INCLUDE" -c csrc/tools/gemm_selftest.cu -o "$OBJ/selftest_main.o"
"$NVCC" -gencode=arch=compute_90a,code=sm_90a -o .devbuild/gemm_selftest "$OBJ"/selftest_main.o \
  "$OBJ"/signaling_gemm.o "$OBJ"/gemm_*.o -cudart static -ldl
echo "built .devbuild/gemm_selftest"
