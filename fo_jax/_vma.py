"""The one place that reads and writes JAX's "varying manual axes" type across jax versions
(jax 0.10+: `aval.mat.varying`; earlier: `aval.vma`). shard_map's check_vma compares these types,
so the custom VJP's cotangents and the CUDA primitive's results must carry the right ones.
"""

from __future__ import annotations

import jax


def varying_axes(a) -> frozenset:
    """Mesh axes the value varies over; empty outside shard_map or under
    check_vma=False."""
    aval = jax.typeof(a)
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return frozenset(mat.varying)
    if hasattr(aval, "vma"):
        return frozenset(aval.vma)
    # Guessing "not varying" would silently mis-scale gradients under check_vma=True.
    raise NotImplementedError(f"fo_jax: cannot read the varying manual axes of {aval} with jax "
                              f"{jax.__version__}; please report this")


def with_varying(aval, axes) -> object:
    """`aval` updated to vary over exactly `axes`."""
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return aval.update(manual_axis_type=mat.update(varying=frozenset(axes)))
    return aval.update(vma=frozenset(axes))
