"""Sampling households from a posterior on the support: systematic draws, fixed size counts,
stratification along the household order (statistical tests)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.queries._support import Support
from engine.synthesis._household_sampling import household_order, sample_households
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)


def test_sample_households_sizes_and_weights():
    rng = np.random.default_rng(18)
    data = random_data(DOMAIN, 200, seed=19)
    data = data.with_geo(np.stack([np.arange(200), np.zeros(200)], axis=1))  # geo = household id
    s = Support.from_data(data)
    w = rng.dirichlet(np.ones(s.n_support))
    out = sample_households(s, w, 1000, rng)
    assert out.n_households == 1000
    # systematic: every household appears floor or ceil of n·q times
    counts = np.bincount(out.geo[:, 0], minlength=s.n_support)
    assert np.all(np.abs(counts - 1000 * w) < 1 + 1e-9)
    sizes = np.array([5, 0, 7, 3])
    out = sample_households(s, w, None, rng, sizes=sizes, geo=(44, 101))
    np.testing.assert_array_equal(np.bincount(out.sizes, minlength=5)[1:], sizes)
    assert np.all(out.geo == [44, 101])
    # no posterior mass on size 2: falls back to the support households of that size
    w0 = np.where(s.data.sizes == 2, 0.0, w)
    out = sample_households(s, w0, 10, rng, sizes=[0, 10, 0, 0], method="multinomial")
    assert np.all(out.sizes == 2)
    with pytest.raises(ValueError):
        sample_households(s, w, 5, rng, sizes=[1, 1, 1, 1])


def test_systematic_sampling_along_the_household_order_is_unbiased_and_stratified():
    """Statistical test: over many draws each household is drawn n·q_h times on average (the
    systematic draw is unbiased along any fixed order), and in every draw each run of households
    sharing their group attributes gets its expected count to within one (implicit stratification),
    which the support order does not give."""
    rng = np.random.default_rng(21)
    data = random_data(DOMAIN, 120, seed=22)
    data = data.with_geo(np.stack([np.arange(120), np.zeros(120)], axis=1))  # geo = household id
    s = Support.from_data(data)
    order = household_order(s.data)
    assert sorted(order) == list(range(120))
    keys = [tuple(r) for r in s.data.group[order]]
    assert keys == sorted(keys)  # lexicographic, the first group attribute slowest
    w = rng.dirichlet(np.ones(s.n_support))
    n, reps = 150, 4000
    mean = np.zeros(s.n_support)
    cell = np.unique(s.data.group, axis=0, return_inverse=True)[1].ravel()
    expected_cells = np.bincount(cell, weights=n * w)
    worst_sorted = worst_plain = 0.0
    for _ in range(reps):
        drawn = np.bincount(sample_households(s, w, n, rng, order=order).geo[:, 0], minlength=s.n_support)
        mean += drawn / reps
        worst_sorted = max(worst_sorted, np.abs(np.bincount(cell, weights=drawn) - expected_cells).max())
    for _ in range(200):
        drawn = np.bincount(sample_households(s, w, n, rng).geo[:, 0], minlength=s.n_support)
        worst_plain = max(worst_plain, np.abs(np.bincount(cell, weights=drawn) - expected_cells).max())
    # per household, the draw count is floor or ceil of n q_h: variance <= 1/4, so the mean over
    # reps is within 5 standard errors of n q_h
    assert np.all(np.abs(mean - n * w) <= 5 * 0.5 / np.sqrt(reps))
    assert worst_sorted < 1 + 1e-9 < worst_plain
    with pytest.raises(ValueError, match="permutation"):
        sample_households(s, w, n, rng, order=np.zeros(120, dtype=np.int64))
