"""fo_jax.bench: the benchmark machinery behind `python -m fo_jax.bench` and benchmarks/.

Modules: cli (the command line and `run`), devices (where to measure, from the GPU count and the
flags), overlap (the multi-GPU rows), single (the single-GPU rows), xla_worker (XLA's windowed
einsum, in its own process), core (timing, operands, result rows; also used by fo_jax.tuning),
report (markdown tables and plots). It lives in the package, not in benchmarks/ (which the wheel
does not ship), so that the installed CLI runs anywhere.
"""

from fo_jax.bench.cli import SWEEP, main, parse_configs, run
from fo_jax.bench.devices import SelectionError
from fo_jax.bench.overlap import config_label

__all__ = ["SWEEP", "SelectionError", "config_label", "main", "parse_configs", "run"]
