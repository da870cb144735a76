"""Sensitivity of the count-of-counts measurements as the pipeline makes them (Hc of every node
of a level), checked on worst-case and random neighbouring datasets with the shared harness."""

import numpy as np
import pytest

from engine.count_of_counts import estimators
from engine.count_of_counts.geography import geography_hierarchy, hc_l1_sensitivity, hc_l2_sensitivity, size_histograms
from tests.engine.test_hierarchical_data import random_data
from tests.sensitivity_harness import check_sensitivity


def level_hc(level: int, K: int, geo_template: np.ndarray):
    """All nodes' Hc[0..K-1] of one level, over a fixed geography (so neighbours are comparable)."""
    h = geography_hierarchy(geo_template)

    def fn(data):
        H = size_histograms(h, data.geo, data.sizes, K)
        return estimators.hc_query(H[h.level_range(level)], K).values

    return fn


@pytest.mark.parametrize("unit", ["household", "person"])
@pytest.mark.parametrize("level", [0, 1, 2])
def test_hc_sensitivity_bounds_hold_and_are_attained(unit, level):
    rng = np.random.default_rng(level)
    data = random_data(rng, n=80, M=4)
    K = data.domain.max_size
    fn = level_hc(level, K, np.unique(data.geo, axis=0))
    l1, l2 = hc_l1_sensitivity(K, unit), hc_l2_sensitivity(K, unit)
    obs_l1, obs_l2 = check_sensitivity(fn, data, unit, l1, l2, trials=60, rng=rng)
    assert obs_l1 == pytest.approx(l1) and obs_l2 == pytest.approx(l2)  # tight: size-1 household added/removed


def test_hc_sensitivity_values():
    assert hc_l1_sensitivity(8, "household") == 7 and hc_l2_sensitivity(8, "household") == pytest.approx(7**0.5)
    assert hc_l1_sensitivity(8, "person") == 1
    with pytest.raises(ValueError):
        hc_l1_sensitivity(8, "family")
