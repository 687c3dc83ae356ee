#!/usr/bin/env bash
# Runs on a lent GPU machine (device tool), from the repo root: installs fo_jax against the
# carried .devbuild/libfo_jax_kernels.a (built here by dev/lease/build_cuda_lib.sh), then the named
# steps. Logs and result files go to $OUT. NVLink multicast stays off.
# Steps: info smoke test-gemm test-overlap test-autodiff train bench-gemm bench-overlap
#        bench-overlap-quick bench-overlap-sweep bench-cli tune diag-overlap selftest probe ce-probe
#        p2p-probe nvlink-probe ctx-lock-probe queue-probe
#        profile-gemm profile-overlap overlap-configs smi-start smi-stop (GPU clock/power sampling).
# Knobs (env): FO_JAX_COMMIT (required), SHAPES, COLLS, CONFIGS (G:SM:C[:GEMM_CONFIG] ...), TAG,
#        GEMM_SHAPES, CE_SHAPES (MxNxK ... for ce-probe and p2p-probe), CONNS and PROBE_ARGS
#        (queue-probe: CUDA_DEVICE_MAX_CONNECTIONS values; ';'-separated argument lists), FO_JAX_REQUIRE_GPU=0 (skip tests
#        needing more GPUs than present).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 FO_JAX_REQUIRE_GPU=${FO_JAX_REQUIRE_GPU:-1}  # 0: skip tests needing more GPUs
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: "${FO_JAX_COMMIT:?set FO_JAX_COMMIT (the working tree copy has no .git): result files record it}"
export FO_JAX_COMMIT
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
stamp install
# A warm machine keeps /tmp/site from the previous call, and `pip install --target` does not
# replace a package already there (it warns and skips): start empty, or the old build runs.
rm -rf /tmp/site
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
  -C cmake.define.FO_JAX_PREBUILT_CUDA_LIB="$PWD/.devbuild/libfo_jax_kernels.a" . \
  > /tmp/install.log 2>&1 || { tail -40 /tmp/install.log; exit 1; }
export PYTHONPATH=/tmp/site
if [[ -f .carry/tuning.json ]]; then  # a tuning cache from an earlier call (python -m fo_jax.tune)
  mkdir -p /tmp/cache/fo_jax && cp .carry/tuning.json /tmp/cache/fo_jax/tuning.json
fi
cd /tmp  # so that imports find the installed fo_jax, not the source tree (no .so there)
R=$OLDPWD
rc=0
# A probe of dev/probes (NAME.cu) -> /tmp/NAME, against the carried library and the
# NCCL wheel's headers and library.
build_probe() {
  local nccl
  nccl=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
  nvcc -std=c++17 -arch=sm_90a -I"$R/csrc" -I"$nccl/include" "$R/dev/probes/$1.cu" \
    "$R/.devbuild/libfo_jax_kernels.a" -L"$nccl/lib" -l:libnccl.so.2 -Xlinker -rpath,"$nccl/lib" \
    -o "/tmp/$1" 2>&1 | grep -v -i deprecat || true
}
for step in "$@"; do
  stamp "$step"
  case "$step" in
    info) nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv
          python3 -c "import jax, fo_jax; print(jax.__version__, jax.devices(), fo_jax.cuda_module_available())";;
    smoke) python3 -m pytest -q -rs -p no:cacheprovider -c "$R/pyproject.toml" "$R/tests/gpu/gemm/test_gpu_smoke.py" "$R/tests/cpu/test_package.py" 2>&1 | tee -a "$OUT/tests.log" | tail -5 || rc=1;;
    test-gemm) timeout 600 python3 -m pytest -q -x -rs -p no:cacheprovider -c "$R/pyproject.toml" "$R/tests/gpu/gemm/test_gemm_gpu.py" 2>&1 | tee -a "$OUT/tests.log" | tail -25 || rc=1;;
    test-autodiff) timeout 300 python3 -m pytest -q -x -rs --timeout 150 -p no:cacheprovider -c "$R/pyproject.toml" "$R/tests/gpu/overlap/test_autodiff_gpu.py" 2>&1 | tee -a "$OUT/tests.log" | tail -8 || rc=1;;
    train) for mesh in 1,4; do python3 "$R/benchmarks/train_tp_mlp.py" --dtype bfloat16 --mesh $mesh \
             --d-model 4096 --d-ff 16384 --batch 16 --seq 2048 --layers 2 --steps 10 \
             --out "$OUT/train_tp_mlp.jsonl" 2>&1 | tail -14 || rc=1; done;;
    test-overlap) timeout 560 python3 -m pytest -q -x -rs --timeout 150 -p no:cacheprovider -c "$R/pyproject.toml" "$R/tests/gpu/overlap/test_overlap_gpu.py" 2>&1 | tee -a "$OUT/tests.log" | tail -30 || rc=1;;
    bench-gemm) python3 "$R/benchmarks/bench_gemm.py" --out "$OUT" 2>&1 | tail -22 || rc=1;;
    bench-overlap) python3 "$R/benchmarks/bench_overlap.py" --out "$OUT" ${COLLS:+--collectives $COLLS} \
                     ${SHAPES:+--shapes $SHAPES} 2>&1 | tail -22 || rc=1;;
    bench-overlap-quick) python3 "$R/benchmarks/bench_overlap.py" --shapes 8192x8192x2048 --out "$OUT" --tag _quick 2>&1 | tail -16 || rc=1;;
    diag-overlap) for envs in "" "CUDA_MODULE_LOADING=EAGER" "FO_JAX_SPIN_WAIT=1"; do
          echo "--- env: $envs"; env $envs python3 "$R/benchmarks/bench_overlap.py" --shapes 8192x8192x2048 \
            --collectives reduce_scatter --configs 1:116:16 8:116:16 4:100:32 16:116:16 --out "$OUT" --tag "_diag" 2>&1 | grep -E "^\| |method" | cut -c1-400 | grep -oE '"method": "[^"]*", "ms": [0-9.]*|^\| .*' ; done || rc=1;;
    tune) XDG_CACHE_HOME=/tmp/cache timeout 420 python3 -m fo_jax.tune --top 3 \
            --shapes 4096x8192x2048 8192x8192x2048 8192x8192x7168 16384x8192x7168 16384x8192x2048 \
            --collectives reduce_scatter all_reduce > "$OUT/tune.log" 2>&1 || rc=1
          tail -20 "$OUT/tune.log"; cp /tmp/cache/fo_jax/tuning.json "$OUT/" 2>/dev/null;;
    bench-cli) XDG_CACHE_HOME=/tmp/cache timeout 560 python3 -m fo_jax.bench --out "$OUT/bench" \
            ${CONFIGS:+--configs $CONFIGS} 2>&1 | tail -45 || rc=1;;
    overlap-configs) python3 "$R/benchmarks/bench_overlap.py" --shapes ${SHAPES:-8192x8192x2048} \
          --collectives ${COLLS:-reduce_scatter all_reduce} --configs ${CONFIGS:?} --out "$OUT" \
          --tag "${TAG:-_cfg}" 2>&1 | grep -E "^\| |Error|error" || rc=1;;
    profile-overlap) for shape in ${SHAPES:-8192x8192x2048}; do
          python3 "$R/dev/probes_py/profile_overlap.py" --shape "$shape" --collectives ${COLLS:-reduce_scatter all_reduce} \
            --configs ${CONFIGS:-} --out "$OUT" 2>&1 | tee -a "$OUT/profile_overlap.log" || rc=1
          mv "$OUT"/overlap_profile_tp*_????-??-??.jsonl "$OUT/overlap_profile_$shape.jsonl" 2>/dev/null; done;;
    bench-overlap-sweep) python3 "$R/benchmarks/bench_overlap.py" --sweep --out "$OUT" 2>&1 | tail -22 || rc=1;;
    ctx-lock-probe) build_probe ctx_lock_probe  # which enqueue calls can a GPU 0 drain block?
          for blocker in ${BLOCKERS:-none free malloc free_host host_alloc first_launch load_globals unload_globals graph_destroy sync queue_full}; do
            for peer in ${PEERS:-memcpy dtod peer_ctx batch graph graph_create graph_update graph_update_src graph_update_dst local memset_local event_pair kernel_copy flag_only kernel_flag}; do
              timeout 20 /tmp/ctx_lock_probe $blocker $peer >> "$OUT/ctx_lock_probe.log" 2>&1
              echo "$blocker $peer: $(tail -1 "$OUT/ctx_lock_probe.log")"; done; done
          for blocker in first_launch load_globals; do
            CUDA_MODULE_LOADING=EAGER timeout 20 /tmp/ctx_lock_probe $blocker memcpy >> "$OUT/ctx_lock_probe.log" 2>&1
            echo "EAGER $blocker memcpy: $(tail -1 "$OUT/ctx_lock_probe.log")"; done
          timeout 60 /tmp/ctx_lock_probe bench 2>&1 | tee -a "$OUT/ctx_lock_probe.log";;
    queue-probe) build_probe queue_sharing_probe  # do waiting streams hold up others' copies?
          for conn in ${CONNS:-default 32 1}; do
            IFS=';' read -ra cases <<< "${PROBE_ARGS:-none 17;wait 17;spin 17;wait 17 prio;wait 40}"
            for args in "${cases[@]}"; do
              env $([[ $conn == default ]] || echo CUDA_DEVICE_MAX_CONNECTIONS=$conn) timeout 20 \
                /tmp/queue_sharing_probe $args 2>&1 | tee -a "$OUT/queue_sharing_probe.log"; done; done;;
    ctx-lock-order) build_probe ctx_lock_probe
          timeout 60 /tmp/ctx_lock_probe order 2>&1 | tee -a "$OUT/ctx_lock_probe.log";;
    ce-probe) build_probe ce_rs_probe
          NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL NCCL_DEBUG_FILE=/tmp/nccl_dbg.%p \
            /tmp/ce_rs_probe 8192 8192 2048 --check-only > "$OUT/ce_rs_probe_check.log" 2>&1 || rc=1
          cat /tmp/nccl_dbg.* | grep -iE "copy engine|\bCE\b|symmetric|window|CTA ?policy|AlltoAll" \
            | sed -E 's/^[^ ]+ [^ ]+ //' | sort | uniq -c | sort -rn | head -40 > "$OUT/ce_rs_probe_nccl.txt"
          for shape in ${CE_SHAPES:-8192x8192x2048}; do
            /tmp/ce_rs_probe ${shape//x/ } 2>&1 | tee -a "$OUT/ce_rs_probe.log" || rc=1; done;;
    nvlink-probe) build_probe nvlink_rate_probe  # push vs pull vs SM stores over NVLink
          for args in "32 20 16" "32 20 32" "32 20 66" "32 20 132" "8 40 32"; do
            timeout 60 /tmp/nvlink_rate_probe $args 2>&1 | tee -a "$OUT/nvlink_rate_probe.log" || rc=1; done;;
    p2p-probe) build_probe p2p_rs_probe
          for shape in ${CE_SHAPES:-8192x8192x2048}; do
            timeout 300 /tmp/p2p_rs_probe ${shape//x/ } 2>&1 | tee -a "$OUT/p2p_rs_probe.log" || rc=1; done;;
    selftest) "$R/.devbuild/gemm_selftest" 2>&1 | tee "$OUT/selftest.log" | tail -40 || rc=1;;
    probe) "$R/.devbuild/gemm_probe" 2>&1 | tee "$OUT/gemm_probe.log" || rc=1;;
    profile-gemm) python3 "$R/dev/probes_py/profile_gemm.py" --out "$OUT" ${GEMM_SHAPES:+--shapes $GEMM_SHAPES} \
                    --configs coop_128x256x64_c2 pp_128x128x64_c1 coop_128x256x64_c1 2>&1 | tee "$OUT/profile_gemm.log" || rc=1;;
    smi-start) (nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu --format=csv \
                  -lms 250 > "$OUT/smi.csv" 2>&1 & echo $! > /tmp/smi.pid);;
    smi-stop) kill "$(cat /tmp/smi.pid)" 2>/dev/null; python3 - "$OUT/smi.csv" <<'PY' || true
import sys, collections
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l[:1].isdigit()]
by = collections.defaultdict(list)
for r in rows:
    by[r[0]].append((float(r[1].split()[0]), float(r[2].split()[0])))
for gpu, v in sorted(by.items()):
    busy = [x for x in v if x[1] > 200] or v
    print(f"GPU{gpu}: {len(v)} samples; while >200 W: SM clock median {sorted(c for c, _ in busy)[len(busy)//2]:.0f} MHz, power median {sorted(p for _, p in busy)[len(busy)//2]:.0f} W, max {max(p for _, p in v):.0f} W")
PY
    ;;
    *) echo "unknown step $step"; rc=1;;
  esac
done
stamp done
exit $rc
