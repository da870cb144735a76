import itertools

import numpy as np
import pytest

from engine.count_of_counts._group_counts import consistent_group_counts, tree_least_squares, tree_objective

from .helpers import random_tree


def test_exact_integer_least_squares_bruteforce():
    rng = np.random.default_rng(0)
    for t in range(60):
        h = random_tree(rng, (1, 3), (1, 3))
        noisy = np.round(rng.normal(3, 4, h.n_nodes), 1)
        if t % 3 == 0:
            noisy[rng.random(h.n_nodes) < 0.4] = np.nan
        var = rng.choice([0.5, 1.0, 2.0], h.n_nodes)
        w = np.where(np.isnan(noisy), 0, 1 / var)
        g = consistent_group_counts(h, noisy, var)
        assert g.dtype.kind == "i" and np.all(g >= 0)
        for v in range(h.n_nodes):
            kids = np.flatnonzero(h.parent == v)
            if kids.size:
                assert g[kids].sum() == g[v]
        L = h.leaves()
        # every leaf vector in 0..15 at once: one column each, internal nodes summed up
        leaf_values = np.array(list(itertools.product(range(16), repeat=L.size))).T
        X = np.zeros((h.n_nodes, leaf_values.shape[1]), dtype=np.int64)
        X[L] = leaf_values
        X = h.aggregate_up(X)
        r = np.where(np.isnan(noisy), 0.0, 1.0)[:, None] * (X - np.nan_to_num(noisy)[:, None])
        objective = (w[:, None] * r * r).sum(axis=0)
        best = float(objective.min())
        assert abs(best - tree_objective(h, X[:, int(objective.argmin())], noisy, w)) < 1e-9
        assert tree_objective(h, g, noisy, w) <= best + 1e-9


def test_leaves_only_measurement_rounds_and_clips():
    h = random_tree(np.random.default_rng(1), (2, 3), (2, 3))
    noisy = np.full(h.n_nodes, np.nan)
    L = h.leaves()
    noisy[L] = np.linspace(-3, 10.4, L.size)
    g = consistent_group_counts(h, noisy)
    assert np.array_equal(g[L], np.maximum(np.rint(noisy[L]), 0))


def test_tree_least_squares_reaches_the_weighted_least_squares_optimum():
    """The two-pass start of the integer descent against a dense weighted least-squares solve over
    the leaf values (internal nodes their sums), unmeasured nodes included."""
    rng = np.random.default_rng(3)
    for t in range(40):
        h = random_tree(rng, (1, 5), (1, 6))
        noisy = rng.normal(20, 8, h.n_nodes)
        w = rng.choice([0.25, 1.0, 4.0], h.n_nodes) * (rng.random(h.n_nodes) > (0.3 if t % 2 else 0.0))
        g = tree_least_squares(h, noisy, w)
        assert np.allclose(h.aggregate_up(np.where(h.is_leaf(), g, 0.0)), g)  # consistent
        L = h.leaves()
        M = np.zeros((h.n_nodes, L.size))
        M[L, np.arange(L.size)] = 1.0
        M = h.aggregate_up(M)
        x, *_ = np.linalg.lstsq(np.sqrt(w)[:, None] * M, np.sqrt(w) * noisy, rcond=None)
        assert tree_objective(h, g, noisy, w) == pytest.approx(tree_objective(h, M @ x, noisy, w), rel=1e-9, abs=1e-9)
