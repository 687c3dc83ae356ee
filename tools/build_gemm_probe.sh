#!/usr/bin/env bash
# Builds the GEMM diagnostic csrc/tools/gemm_probe.cu into .devbuild/gemm_probe (static cudart,
# cuBLASLt loaded with dlopen at run time). Reuses the kernel objects of build_gemm_selftest.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build_gemm_selftest.sh "$@"
CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$(python3 -c 'import cutlass_library as c, os
print(os.path.join(os.path.dirname(c.__file__), "source", "include"))')}
CUBLAS_INCLUDE=${CUBLAS_INCLUDE:-$(python3 -c 'import nvidia, os
p = [os.path.join(x, "cu13", "include") for x in nvidia.__path__]
print(next(x for x in p if os.path.exists(os.path.join(x, "cublasLt.h"))))')}
FLAGS=(-std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3
       -I"$CUTLASS_INCLUDE" -I"$CUBLAS_INCLUDE" -Xptxas=-warn-spills)
OBJ=.devbuild/obj
nvcc "${FLAGS[@]}" -c csrc/tools/gemm_probe.cu -o "$OBJ/probe_main.o" 2>&1 | grep -E "error|warning|C7510" || true
nvcc -gencode=arch=compute_90a,code=sm_90a -o .devbuild/gemm_probe "$OBJ"/probe_main.o \
  "$OBJ"/signaling_gemm.o "$OBJ"/gemm_*.o -cudart static -ldl
echo "built .devbuild/gemm_probe"
