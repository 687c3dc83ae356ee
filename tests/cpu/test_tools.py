"""The user-facing tools on CPU: `python -m fo_jax.info`, `python -m fo_jax.bench` (its device
choice, its CPU fallback and single-device rows, its flags), the build facts (fo_jax.build_info,
the built wheel's record, the warning for a GPU machine without the CUDA module) and the
packaging facts (LICENSE, CHANGELOG, the declared jax range).

The CLIs run as subprocesses with JAX_PLATFORMS=cpu, so they mean the same on GPU machines.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import types
import warnings
import zipfile

import jax
import jax.numpy as jnp
import pytest

import fo_jax
from fo_jax import _cuda, _version
from fo_jax.bench import devices
from fo_jax.bench.devices import SelectionError

from conftest import cpu_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The subprocesses import the fo_jax this process imported (a source tree or an install).
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fo_jax.__file__)))


def _env(tmp_path, host_devices=None) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH")) if p)
    env["XLA_FLAGS"] = ("" if host_devices is None else
                        f"--xla_force_host_platform_device_count={host_devices}")
    return env


def _run(args, tmp_path, host_devices=None, timeout=240):
    return subprocess.run([sys.executable, "-m", *args], env=_env(tmp_path, host_devices),
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


# --- python -m fo_jax.info -------------------------------------------------------------------

def test_info_cli_on_cpu(tmp_path):
    p = _run(["fo_jax.info", "--shape", "64x128x32"], tmp_path, host_devices=4)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"fo_jax {fo_jax.__version__} (commit "), lines[0]
    assert lines[1].startswith(f"jax {jax.__version__}, jaxlib "), lines[1]
    expected = ["platform: JAX default backend cpu", "GPUs: none", "CUDA module: ", "NCCL: ",
                "hardware queues: CUDA_DEVICE_MAX_CONNECTIONS=", "progress timeout: ",
                "GEMM choice table: NVIDIA H100 80GB HBM3's (no GPU here",
                "overlapped_matmul on a mesh of the 4 host CPU devices (axis 'tp' of size 4), "
                "bfloat16, per-GPU x[64,32] @ w[32,128]:",
                "  reduce_scatter: path=reference (", "  all_reduce: path=reference ("]
    for want in expected:
        assert any(line.startswith(want) for line in lines), (want, p.stdout)
    cuda = next(line for line in lines if line.startswith("CUDA module: "))
    assert cuda.startswith("CUDA module: loads (") or "Fix: " in cuda, cuda
    assert "Traceback" not in p.stderr, p.stderr


def test_info_reports_the_progress_timeout(monkeypatch):
    from fo_jax import info

    monkeypatch.delenv("FO_JAX_COMM_TIMEOUT_S", raising=False)
    assert info._timeout_line().startswith("off (FO_JAX_COMM_TIMEOUT_S unset or 0")
    monkeypatch.setenv("FO_JAX_COMM_TIMEOUT_S", "30")
    line = info._timeout_line()
    assert line.startswith("30 s (FO_JAX_COMM_TIMEOUT_S") and "exit 70" in line, line


def test_info_names_the_gemm_table_of_the_gpu_model(monkeypatch):
    from fo_jax import _gemm_choice, info

    monkeypatch.setattr(_gemm_choice, "device_kind", lambda: "NVIDIA H200")
    assert info._gemm_table_line() == "fitted on this GPU model (NVIDIA H200)"
    monkeypatch.setattr(_gemm_choice, "device_kind", lambda: "NVIDIA H100 PCIe")
    line = info._gemm_table_line()
    assert line.startswith("NVIDIA H100 80GB HBM3's: no sweep of NVIDIA H100 PCIe yet"), line


def test_describe_on_mesh_is_abstract_and_matches_describe():
    from fo_jax import info

    mesh = cpu_mesh((4,), ("tp",))
    c = info.describe_on_mesh(mesh, "tp", "reduce_scatter", (64, 4 * 32), (4 * 32, 128),
                              jnp.bfloat16)
    assert (c.op, c.collective, c.axis_size) == ("overlapped_matmul", "reduce_scatter", 4)
    c = info.describe_on_mesh(mesh, "tp", "all_reduce", (64, 4 * 32), (4 * 32, 128),
                              jnp.float32)
    assert (c.collective, c.axis_size) == ("all_reduce", 4)
    assert c.path == "reference", c  # float32 runs on the reference path everywhere


# --- python -m fo_jax.bench: where it measures ----------------------------------------------

def test_select_with_no_gpu_falls_back_to_cpu_loudly_or_refuses():
    s = devices.select(0, None, False, cuda_module=False)
    assert (s.platform, s.tp, s.single) == ("cpu", devices.CPU_HOST_DEVICES, False)
    assert "found 0 CUDA GPUs" in s.message and "2+ GPUs" in s.message
    assert "not GPU measurements" in s.note
    assert devices.select(0, 1, False, cuda_module=False).single
    with pytest.raises(SelectionError, match="--require-gpu.*no CUDA GPU"):
        devices.select(0, None, True, cuda_module=True)
    with pytest.raises(SelectionError, match="--tp 9"):
        devices.select(0, 9, False, cuda_module=False)


def test_select_with_one_gpu_times_the_single_gpu_rows():
    s = devices.select(1, None, True, cuda_module=True)
    assert (s.platform, s.tp, s.single, s.note) == ("gpu", 1, True, None)
    assert "found 1 CUDA GPU" in s.message and "overlap rows need 2+ GPUs" in s.message
    with pytest.raises(SelectionError, match="--tp 2: only 1 local CUDA GPU;"):
        devices.select(1, 2, False, cuda_module=True)


def test_select_with_several_gpus_and_the_cuda_module_flag():
    s = devices.select(4, None, False, cuda_module=True)
    assert (s.platform, s.tp, s.single, s.message, s.note) == ("gpu", 4, False, "", None)
    assert devices.select(4, 2, False, cuda_module=True).tp == 2
    assert devices.select(4, 1, False, cuda_module=True).single
    with pytest.raises(SelectionError, match="--tp 5: only 4 local CUDA GPUs"):
        devices.select(4, 5, False, cuda_module=True)
    with pytest.raises(SelectionError, match="--tp 0"):
        devices.select(4, 0, False, cuda_module=True)
    s = devices.select(4, None, False, cuda_module=False, cuda_reason="no module")
    assert "no module" in s.note and "reference path" in s.note
    with pytest.raises(SelectionError, match="CUDA module is missing: no module"):
        devices.select(4, None, True, cuda_module=False, cuda_reason="no module")


# --- python -m fo_jax.bench: the files it writes ---------------------------------------------

ROW_FIELDS = {"device", "num_devices", "date", "commit", "fo_jax_version", "jax_version",
              "jaxlib_version", "dtype", "tp", "platform", "M", "N", "K", "method", "ms",
              "collective"}


def _rows(out) -> tuple:
    files = sorted(os.listdir(out))
    jsonl = [f for f in files if f.endswith(".jsonl")]
    md = [f for f in files if f.endswith(".md")]
    assert len(jsonl) == 1 and len(md) == 1, files
    rows = [json.loads(line) for line in (out / jsonl[0]).read_text().splitlines()]
    assert rows and all(ROW_FIELDS <= set(r) for r in rows), rows[0]
    assert {r["fo_jax_version"] for r in rows} == {fo_jax.__version__}
    assert {r["jax_version"] for r in rows} == {jax.__version__}
    assert {r["commit"] for r in rows} == {fo_jax.build_info()["commit"]}
    return files, rows, (out / md[0]).read_text()


def test_bench_cli_on_cpu_writes_every_file(tmp_path):
    out = tmp_path / "bench"
    p = _run(["fo_jax.bench", "--out", str(out), "--shapes", "64x128x64", "--chunks", "2"],
             tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "REFERENCE PATH ON CPU" in p.stdout
    assert "found 0 CUDA GPUs" in p.stderr and "NOT GPU MEASUREMENTS" in p.stderr, p.stderr
    # Progress: one line per (collective, shape, method) on stderr.
    assert "[1/3] reduce_scatter 64x128x64: fo_jax.sequential: compile + check" in p.stderr
    assert "[2/3] all_reduce 64x128x64: jax.baseline: " in p.stderr
    assert "[3/3] all_gather 64x128x64: comm_only: " in p.stderr
    files, rows, md = _rows(out)
    assert all("reference path on CPU" in r["note"] for r in rows)
    assert {(r["platform"], r["tp"], r["num_devices"]) for r in rows} == {("cpu", 8, 8)}
    methods = {r["method"] for r in rows}
    assert {"fo_jax", "fo_jax.sequential", "jax.baseline", "jax.chunked[c2]", "gemm_only",
            "comm_only", "xla.windowed_einsum"} <= methods
    assert {r["collective"] for r in rows} == {"reduce_scatter", "all_reduce", "all_gather"}
    assert all(r["ms"] is not None for r in rows if r["method"] != "xla.windowed_einsum")
    assert all(r["path"] == "reference" for r in rows if r["method"] == "fo_jax")
    assert "reference path on cpu" in md.lower() and fo_jax.build_info()["commit"] in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert len([f for f in files if f.endswith(".png")]) == 3, files


def test_bench_cli_single_device_rows_and_dtype(tmp_path):
    out = tmp_path / "bench"
    p = _run(["fo_jax.bench", "--out", str(out), "--shapes", "64x128x64", "--tp", "1",
              "--dtype", "float16", "--no-plots"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    files, rows, md = _rows(out)
    assert files == [f"bench_tp1_{rows[0]['date']}_float16.jsonl",
                     f"bench_tp1_{rows[0]['date']}_float16.md"]
    got = {(r["collective"], r["method"]) for r in rows}
    assert got == {("none", "xla.dot"), ("none", "fo_jax.matmul"),
                   ("reduce_scatter", "jax.baseline"), ("reduce_scatter", "fo_jax"),
                   ("all_reduce", "jax.baseline"), ("all_reduce", "fo_jax"),
                   ("all_gather", "jax.baseline"), ("all_gather", "fo_jax")}
    assert all(r["ms"] is not None and r["dtype"] == "float16" and r["tp"] == 1 for r in rows)
    assert "| none | 64x128x64 | fo_jax.matmul |" in md


def _fake_gpus(monkeypatch, n):
    """Host CPU devices posing as n CUDA GPUs, so that the bench's GPU flow runs on CPU (fo_jax's
    ops still see CPU devices and take the reference path)."""
    monkeypatch.setattr(_cuda, "gpu_devices", lambda: jax.devices("cpu")[:n])
    monkeypatch.setattr(_cuda, "_warned_missing", True)  # no module here: no warning either


def test_bench_run_with_one_gpu_times_the_single_gpu_rows(tmp_path, monkeypatch, capsys):
    from fo_jax import bench

    _fake_gpus(monkeypatch, 1)
    rows = bench.run(["64x128x64"], ["reduce_scatter"], str(tmp_path), windowed=False,
                     plots=False)
    err = capsys.readouterr().err
    assert "found 1 CUDA GPU: the overlap rows need 2+ GPUs" in err, err
    assert {(r["platform"], r["tp"], r["num_devices"]) for r in rows} == {("gpu", 1, 1)}
    assert {(r["collective"], r["method"]) for r in rows} == {
        ("none", "xla.dot"), ("none", "fo_jax.matmul"), ("reduce_scatter", "jax.baseline"),
        ("reduce_scatter", "fo_jax")}
    assert all(r["ms"] is not None for r in rows)
    if not fo_jax.cuda_module_available():
        assert all("CUDA module is missing" in r["note"] for r in rows)


def test_bench_run_with_two_gpus_times_the_overlap_rows(tmp_path, monkeypatch):
    from fo_jax import bench

    _fake_gpus(monkeypatch, 2)
    rows = bench.run(["64x128x64"], ["all_reduce"], str(tmp_path), extended=False, plots=False)
    assert {(r["platform"], r["tp"]) for r in rows} == {("gpu", 2)}
    assert {r["method"] for r in rows} == {"fo_jax", "fo_jax.nccl", "fo_jax.sequential",
                                           "jax.baseline", "gemm_only", "comm_only"}
    with pytest.raises(bench.SelectionError, match="--tp 3: only 2 local CUDA GPUs"):
        bench.run(["64x128x64"], ["all_reduce"], str(tmp_path), extended=False, tp=3)


@pytest.mark.parametrize("args,message", [
    (["--require-gpu"], "--require-gpu, but JAX sees no CUDA GPU"),
    (["--tp", "9"], "--tp 9: no GPUs"),
])
def test_bench_cli_refuses_what_this_machine_cannot_do(tmp_path, args, message):
    out = tmp_path / "bench"
    p = _run(["fo_jax.bench", "--out", str(out), *args], tmp_path)
    assert p.returncode == 2 and message in p.stderr, (p.returncode, p.stderr[-2000:])
    assert not out.exists()


def test_bench_configs_parse_counts_sizes_and_gemm_configs():
    from fo_jax import bench

    cfgs = bench.parse_configs(["4:100:32", "2+4+5+5:108:16:pp_128x192x64_c2"], sweep=False)
    assert cfgs[0] == dict(num_groups=4, sm_budget=100, nccl_max_ctas=32)
    assert cfgs[1] == dict(group_tile_rows=(2, 4, 5, 5), sm_budget=108, nccl_max_ctas=16,
                           gemm_config="pp_128x192x64_c2")
    assert [bench.config_label(c) for c in cfgs] == [
        "fo_jax[g4,sm100,c32]", "fo_jax[g2+4+5+5,sm108,c16,pp_128x192x64_c2]"]
    with pytest.raises(ValueError, match="GROUPS:SM_BUDGET:NCCL_MAX_CTAS"):
        bench.parse_configs(["4:100"], sweep=False)


# --- build facts -----------------------------------------------------------------------------

def test_build_info_sources(monkeypatch):
    monkeypatch.delenv("FO_JAX_COMMIT", raising=False)
    monkeypatch.setattr(_version, "_recorded",
                        lambda: types.SimpleNamespace(COMMIT="0123456789ab", CUDA=False))
    assert fo_jax.build_info() == {"version": fo_jax.__version__, "commit": "0123456789ab",
                                   "commit_source": "build", "cuda_built": False}
    monkeypatch.setenv("FO_JAX_COMMIT", "carried1")
    info = fo_jax.build_info()
    assert (info["commit"], info["commit_source"]) == ("carried1", "FO_JAX_COMMIT")
    monkeypatch.delenv("FO_JAX_COMMIT")
    monkeypatch.setattr(_version, "_recorded", lambda: None)
    info = fo_jax.build_info()
    assert info["cuda_built"] is None and info["commit_source"] in ("git", "unknown")
    if PKG_PARENT == ROOT and os.path.exists(os.path.join(ROOT, ".git")) and shutil.which("git"):
        # A source checkout asks git.
        head = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                                       text=True).strip()
        assert info["commit"].startswith(head) and info["commit_source"] == "git"


def test_version_has_one_source():
    text = open(os.path.join(ROOT, "fo_jax", "_version.py")).read()
    assert re.search(r'^__version__ = "([^"]+)"$', text, re.M).group(1) == fo_jax.__version__
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject


@pytest.fixture
def missing_cuda_module(monkeypatch):
    """fo_jax's CUDA module made unimportable, the load retried, and undone afterwards."""
    monkeypatch.setitem(sys.modules, "fo_jax._fo_jax_cuda", None)  # import -> ImportError
    monkeypatch.delattr(fo_jax, "_fo_jax_cuda", raising=False)
    monkeypatch.setattr(_cuda, "_warned_missing", False)
    _cuda._load.cache_clear()
    yield
    _cuda._load.cache_clear()


def test_cpu_only_build_names_the_fix(missing_cuda_module, monkeypatch):
    monkeypatch.setattr(_version, "_recorded",
                        lambda: types.SimpleNamespace(COMMIT="x", CUDA=False))
    assert not _cuda.module_available()
    reason = _cuda.unavailable_reason()
    assert "CPU-only build" in reason and "nvcc" in reason and "pip install" in reason, reason


def test_first_call_on_gpus_without_the_module_warns_once(missing_cuda_module, monkeypatch):
    monkeypatch.setattr(_cuda, "gpu_devices", lambda: ["a CUDA GPU"])
    x = jnp.ones((16, 32), jnp.bfloat16)
    w = jnp.ones((32, 8), jnp.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fo_jax.matmul(x, w)
        fo_jax.matmul(x, w)
        assert _cuda.module_available(warn=False) is False
    ours = [str(w.message) for w in caught if "fo_jax" in str(w.message)]
    assert len(ours) == 1, ours
    assert "CUDA GPUs are present" in ours[0] and "nvcc" in ours[0], ours[0]
    assert "reference path" in ours[0]


def test_no_warning_without_gpus(missing_cuda_module, monkeypatch):
    monkeypatch.setattr(_cuda, "gpu_devices", lambda: [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cuda.module_available() is False


def _cmake_versions() -> list:
    """(major, minor) of each CMake that scikit-build-core would find: the `cmake` package's (a
    real one: the repo's own cmake/ folder imports as a namespace package) and the one on PATH."""
    paths = [shutil.which("cmake")]
    try:
        import cmake

        if getattr(cmake, "CMAKE_BIN_DIR", None):
            paths.append(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))
    except ImportError:
        pass
    versions = []
    for path in filter(None, paths):
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        found = re.search(r"version (\d+)\.(\d+)", out)
        if found:
            versions.append((int(found.group(1)), int(found.group(2))))
    return versions


def _build_tools_missing() -> str:
    for mod in ("scikit_build_core", "nanobind"):
        try:
            __import__(mod)
        except ImportError:
            return f"building a wheel here needs {mod} (pip install {mod.replace('_', '-')})"
    if not any(v >= (3, 27) for v in _cmake_versions()):  # pyproject.toml's cmake.version
        return "building a wheel here needs CMake >= 3.27 (pip install cmake)"
    return ""


@pytest.mark.skipif(bool(_build_tools_missing()), reason=_build_tools_missing() or "-")
def test_cpu_only_wheel_records_its_build(tmp_path):
    """pip wheel with FO_JAX_CUDA=OFF: the wheel carries fo_jax/_build_info.py saying CUDA=False,
    the version and the commit; the build output says CPU-only loudly (pip -v shows it)."""
    env = dict(os.environ, FO_JAX_COMMIT="feedc0ffee12")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", ROOT, "-v", "--no-deps",
                        "--no-build-isolation", "-C", "cmake.define.FO_JAX_CUDA=OFF",
                        "-C", f"build-dir={tmp_path / 'build'}", "-w", str(tmp_path / "w")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "CPU-ONLY BUILD, WITHOUT THE CUDA MODULE (FO_JAX_CUDA=OFF)" in p.stdout + p.stderr
    (wheel,) = os.listdir(tmp_path / "w")
    assert wheel.startswith(f"fo_jax-{fo_jax.__version__}-"), wheel
    with zipfile.ZipFile(tmp_path / "w" / wheel) as z:
        recorded = z.read("fo_jax/_build_info.py").decode()
        assert not any(n.endswith(".so") for n in z.namelist())
    ns: dict = {}
    exec(recorded, ns)  # noqa: S102 (the file the build wrote)
    assert (ns["VERSION"], ns["COMMIT"], ns["CUDA"]) == (fo_jax.__version__, "feedc0ffee12",
                                                        False)


# --- packaging facts -------------------------------------------------------------------------

def test_license_changelog_and_jax_range():
    license_text = open(os.path.join(ROOT, "LICENSE")).read()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    changelog = open(os.path.join(ROOT, "CHANGELOG.md")).read()
    assert "## [Unreleased]" in changelog and f"## [{fo_jax.__version__}]" in changelog
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    deps = pyproject[pyproject.index("dependencies = ["):]
    deps = deps[:deps.index("]")]
    for name in ("jax", "jaxlib"):
        spec = re.search(rf'"{name}(>=[^"]+)"', deps)
        assert spec and "<" in spec.group(1), f"{name} needs a lower and an upper bound: {deps}"
