"""Test helpers.  ``double_geometric`` is a BENCHMARK/TEST-ONLY sampler, not for releases
(releases use the OpenDP discrete Laplace in engine.privacy._mechanisms)."""

import numpy as np


def double_geometric(x, scale, rng):
    """x + discrete Laplace noise, P(k) ∝ exp(-|k|/scale).  Test-only."""
    x = np.asarray(x)
    p = 1.0 - np.exp(-1.0 / scale)
    return x + rng.geometric(p, x.shape) - rng.geometric(p, x.shape)


def laplace_variance(scale):
    """Noise variance of one entry of a Laplace of ``scale`` (2 scale²), the estimators' input."""
    return 2.0 * scale**2


def random_tree(rng, n_states=(1, 4), n_leaves=(1, 4)):
    from engine.count_of_counts import Hierarchy

    pm = {"US": None}
    for s in range(rng.integers(*n_states)):
        pm[f"S{s}"] = "US"
        for p in range(rng.integers(*n_leaves)):
            pm[f"S{s}P{p}"] = f"S{s}"
    return Hierarchy.from_parent_map(pm)
