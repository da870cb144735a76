"""Sensitivity of the count-of-counts measurements as the pipeline makes them (per node of a level,
the size histogram or the households of size ≥ k, ``engine.privacy._session.size_histogram`` /
``size_counts``, in both forms under both privacy units and every combination of the ingestion
rules), checked on worst-case and random neighbouring datasets with the shared harness, plus the
person unit's "new one-person household" and "a person joins a household at the cap" neighbours
built explicitly."""

import itertools
import math
import typing

import numpy as np
import pytest

from engine.count_of_counts._geography import geography_hierarchy, size_histograms
from engine.data._hierarchical_data import HierarchicalData
from engine.privacy._session import size_counts, size_counts_sensitivity, size_form
from schemas.ingestion import HouseholdRules
from tests.engine.test_hierarchical_data import random_data
from tests.sensitivity_harness import check_sensitivity, join_household

_RULES = typing.get_type_hints(HouseholdRules)
COMBINATIONS = list(itertools.product(("household", "person"), typing.get_args(_RULES["oversize"]),
                                      typing.get_args(_RULES["group_quarters"])))


def level_size_counts(level: int, K: int, geo_template: np.ndarray, form: str = "at_least"):
    """All nodes' size measurements of one level, over a fixed geography (so neighbours are comparable)."""
    h = geography_hierarchy(geo_template)
    ids = h.level_range(level)

    def fn(data):
        H = size_histograms(h, data.geo, data.sizes, K)[ids]
        if form == "histogram":
            return H[:, 1:]
        # households of size >= k from the histogram (the session computes it from the sizes)
        return np.cumsum(H[:, :0:-1], axis=1)[:, ::-1]

    return fn


def test_size_counts_match_the_histogram_form():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 12, 400)
    K = 8
    brute = np.array([(np.minimum(sizes, K) >= k).sum() for k in range(1, K + 1)])
    assert np.array_equal(size_counts(sizes, K), brute)
    data = random_data(rng, n=80, M=4)
    fn = level_size_counts(0, 4, np.unique(data.geo, axis=0))
    assert np.array_equal(fn(data)[0], size_counts(data.sizes, 4))


@pytest.mark.parametrize("form", ["at_least", "histogram"])
@pytest.mark.parametrize("unit,oversize,group_quarters", COMBINATIONS)
@pytest.mark.parametrize("level", [0, 2])
def test_size_count_bounds_hold_and_are_attained(form, unit, oversize, group_quarters, level):
    """Tight under every rule: a household of size K appears (household unit; person unit: its
    householder leaves, or under ``exclude`` a person joins it), or a person joins one of s < K."""
    rng = np.random.default_rng(level)
    data = random_data(rng, n=80, M=4)
    K = data.domain.max_size
    fn = level_size_counts(level, K, np.unique(data.geo, axis=0), form)
    l1, l2 = size_counts_sensitivity(K, unit, form)
    obs_l1, obs_l2 = check_sensitivity(fn, data, unit, l1, l2, trials=60, rng=rng, oversize=oversize, group_quarters=group_quarters)
    assert obs_l1 == pytest.approx(l1) and obs_l2 == pytest.approx(l2)


@pytest.mark.parametrize("oversize", typing.get_args(_RULES["oversize"]))
def test_person_joining_a_household_at_the_cap(oversize):
    """A person joins a household of M persons: under ``exclude`` it leaves the data whole and
    moves all M households-of-size-≥-k counts (L1 = M, L2 = √M, the at-least form's person-unit
    charge; a charge of one entry is broken); under ``clip`` the sizes do not move."""
    rng = np.random.default_rng(4)
    data = random_data(rng, n=60, M=4)
    K = M = data.domain.max_size
    fn = level_size_counts(0, K, np.unique(data.geo, axis=0))
    h = int(np.flatnonzero(data.sizes == M)[0])
    keep = np.ones(data.n_households, dtype=bool)
    keep[h] = False
    persons = data.person[data.person_offsets[h]:data.person_offsets[h + 1]]
    joined = join_household(persons, persons[1], 1, M, oversize)
    after = data.select(keep)
    if joined is not None:
        one = data.take(np.array([h]))
        after = HierarchicalData.concat([after, HierarchicalData.from_arrays(data.domain, one.geo, one.group, joined, np.array([0, M]))])
    diff = np.abs(fn(after) - fn(data))
    if oversize == "exclude":
        assert (diff.sum(), math.sqrt((diff ** 2).sum())) == (M, pytest.approx(math.sqrt(M)))
        assert (diff.sum(), math.sqrt((diff ** 2).sum())) <= size_counts_sensitivity(K, "person", "at_least")
    else:
        assert diff.sum() == 0


def test_harness_catches_the_one_entry_charge_of_a_person_under_the_at_least_form():
    """Negative control: the at-least form charged one entry per person (1, 1) is broken by the
    person unit's whole-household neighbours, under both oversize rules."""
    rng = np.random.default_rng(6)
    data = random_data(rng, n=80, M=4)
    fn = level_size_counts(0, data.domain.max_size, np.unique(data.geo, axis=0))
    for oversize in typing.get_args(_RULES["oversize"]):
        with pytest.raises(AssertionError, match="violated"):
            check_sensitivity(fn, data, "person", 1, 1, trials=60, rng=rng, oversize=oversize)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_person_unit_new_one_person_household(level):
    """A person who forms a household of their own changes one entry (the household count)."""
    rng = np.random.default_rng(10 + level)
    data = random_data(rng, n=60, M=4)
    K = data.domain.max_size
    fn = level_size_counts(level, K, np.unique(data.geo, axis=0))
    for h in range(0, data.n_households, 7):
        one = data.take(np.array([h]))
        persons = one.person[:1]
        group = one.group.copy()
        group[0, data.domain.group_index(data.domain.size_attribute)] = 0
        new = HierarchicalData.from_arrays(data.domain, one.geo, group, persons, np.array([0, 1]))
        diff = np.abs(fn(HierarchicalData.concat([data, new])) - fn(data))
        assert diff.sum() == 1 and np.sqrt((diff ** 2).sum()) <= size_counts_sensitivity(K, "person")[1]


def test_size_count_sensitivity_values():
    assert size_form("household") == "histogram" and size_form("person") == "histogram"
    assert size_counts_sensitivity(8, "household") == (1.0, 1.0)  # the histogram
    assert size_counts_sensitivity(8, "household", "at_least") == (8.0, pytest.approx(8 ** 0.5))
    assert size_counts_sensitivity(8, "person") == (2.0, pytest.approx(2 ** 0.5))  # the histogram
    assert size_counts_sensitivity(8, "person", "at_least") == (8.0, pytest.approx(8 ** 0.5))  # a whole household
    # the measured form is the cheaper one under each unit
    for unit in ("household", "person"):
        other = "at_least" if size_form(unit) == "histogram" else "histogram"
        assert size_counts_sensitivity(8, unit)[1] < size_counts_sensitivity(8, unit, other)[1]
    with pytest.raises(ValueError):
        size_counts_sensitivity(8, "family")


@pytest.mark.parametrize("oversize", typing.get_args(_RULES["oversize"]))
def test_one_person_households_only(oversize):
    """At M = K = 1 the histogram's one entry is the household count: any neighbour moves it by
    at most one, under the person unit too (a joining person is clipped away or excludes the household)."""
    rng = np.random.default_rng(8)
    data = random_data(rng, n=40, M=1)
    fn = level_size_counts(0, 1, np.unique(data.geo, axis=0), "histogram")
    assert size_counts_sensitivity(1, "person") == (1.0, 1.0)
    assert check_sensitivity(fn, data, "person", 1, 1, trials=40, rng=rng, oversize=oversize) == (1.0, 1.0)
