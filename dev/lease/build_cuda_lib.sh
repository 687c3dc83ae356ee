#!/usr/bin/env bash
# Developer helper: builds csrc/kernels into .devbuild/libfo_jax_kernels.a here (nvcc, no GPU needed) so a
# GPU machine only compiles the small nanobind module (its Python differs from this machine's):
#   pip install --no-build-isolation -C cmake.define.FO_JAX_PREBUILT_CUDA_LIB=$PWD/.devbuild/libfo_jax_kernels.a .
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B .devbuild/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v python3)" > .devbuild/cmake-configure.log
# Ninja records no header dependencies for the .cu files here (nvcc's depfiles come back empty),
# so a changed header would leave stale kernel objects (a struct layout that no longer matches
# the rest of the library): after any header change, rebuild every .cu file.
if [[ -f .devbuild/libfo_jax_kernels.a ]] &&
   [[ -n "$(find csrc \( -name '*.h' -o -name '*.cuh' \) -newer .devbuild/libfo_jax_kernels.a)" ]]; then
  find csrc -name '*.cu' -exec touch {} +
fi
ninja -C .devbuild/cmake -j "${JOBS:-2}" fo_jax_kernels 2>&1 | grep -Ev "^\[" || true
cp .devbuild/cmake/libfo_jax_kernels.a .devbuild/libfo_jax_kernels.a
ls -la .devbuild/libfo_jax_kernels.a
