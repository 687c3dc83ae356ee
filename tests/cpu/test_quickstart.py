"""README.md's quickstart runs as written, in a fresh process, and prints what it verified."""

import os
import pathlib
import re
import subprocess
import sys

import fo_jax

ROOT = pathlib.Path(__file__).resolve().parents[2]


def quickstart_code() -> str:
    """The first ```python block of README.md's "Quickstart" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's Quickstart section has no ```python block"
    return match.group(1)


def test_readme_quickstart_runs_as_is(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_code())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # as a user's shell would
    # This test process holds most of a GPU's memory already (JAX preallocates 75%): the
    # quickstart takes what it needs as it goes.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    # The fo_jax this test process imported (installed, or the source tree), not another one.
    where = str(pathlib.Path(fo_jax.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "path=" in p.stdout and "OK: matches psum_scatter" in p.stdout, p.stdout + p.stderr
