"""Mutual information on public data and the state / PUMA workload selection (Tao et al. §4.2)."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest

from engine.data._hierarchical_data import HierarchicalData
from engine.queries._queries import Workload
from engine.synthesis._workload_selection import (
    geographic_information,
    maximum_spanning_tree,
    mutual_information,
    normalised_mi,
    pair_completion,
    select_workloads,
)
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)
DATA = random_data(DOMAIN, 400, seed=21, dependence=0.8)


def _mi_loops(pairs):
    """MI (nats) of a list of (a, b) observations, with dictionaries."""
    n = len(pairs)
    ab, a, b = Counter(pairs), Counter(x for x, _ in pairs), Counter(y for _, y in pairs)
    return sum(c / n * math.log((c / n) / ((a[x] / n) * (b[y] / n))) for (x, y), c in ab.items())


def test_mutual_information_matches_brute_force():
    info = mutual_information(DATA)
    d = DOMAIN
    for i, j in itertools.combinations(range(len(info.names)), 2):
        ni, nj = info.names[i], info.names[j]
        obs = []
        for h in range(DATA.n_households):
            persons = range(int(DATA.person_offsets[h]), int(DATA.person_offsets[h + 1]))
            gval = lambda n, h=h: int(DATA.group[h, d.group_index(n)])  # noqa: E731
            pval = lambda n, r: int(DATA.person[r, d.person_index(n)])  # noqa: E731
            ki, kj = info.kinds[i], info.kinds[j]
            if ki == kj == "group":
                obs.append((gval(ni), gval(nj)))
            else:  # person level (person × person, or household attribute joined to each person)
                for r in persons:
                    a = gval(ni) if ki == "group" else pval(ni, r)
                    b = gval(nj) if kj == "group" else pval(nj, r)
                    obs.append((a, b))
        assert info.mi[i, j] == pytest.approx(_mi_loops(obs), abs=1e-12), (ni, nj)
        assert info.mi[j, i] == info.mi[i, j]
    assert np.all(np.diag(info.mi) == 0)


def test_mi_of_identical_and_independent_attributes():
    info = mutual_information(DATA)
    idx = {n: i for i, n in enumerate(info.names)}
    # planted: AGE depends on TEN (household → person), RAC shared in households, R18 on NP
    assert info.mi[idx["TEN"], idx["AGE"]] > 0.2
    assert info.mi[idx["NP"], idx["R18"]] > 0.02
    # SEX is independent of everything (sampling noise only)
    assert info.mi[idx["SEX"]].max() < 0.01
    # a function of an attribute: MI = its entropy (R18 replaced by TEN mod 2), normalised MI = 1
    dup = HierarchicalData.from_arrays(
        DOMAIN, DATA.geo, np.column_stack([DATA.group[:, 0], DATA.group[:, 1], DATA.group[:, 0] % 2]),
        DATA.person, DATA.person_offsets)
    info2 = mutual_information(dup)
    assert info2.mi[idx["TEN"], idx["R18"]] == pytest.approx(info2.entropy[idx["R18"]])
    nmi = normalised_mi(info2)
    assert nmi[idx["TEN"], idx["R18"]] == pytest.approx(1.0)
    assert np.all((nmi >= 0) & (nmi <= 1))


def test_maximum_spanning_tree():
    w = np.array([[0, 5, 1, 0], [5, 0, 3, 2], [1, 3, 0, 4], [0, 2, 4, 0]], float)
    assert maximum_spanning_tree(w) == [(0, 1), (2, 3), (1, 2)]
    allowed = np.ones((4, 4), bool)
    allowed[1, 2] = allowed[2, 1] = False
    assert maximum_spanning_tree(w, allowed) == [(0, 1), (2, 3), (1, 3)]


def test_selection_contract_and_determinism():
    sel = select_workloads(DATA, state_max_cells=48, n_triangles=2)
    ids = [w.id for w in sel.state]
    assert len(ids) == len(set(ids)) > 0 and sel.puma
    assert all(w.n_cells(DOMAIN) <= 48 for w in sel.state)
    levels = {(w.level, bool(w.group_attrs), bool(w.person_attrs)) for w in sel.state}
    assert ("group", True, True) in levels  # group-level "contains"
    assert any(w.level == "person" for w in sel.state) and any(w.level == "group" for w in sel.state)
    # the strongest planted pair is in the tree and in the workloads
    assert "TEN~AGE" in sel.explanation["spanning_tree_edges"]
    assert any({"TEN", "AGE"} <= set(w.attrs) for w in sel.state)
    # PUMA: one-way marginals of attributes not redundant with each other, plus small pairs
    info = mutual_information(DATA)
    nmi = normalised_mi(info)
    idx = {n: i for i, n in enumerate(info.names)}
    one_way = [w.attrs[0] for w in sel.puma if len(w.attrs) == 1]
    assert one_way == sel.explanation["puma_attributes"]
    for a, b in itertools.combinations(one_way, 2):
        assert nmi[idx[a], idx[b]] < 0.5
    assert all(w.n_cells(DOMAIN) <= 16 for w in sel.puma)
    # JSON-serialisable explanation and determinism, also under a permutation of the households
    json.dumps(sel.explanation)
    again = select_workloads(DATA, state_max_cells=48, n_triangles=2)
    perm = DATA.take(np.random.default_rng(0).permutation(DATA.n_households))
    shuffled = select_workloads(perm, state_max_cells=48, n_triangles=2)
    for other in (again, shuffled):
        assert [w.id for w in other.state] == ids and other.puma == sel.puma
        assert json.dumps(other.explanation, sort_keys=True) == json.dumps(sel.explanation, sort_keys=True)


def test_cell_cap_and_forced_contains():
    sel = select_workloads(DATA, state_max_cells=8, n_triangles=3)
    assert all(w.n_cells(DOMAIN) <= 8 for w in sel.state)
    assert any(w.level == "group" and w.group_attrs and w.person_attrs for w in sel.state)


def _geo_brute_force(data: HierarchicalData) -> dict[str, float]:
    """geographic_information by loops: per state, the plug-in MI of (PUMA, attribute) over its
    households or persons less (levels − 1)(PUMAs − 1)/(2n), floored at 0, weighted by the state's n."""
    d = data.domain
    out = {}
    for a in [*d.group, *d.person]:
        is_group = a.name in {g.name for g in d.group}
        obs = []  # (state, puma, value)
        for h in range(data.n_households):
            st, puma = int(data.geo[h, 0]), int(data.geo[h, 1])
            if is_group:
                obs.append((st, puma, int(data.group[h, d.group_index(a.name)])))
            else:
                for r in range(int(data.person_offsets[h]), int(data.person_offsets[h + 1])):
                    obs.append((st, puma, int(data.person[r, d.person_index(a.name)])))
        total = 0.0
        for st in sorted({o[0] for o in obs}):
            pairs = [(pu, v) for s_, pu, v in obs if s_ == st]
            n_pumas, levels = len({pu for pu, _ in pairs}), len({v for _, v in pairs})
            if n_pumas > 1:
                mi = _mi_loops(pairs) - (levels - 1) * (n_pumas - 1) / (2 * len(pairs))
                total += len(pairs) / len(obs) * max(mi, 0.0)
        out[a.name] = total
    return out


def test_geographic_information_matches_brute_force_and_ranks_the_puma_workloads():
    # plant a PUMA effect on AGE (person) and on TEN (household); SEX stays independent of geography
    rng = np.random.default_rng(5)
    geo = DATA.geo.copy()
    geo[:, 1] = 100 + rng.integers(0, 3, size=DATA.n_households)
    group = DATA.group.copy()
    ten = DOMAIN.group_index("TEN")
    shift = rng.random(DATA.n_households) < 0.7
    group[shift, ten] = (geo[shift, 1] - 100) % DOMAIN.group[ten].size
    person = DATA.person.copy()
    age = DOMAIN.person_index("AGE")
    hh = DATA.person_household
    moved = rng.random(person.shape[0]) < 0.6
    person[moved, age] = (geo[hh[moved], 1] - 100) % DOMAIN.person[age].size
    data = HierarchicalData.from_arrays(DOMAIN, geo, group, person, DATA.person_offsets)
    got = dict(zip(mutual_information(data).names, geographic_information(data)))
    want = _geo_brute_force(data)
    for name in want:
        assert got[name] == pytest.approx(want[name], abs=1e-12), name
    assert got["TEN"] > 0.1 and got["AGE"] > 0.1 and got["SEX"] < 0.01
    sel = select_workloads(data, state_max_cells=48, n_triangles=2, puma_max_attributes=2)
    assert set(sel.explanation["puma_attributes"]) == {"TEN", "AGE"}
    # one PUMA per state: no geographic information, the PUMA attributes fall back to entropy order
    flat = HierarchicalData.from_arrays(DOMAIN, np.column_stack([geo[:, 0], np.full(len(geo), 100)]), group, person,
                                        DATA.person_offsets)
    assert np.all(geographic_information(flat) == 0)


def test_normalise_and_first_give_every_non_partition_workload_its_form():
    plain = select_workloads(DATA, state_max_cells=48, n_triangles=2)
    sel = select_workloads(DATA, state_max_cells=48, n_triangles=2, person_first=2, normalise=True)
    for a, b in ((plain.state, sel.state), (plain.puma, sel.puma)):
        assert [(w.level, w.attrs) for w in a] == [(w.level, w.attrs) for w in b]  # the same attribute sets
        for w in b:
            assert w.normalised == (not w.is_partition())
            assert w.first == (2 if w.level == "person" else 0)
    assert sel.explanation["params"]["normalise"] is True


def _held_pairs(workloads):
    """Every (frozenset of two attributes) a person-level workload holds, the size counted as the group attribute it is."""
    out = set()
    for w in workloads:
        if w.level == "person":
            out |= {frozenset(p) for p in itertools.combinations(w.person_attrs, 2)}
            out |= {frozenset((g, a)) for g in w.group_attrs for a in w.person_attrs if g == DOMAIN.size_attribute}
    return out


def test_pair_completion_holds_every_person_pair_and_size_pair_once():
    persons = [a.name for a in DOMAIN.person]
    wanted = {frozenset(p) for p in itertools.combinations(persons, 2)} | {frozenset(("NP", a)) for a in persons}
    for chosen in ([], [Workload("person", (), ("SEX", "AGE", "RAC"))], [Workload("person", ("NP",), ("AGE",)), Workload("group", ("NP",), ("SEX",))]):
        added = pair_completion(DOMAIN, chosen, 1024)
        pairs = [frozenset(w.group_attrs + w.person_attrs) for w in added]
        assert all(w.level == "person" and len(w.attrs) == 2 for w in added)
        assert len(pairs) == len(set(pairs))  # once each
        assert not set(pairs) & _held_pairs(chosen)  # nothing a chosen person-level workload holds
        assert set(pairs) | _held_pairs(chosen) == wanted  # and together every pair
    # a group-level "contains" workload is not a marginal of the persons: NP~SEX is still added
    assert Workload("person", ("NP",), ("SEX",)) in pair_completion(DOMAIN, [Workload("group", ("NP",), ("SEX",))], 1024)
    # the cell cap: NP (4) × AGE (4) = 16 cells, dropped under a cap of 12, the person pairs (≤ 12 cells) kept
    capped = pair_completion(DOMAIN, [], 12)
    assert Workload("person", ("NP",), ("AGE",)) not in capped and Workload("person", (), ("AGE", "RAC")) in capped


def test_complete_pairs_extends_the_state_level_only():
    plain = select_workloads(DATA, state_max_cells=48, n_triangles=2, normalise=True)
    sel = select_workloads(DATA, state_max_cells=48, n_triangles=2, normalise=True, complete_pairs=True)
    assert sel.state[: len(plain.state)] == plain.state and sel.puma == plain.puma and sel.puma_ranked == plain.puma_ranked
    added = sel.state[len(plain.state):]
    assert added and all(w.normalised for w in added)  # measured in the selection's form
    assert [w.id for w in added] == [w.id for w in (Workload(x.level, x.group_attrs, x.person_attrs, 0, True)
                                                     for x in pair_completion(DOMAIN, plain.state, 48))]
    assert sel.explanation["completed_pairs"] == ["~".join(w.group_attrs + w.person_attrs) for w in added]
    assert sel.explanation["params"]["complete_pairs"] is True and plain.explanation["completed_pairs"] == []
    persons = [a.name for a in DOMAIN.person]
    assert {frozenset(p) for p in itertools.combinations(persons, 2)} <= _held_pairs(sel.state)
    assert sel.completed == added and plain.completed == []  # named, for the adaptive rounds (engine.synthesis._node)
    # the record round trip keeps them, and so does the PUMA attribute rule's cut
    back = type(sel).from_record(sel.to_record())
    assert back.state == sel.state and back.completed == sel.completed
    assert sel.with_puma_attributes(1).completed == sel.completed
