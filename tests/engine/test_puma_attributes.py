"""How many PUMA attributes the budget carries (engine.synthesis._puma_attributes): the public signal against
brute force, the noise formula against simulation, and the rule's properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.data._hierarchical_data import HierarchicalData
from engine.queries._queries import Workload, answer
from engine.synthesis._puma_attributes import between_puma_variation, choose_puma_attributes, expected_noise_l1
from engine.synthesis._workload_selection import WorkloadSelection, select_workloads
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)


def geography_data(seed: int = 3) -> HierarchicalData:
    """Three states: state 1 with three PUMAs where TEN and AGE depend on the PUMA, state 2 with two
    PUMAs, state 3 with one PUMA (no between-PUMA variation: left out)."""
    base = random_data(DOMAIN, 900, seed=seed, dependence=0.5)
    rng = np.random.default_rng(seed)
    st = rng.integers(1, 4, size=base.n_households)
    puma = np.where(st == 1, rng.integers(100, 103, size=base.n_households),
                    np.where(st == 2, rng.integers(100, 102, size=base.n_households), 100))
    group = base.group.copy()
    ten = DOMAIN.group_index("TEN")
    moved = (st == 1) & (rng.random(base.n_households) < 0.6)
    group[moved, ten] = puma[moved] - 100
    person = base.person.copy()
    age = DOMAIN.person_index("AGE")
    hh = base.person_household
    shift = (st[hh] == 1) & (rng.random(person.shape[0]) < 0.5)
    person[shift, age] = puma[hh[shift]] - 100
    return HierarchicalData.from_arrays(DOMAIN, np.column_stack([st, puma]), group, person, base.person_offsets)


DATA = geography_data()
WORKLOADS = [Workload("group", ("TEN",)), Workload("person", (), ("AGE",)), Workload("person", (), ("SEX",), 0, True),
             Workload("group", ("R18",), ("RAC",))]


def _variation_loops(data: HierarchicalData, w: Workload) -> float:
    """between_puma_variation by loops over the states and their PUMAs."""
    total, weight = 0.0, 0.0
    for s in np.unique(data.geo[:, 0]):
        in_state = data.geo[:, 0] == s
        pumas = np.unique(data.geo[in_state, 1])
        if len(pumas) < 2:
            continue
        a_s = answer(data.select(in_state), w)
        for p in pumas:
            sub = data.select(in_state & (data.geo[:, 1] == p))
            a_p = answer(sub, w)
            total += sub.n_households * np.abs(a_p / a_p.sum() - a_s / a_s.sum()).sum()
            weight += sub.n_households
    return total / weight


def test_between_puma_variation_matches_loops_and_sees_the_planted_effects():
    got = between_puma_variation(DATA, WORKLOADS)
    for w, g in zip(WORKLOADS, got):
        assert g == pytest.approx(_variation_loops(DATA, w), rel=1e-12), w.id
    # TEN and AGE move with the PUMA in state 1; SEX does not (only sampling noise)
    assert got[0] > 2 * got[2] and got[1] > 2 * got[2]
    # one PUMA per state: nothing to vary
    flat = HierarchicalData.from_arrays(DOMAIN, np.column_stack([DATA.geo[:, 0], np.full(DATA.n_households, 100)]), DATA.group,
                                        DATA.person, DATA.person_offsets)
    assert np.all(between_puma_variation(flat, WORKLOADS) == 0)


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.id)
def test_expected_noise_l1_matches_simulated_gaussian_noise(w):
    """The formula √(2/π)·cells·σ/(G·m) against the L1 of simulated N(0, σ²) noise on the answer,
    normalised by a G-household node's answer total (20,000 draws: the mean within 4 s.e.)."""
    rho_w, households = 0.01, 250.0
    want = expected_noise_l1(DATA, w, "household", rho_w, households)
    sigma = w.sensitivity(DOMAIN, "household")[1] / math.sqrt(2 * rho_w)
    total = households * float(answer(DATA, w).sum()) / DATA.n_households
    draws = np.abs(np.random.default_rng(0).normal(0, sigma, (20_000, w.n_cells(DOMAIN)))).sum(axis=1) / total
    assert abs(draws.mean() - want) < 4 * draws.std() / math.sqrt(len(draws))
    assert expected_noise_l1(DATA, w, "household", 0.0, households) == math.inf


def test_the_rule_keeps_the_minimum_at_small_budgets_and_grows_with_rho_and_size():
    ranked = WORKLOADS[:3]
    low = choose_puma_attributes(DATA, ranked, 1, "household", 1e-6, 300.0, minimum=1, maximum=3)
    assert low.count == 1 and [c[3] for c in low.candidates] == [False, False]
    high = choose_puma_attributes(DATA, ranked, 1, "household", 1e6, 300.0, minimum=1, maximum=3)
    assert high.count == 3
    counts = [choose_puma_attributes(DATA, ranked, 1, "household", r, 300.0, minimum=1, maximum=3).count
              for r in np.geomspace(1e-5, 1e4, 25)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 3
    by_size = [choose_puma_attributes(DATA, ranked, 1, "household", 0.05, g, minimum=1, maximum=3).count
               for g in (10.0, 100.0, 1e3, 1e4, 1e5)]
    assert by_size == sorted(by_size) and by_size[-1] == 3
    # the maximum and the ranking's length bound it; the record is JSON-ready
    assert choose_puma_attributes(DATA, ranked, 1, "household", 1e6, 300.0, minimum=1, maximum=2).count == 2
    assert choose_puma_attributes(DATA, ranked, 1, "household", 1e6, 300.0, minimum=5, maximum=8).count == 3
    none = choose_puma_attributes(DATA, ranked, 1, "household", 0.0, 300.0, minimum=1, maximum=3)  # no PUMA budget
    assert none.count == 1 and [c["expected_noise_l1"] for c in none.to_dict()["candidates"]] == [None, None]
    rec = high.to_dict()
    assert rec["puma_attributes"] == 3 and [c["workload"] for c in rec["candidates"]] == [w.id for w in ranked[1:]]


def test_the_rule_stops_at_the_first_attribute_noisier_than_its_signal():
    """An attribute whose marginal is the same in every PUMA (signal 0) is never added, and the
    attributes ranked after it are not either, whatever their own signal."""
    sizes = DOMAIN.group_attribute("TEN").size
    group = DATA.group.copy()
    node = DATA.geo[:, 0] * 1000 + DATA.geo[:, 1]
    order = np.argsort(node, kind="stable")
    first = np.searchsorted(node[order], node[order])
    rank = np.empty(DATA.n_households, dtype=np.int64)
    rank[order] = np.arange(DATA.n_households) - first  # each household's position within its PUMA
    group[:, DOMAIN.group_index("TEN")] = rank % sizes  # the same shares in every PUMA, to a household ...
    data = HierarchicalData.from_arrays(DOMAIN, DATA.geo, group, DATA.person, DATA.person_offsets)
    ranked = [Workload("person", (), ("SEX",)), Workload("group", ("TEN",)), Workload("person", (), ("AGE",))]
    signal = between_puma_variation(data, ranked)
    assert signal[1] < 0.02 < signal[2]  # ... nearly level everywhere
    rho = 4e-3  # enough for AGE alone at these sizes, not for TEN's residue
    got = choose_puma_attributes(data, ranked, 0, "household", rho, 400.0, minimum=1, maximum=3)
    noise_age = expected_noise_l1(data, ranked[2], "household", rho / 2, 400.0)
    assert noise_age <= signal[2]  # AGE would pass on its own ...
    assert got.count == 1 and [c[3] for c in got.candidates] == [False, False]  # ... but the ranking stops at TEN


def test_the_rule_rejects_bad_bounds():
    with pytest.raises(ValueError, match="minimum"):
        choose_puma_attributes(DATA, WORKLOADS, 0, "household", 1.0, 100.0, minimum=3, maximum=2)
    with pytest.raises(ValueError, match="minimum"):
        choose_puma_attributes(DATA, WORKLOADS, 0, "household", 1.0, 100.0, minimum=0, maximum=2)
    with pytest.raises(ValueError, match="n_pairs"):
        choose_puma_attributes(DATA, WORKLOADS, -1, "household", 1.0, 100.0, minimum=1, maximum=2)


def test_a_prefix_of_the_ranking_is_the_smaller_selection():
    """with_puma_attributes(k) of the largest selection is select_workloads(puma_max_attributes=k),
    workloads and explanation alike; the JSON record reads back to the same selection."""
    wide = select_workloads(DATA, state_max_cells=48, n_triangles=2, puma_max_attributes=6, normalise=True)
    assert len(wide.puma_ranked) >= 3
    assert wide.explanation["puma_attribute_ranking"] == [w.attrs[0] for w in wide.puma_ranked]
    for k in range(1, len(wide.puma_ranked) + 1):
        narrow = select_workloads(DATA, state_max_cells=48, n_triangles=2, puma_max_attributes=k, normalise=True)
        got = wide.with_puma_attributes(k)
        assert got.puma == narrow.puma and got.state == narrow.state
        drop = lambda e: {x: v for x, v in e.items() if x != "puma_attribute_ranking"}  # noqa: E731
        assert drop(got.explanation) == drop(narrow.explanation)
    assert wide.with_puma_attributes(0).puma == [w for w in wide.puma if w not in wide.puma_ranked]  # the pairs alone
    with pytest.raises(ValueError, match="cannot keep"):
        wide.with_puma_attributes(len(wide.puma_ranked) + 1)
    assert WorkloadSelection.from_record(wide.to_record()) == wide
