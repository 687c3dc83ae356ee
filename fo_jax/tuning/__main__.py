"""`python -m fo_jax.tuning` (= `python -m fo_jax.tune`): fo_jax/tuning/cli.py says what it does."""

import sys

from fo_jax.tuning.cli import main

sys.exit(main())
