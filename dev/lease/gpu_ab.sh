#!/usr/bin/env bash
# Runs on a lent GPU machine: bench_overlap.py for two builds of fo_jax on the same machine in
# one call, alternating A B A B, so a change can be compared against the code before it when
# the two cannot be switched inside one process. B is this tree (with the carried
# .devbuild/libfo_jax_kernels.a); A is an older tree carried in .devbuild/old (made here with
#   git archive <commit> fo_jax csrc CMakeLists.txt pyproject.toml README.md | tar -x -C .devbuild/old
# and its own library built into .devbuild/old/libfo_jax_kernels.a). Knobs: FO_JAX_COMMIT (this
# tree), OLD_COMMIT, SHAPES, COLLS, ROUNDS (pairs, default 2). Results under $OUT/ab_*.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: "${FO_JAX_COMMIT:?}" "${OLD_COMMIT:?}"
R=$PWD
install() {  # $1: source tree, $2: its library, $3: target
  rm -rf "$3"
  python3 -m pip install -q --no-build-isolation --no-deps --target "$3" \
    -C cmake.define.FO_JAX_PREBUILT_CUDA_LIB="$2" "$1" > "/tmp/install_$(basename "$3").log" 2>&1 \
    || { tail -30 "/tmp/install_$(basename "$3").log"; exit 1; }
}
install "$R" "$R/.devbuild/libfo_jax_kernels.a" /tmp/site_b
install "$R/.devbuild/old" "$R/.devbuild/old/libfo_jax_kernels.a" /tmp/site_a
cd /tmp
for i in $(seq "${ROUNDS:-2}"); do
  for side in a b; do
    if [[ $side == a ]]; then commit=$OLD_COMMIT; else commit=$FO_JAX_COMMIT; fi
    echo "== pair $i: $side ($commit)"
    PYTHONPATH=/tmp/site_$side FO_JAX_COMMIT=$commit python3 "$R/benchmarks/bench_overlap.py" \
      --out "$OUT/ab_${side}_$i" ${COLLS:+--collectives $COLLS} ${SHAPES:+--shapes $SHAPES} \
      > "$OUT/ab_${side}_$i.log" 2>&1 || tail -20 "$OUT/ab_${side}_$i.log"
    grep -hE "\| fo_jax \| |jax\.baseline" "$OUT"/ab_${side}_$i/*.md || true
  done
done
