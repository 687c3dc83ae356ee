"""`python -m fo_jax.tune`: tunes overlapped_matmul on the local GPUs (fo_jax/tuning/cli.py)."""

import sys

from fo_jax.tuning.cli import main

if __name__ == "__main__":
    sys.exit(main())
