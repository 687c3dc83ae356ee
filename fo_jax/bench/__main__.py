"""`python -m fo_jax.bench` (fo_jax/bench/cli.py says what it measures)."""

import sys

from fo_jax.bench.cli import main

sys.exit(main())
