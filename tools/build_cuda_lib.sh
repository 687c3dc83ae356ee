#!/usr/bin/env bash
# Developer helper: builds csrc/ into .devbuild/libfo_jax_cuda.a here (nvcc, no GPU needed) so a
# GPU machine only compiles the small nanobind module (its Python differs from this machine's):
#   pip install --no-build-isolation -C cmake.define.FO_JAX_PREBUILT_CUDA_LIB=$PWD/.devbuild/libfo_jax_cuda.a .
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B .devbuild/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v python3)" > .devbuild/cmake-configure.log
ninja -C .devbuild/cmake -j "${JOBS:-2}" fo_jax_cuda 2>&1 | grep -Ev "^\[" || true
cp .devbuild/cmake/libfo_jax_cuda.a .devbuild/libfo_jax_cuda.a
ls -la .devbuild/libfo_jax_cuda.a
