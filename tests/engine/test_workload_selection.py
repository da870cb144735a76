"""Mutual information on public data and the state / PUMA workload selection (Tao et al. §4.2)."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest

from engine.hierarchical_data import HierarchicalData
from engine.workload_selection import maximum_spanning_tree, mutual_information, normalised_mi, select_workloads
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
    # PUMA: one-way marginals of roughly independent attributes, plus small pairs
    info = mutual_information(DATA)
    nmi = normalised_mi(info)
    idx = {n: i for i, n in enumerate(info.names)}
    one_way = [w.attrs[0] for w in sel.puma if len(w.attrs) == 1]
    assert one_way == sel.explanation["puma_independent_attributes"]
    for a, b in itertools.combinations(one_way, 2):
        assert nmi[idx[a], idx[b]] < 0.05
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
