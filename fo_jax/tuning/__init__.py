"""fo_jax.tuning: predictive tuner of overlapped_matmul and its on-disk cache.

`lookup` (trace time, read-only) returns a tuned {"num_groups", "sms_for_nccl", "nccl_max_ctas"}
or None; tuning itself runs only from the CLI `python -m fo_jax.tune` (never inside a user's jit).
Modules: model (pipeline model), cache (tuning.json), measure (GPU timing), search (the tuner),
cli (the command line: `python -m fo_jax.tune`, or `python -m fo_jax.tuning`).
"""

from fo_jax.tuning.cache import cache_path, lookup
from fo_jax.tuning.model import Candidate, CommCurve, pipeline_seconds

__all__ = ["Candidate", "CommCurve", "cache_path", "lookup", "pipeline_seconds"]
