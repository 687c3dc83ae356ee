"""Shared benchmark plumbing for the scripts here: timing, result rows, output files.

Re-exported from fo_jax/_benchcore.py (one copy of the timing code for the scripts, the tuner
and `python -m fo_jax.bench`). Timing: `reps` back-to-back calls of a jitted function, one
block_until_ready at the end, time divided by `reps`; repeated `trials` times; the median is
reported (the method of ../shared/anchors, median of 5 x 20 calls), so numbers compare.
"""

from __future__ import annotations

from fo_jax._benchcore import (  # noqa: F401 (re-exports)
    Results,
    commit,
    device_info,
    markdown_table,
    time_ms,
    time_ms_interleaved,
)
