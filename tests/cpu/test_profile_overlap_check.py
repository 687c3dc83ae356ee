"""benchmarks/profile_overlap_check.py: the interval arithmetic and the PASS/FAIL on a synthetic
Chrome trace of two GPUs, and the reader's plumbing on a real profile of
benchmarks/train_tp_transformer.py --all-gather overlap on host CPU devices (no GPU events: the
check says so and exits 2)."""

import gzip
import json
import os
import subprocess
import sys

import pytest

import fo_jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import profile_overlap_check as poc  # noqa: E402


def _chrome(path, gpus):
    """gpus: {gpu: [(stream, name, start_us, dur_us, hlo_op)]} -> a .trace.json.gz file, with a
    host process and a derived "XLA Ops" line that the reader must skip."""
    trace = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
             {"ph": "X", "pid": 1, "tid": 1, "name": "ncclHostThing", "ts": 0, "dur": 1e6}]
    for gpu, evs in gpus.items():
        pid = 100 + gpu
        trace.append({"ph": "M", "name": "process_name", "pid": pid,
                      "args": {"name": f"/device:GPU:{gpu}"}})
        trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 99,
                      "args": {"name": "XLA Ops"}})
        trace.append({"ph": "X", "pid": pid, "tid": 99, "name": "all-gather-start", "ts": 0,
                      "dur": 1e6})
        for stream in {e[0] for e in evs}:
            trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": stream,
                          "args": {"name": f"Stream #{stream}(Compute)"}})
        for stream, name, ts, dur, op in evs:
            trace.append({"ph": "X", "pid": pid, "tid": stream, "name": name, "ts": ts,
                          "dur": dur, "args": {"hlo_op": op} if op else {}})
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": trace}, fh)


GEMM = "void cutlass::device_kernel<fo_jax::GemmKernel<128x256>>(Params)"


def _gpu_events(hide_second):
    """Two collectives per GPU: custom-call.1 (a copy-engine copy under a GEMM) and
    all-gather.2 (an NCCL kernel, under a GEMM only when hide_second)."""
    evs = [(7, GEMM, 100, 50, "custom-call.1"),
           (8, "MemcpyP2P", 110, 20, "custom-call.1"),
           (8, "MemcpyP2P", 140, 20, "custom-call.1"),  # 10 of 20 us under the GEMM
           (8, "void fo_jax::SpinWaitGeqKernel(int*)", 90, 100, "custom-call.1"),  # no GEMM
           (9, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgs)", 300, 40, "all-gather.2")]
    # Under a cuBLASLt GEMM, or under a kernel whose name the script does not know as a GEMM.
    evs.append((7, "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNT" if hide_second
                else "my_custom_mm_kernel", 290, 60, "dot.3"))
    return evs


def test_synthetic_trace_two_gpus(tmp_path):
    path = str(tmp_path / "host.trace.json.gz")
    _chrome(path, {0: _gpu_events(True), 1: _gpu_events(False)})
    assert poc.find_trace(str(tmp_path)) == path
    events = poc.read(str(tmp_path))
    assert {e.gpu for e in events} == {0, 1}
    assert not any(e.name in ("all-gather-start", "ncclHostThing") for e in events)
    result = poc.analyse(events, min_fraction=0.5)
    c0 = {c["op"]: c for c in result[0]["collectives"]}
    assert c0["custom-call.1"]["events"] == 2 and c0["custom-call.1"]["comm_us"] == 40
    assert c0["custom-call.1"]["overlapped_us"] == 30 and c0["custom-call.1"]["overlapped"]
    assert c0["all-gather.2"]["fraction"] == 1.0
    c1 = {c["op"]: c for c in result[1]["collectives"]}
    assert c1["all-gather.2"]["overlapped_us"] == 0 and not c1["all-gather.2"]["overlapped"]
    assert result[0]["gemm_us"] == 110 and result[1]["gemm_us"] == 50  # SpinWait is no GEMM
    lines, passed = poc.report(result, expect=2)
    assert not passed and lines[-1].startswith("FAIL profile overlap")
    assert any("NOT overlapped" in ln and "all-gather.2" in ln for ln in lines)
    assert poc.report(result, expect=1)[1]
    out = tmp_path / "check.json"
    assert poc.main([str(tmp_path), "--expect", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["passed"] is True
    assert poc.main([str(tmp_path), "--expect", "2"]) == 1
    assert poc.main([str(tmp_path), "--expect", "1", "--min-fraction", "0.8"]) == 1  # 30/40
    assert any("unclassified kernels" in ln and "my_custom_mm_kernel 60 us" in ln for ln in lines)
    # The unknown GEMM's name, given on the command line, hides GPU 1's all-gather too.
    assert poc.main([str(tmp_path), "--expect", "2", "--gemm-regex", "custom_mm"]) == 0


def test_events_without_an_op_group_by_name():
    evs = [poc.Event(0, "ncclDevKernel_ReduceScatter", 0, 10),
           poc.Event(0, "ncclDevKernel_ReduceScatter", 20, 30),
           poc.Event(0, "sm90_xmma_gemm_bf16", 5, 25)]
    (c,) = poc.analyse(evs)[0]["collectives"]
    assert c["events"] == 2 and c["comm_us"] == 0.02 and c["overlapped_us"] == 0.01


def test_peer_copies_belong_to_the_call_that_issued_them():
    """The copy engine's copies carry no op in a real trace: each joins the last fo_jax custom
    call started before it on its GPU (its tail may run past the call's GEMM); copies before any
    call, and the other GPU's, are not moved."""
    call_1, call_2 = "fo_jax_overlapped_matmul.216", "fo_jax_overlapped_matmul.217"
    evs = [poc.Event(0, "MemcpyP2P", 0, 5),  # before any fo_jax call
           poc.Event(0, "Memset 3", 10, 11, call_1),
           poc.Event(0, GEMM, 12, 40, call_1),
           poc.Event(0, "MemcpyP2P", 20, 30),
           poc.Event(0, "MemcpyP2P", 35, 45),  # the tail, past the GEMM
           poc.Event(0, GEMM, 50, 80, call_2),
           poc.Event(0, "MemcpyP2P", 60, 70),
           poc.Event(0, "ncclDevKernel_ReduceScatter", 85, 90, "reduce_scatter.28.2"),
           poc.Event(1, "MemcpyP2P", 20, 30)]  # GPU 1 ran no fo_jax call
    ops = [e.op for e in poc.attribute_peer_copies(evs)]
    assert ops == ["", call_1, call_1, call_1, call_1, call_2, call_2, "reduce_scatter.28.2", ""]
    c0 = {c["op"]: c for c in poc.analyse(evs)[0]["collectives"]}
    assert set(c0) == {"MemcpyP2P", call_1, call_2, "reduce_scatter.28.2"}
    assert c0[call_1]["events"] == 2 and c0[call_1]["comm_us"] == 0.02
    assert c0[call_1]["overlapped_us"] == 0.015 and c0[call_2]["fraction"] == 1.0


def test_kind_of_kernel_names():
    assert poc.kind("ncclDevKernel_AllGather_RING_LL") == "comm"
    assert poc.kind("Memcpy PtoP (Device -> Device)") == "comm"
    assert poc.kind("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN") == "gemm"
    assert poc.kind("void fo_jax::BandSumKernel<bf16>(...)") is None
    assert poc.kind("loop_add_fusion") is None


def test_real_cpu_profile_of_the_training_script(tmp_path):
    """--all-gather overlap is recorded in every row, and the profile it writes is read (on host
    CPU devices it holds no GPU stream events: exit 2, said so)."""
    # The training script builds its model with flax (the [flax] extra, absent where CI runs the
    # oldest supported jax).
    pytest.importorskip("flax", reason="the training script needs flax (pip install fo_jax[flax])")
    out = tmp_path / "rows.jsonl"
    where = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "train_tp_transformer.py"),
           "--steps", "2", "--layers", "1", "--d-model", "32", "--heads", "4", "--d-ff", "64",
           "--seq", "16", "--batch", "2", "--all-gather", "overlap", "--out", str(out),
           "--profile", str(tmp_path / "trace")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["all_gather"] for r in rows} == {"overlap"}
    # A CPU run states the criterion without a verdict (its times are not GPU times).
    assert "NOT CHECKED train_tp_transformer: step-time ratio >= 1.15x" in p.stdout
    assert {r["method"] for r in rows} == {"fo_jax", "jax.baseline"}
    trace = poc.find_trace(str(tmp_path / "trace" / "fo_jax"))
    assert trace.endswith(".xplane.pb")
    assert poc.read(trace) == []  # host devices only
    check = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks",
                                                         "profile_overlap_check.py"),
                            str(tmp_path / "trace" / "fo_jax"), "--expect", "4"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 2, check.stdout + check.stderr
    assert "FAIL profile overlap: the trace holds no GPU stream events" in check.stdout
