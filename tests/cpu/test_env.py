"""fo_jax/_env.py: the process-wide switches fo_jax reads from the environment, parsed in one
place; the compiled module reads none (it receives them from Python)."""

import pathlib

import pytest

from fo_jax import _env


@pytest.mark.parametrize("text,seconds", [("", 0.0), ("5", 5.0), ("0", 0.0), ("2.5", 2.5),
                                          ("-1", 0.0), ("soon", 0.0)])
def test_comm_timeout(monkeypatch, text, seconds):
    monkeypatch.setenv("FO_JAX_COMM_TIMEOUT_S", text)
    assert _env.comm_timeout_s() == seconds


def test_force_reference(monkeypatch):
    monkeypatch.setenv("FO_JAX_FORCE_REFERENCE", "1")
    assert _env.force_reference()
    monkeypatch.setenv("FO_JAX_FORCE_REFERENCE", "0")
    assert not _env.force_reference()


def test_cache_home_and_attach(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _env.cache_home() == str(tmp_path)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _env.cache_home().endswith(".cache")
    monkeypatch.setenv("PROBE_ATTACH_S", "x")
    assert _env.stall_attach_s() == 0.0
    monkeypatch.setenv("PROBE_ATTACH_S", "30")
    assert _env.stall_attach_s() == 30.0


def test_the_compiled_module_reads_no_environment():
    csrc = pathlib.Path(__file__).resolve().parents[2] / "csrc"
    for layer in ("kernels", "comm", "ffi"):
        for path in (csrc / layer).glob("*.*"):
            assert "getenv" not in path.read_text(), path
    for path in csrc.glob("*.*"):  # the module and its test bindings
        assert "getenv" not in path.read_text(), path
