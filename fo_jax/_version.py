"""fo_jax's version and build facts.

The version is written here and only here: pyproject.toml reads it at build time
(scikit-build-core's regex provider). The build (CMakeLists.txt) writes fo_jax/_build_info.py
into the installed package with the git commit of the source tree and whether the CUDA module
was compiled, so that result files from any install say where they came from. A source checkout
(no _build_info.py) asks git at run time; FO_JAX_COMMIT overrides both, for trees copied to
another machine without their .git.
"""

from __future__ import annotations

import functools
import os
import subprocess
from typing import Optional

from fo_jax import _env

__version__ = "0.1.0"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _recorded() -> Optional[object]:
    try:
        from fo_jax import _build_info  # noqa: PLC0415 (written by the build; absent in a checkout)
    except ImportError:
        return None
    return _build_info


@functools.lru_cache(maxsize=None)
def _git_commit(root: str) -> Optional[str]:
    """Short commit of the git checkout at `root` (+dirty with uncommitted tracked changes)."""
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        head = subprocess.check_output(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                                       text=True, stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.check_output(["git", "-C", root, "status", "--porcelain",
                                         "--untracked-files=no"],
                                        text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def build_info() -> dict:
    """Where this fo_jax came from.

    Returns a dict with
      version: fo_jax's version;
      commit: short git commit of the source it was built from (+dirty when the tree had
        uncommitted changes), or "unknown";
      commit_source: "FO_JAX_COMMIT" (the environment variable, which overrides the rest),
        "build" (recorded when the package was built) or "git" (a source checkout);
      cuda_built: whether the build compiled the CUDA module (None in a source checkout,
        which pip did not build; `fo_jax.cuda_module_available()` says whether it loads).
    """
    rec = _recorded()
    env = _env.source_commit()
    if env:
        commit, source = env, "FO_JAX_COMMIT"
    elif rec is not None and getattr(rec, "COMMIT", "unknown") != "unknown":
        commit, source = rec.COMMIT, "build"
    else:
        commit = _git_commit(os.path.dirname(_PACKAGE_DIR))
        source = "git" if commit else "unknown"
        commit = commit or "unknown"
    return {"version": __version__, "commit": commit, "commit_source": source,
            "cuda_built": None if rec is None else bool(rec.CUDA)}
