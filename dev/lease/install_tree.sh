# Sourced by the device-run scripts (gpu_suite.sh, multi_gpu_runs.sh) from the repo root on a lent
# GPU machine: the environment every run needs (no NVLink multicast), $OUT, $R and stamp; then,
# unless SKIP_BUILD is set, the carried wheels (.whl/) into /tmp/site and fo_jax built from this
# tree into /tmp/fo (pip, ~2.5 minutes on 16 cores; FO_JAX_COMMIT names the commit, the copied
# tree having no .git). Ends with PYTHONPATH pointing at both.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=$PWD
t0=$(date +%s); stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
if [[ -z "${SKIP_BUILD:-}" ]]; then
  # The pip logs stay in /tmp unless a step fails (a call returns at most 8 files from $OUT).
  logs=/tmp/fo_build_logs; rm -rf "$logs"; mkdir -p "$logs"
  stamp wheels
  rm -rf /tmp/site /tmp/fo
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$logs/wheels.log" 2>&1 \
    || { cp "$logs/wheels.log" "$OUT/"; tail -20 "$logs/wheels.log"; exit 1; }
  stamp build
  PYTHONPATH=/tmp/site python3 -m pip install -v --no-build-isolation --no-deps --target /tmp/fo \
    -C cmake.define.FO_JAX_COMMIT="${FO_JAX_COMMIT:-}" . > "$logs/install.log" 2>&1 \
    || { cp "$logs/install.log" "$OUT/"; tail -60 "$logs/install.log"; exit 1; }
  grep -iE "warning|error" "$logs/install.log" | grep -v -i deprecat | grep -v "Registers are spilled" \
    | head -20
elif [[ ! -d /tmp/fo/fo_jax ]]; then
  echo "SKIP_BUILD=1 but no install in /tmp/fo (the machine was released): run without it"; exit 1
fi
export PYTHONPATH=/tmp/fo:/tmp/site
