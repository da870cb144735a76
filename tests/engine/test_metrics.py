import numpy as np
import pytest

from engine.queries._metrics import answers_by_node, k_way_workloads, query_errors, query_errors_by_level, two_way_l1, two_way_l1_by_candidate
from engine.queries._queries import Workload, normalised_answer
from tests.engine.test_hierarchical_data import random_data


def test_answers_by_node_equal_per_node_answers():
    data = random_data(np.random.default_rng(0), n=200)
    nodes = np.unique(data.geo, axis=0)
    for w in k_way_workloads(data.domain, 2, "group") + k_way_workloads(data.domain, 2, "person"):
        got = answers_by_node(data, w, "PUMA", nodes)
        for i, node in enumerate(nodes):
            sub = data.select(np.all(data.geo == node, axis=1))
            assert np.allclose(got[i], normalised_answer(sub, w))


def test_answers_by_node_leave_out_the_households_of_unlisted_nodes():
    data = random_data(np.random.default_rng(3), n=300)
    nodes = np.unique(data.geo, axis=0)
    listed = nodes[::2]  # every other node: the rest's households belong to no listed node
    workloads = k_way_workloads(data.domain, 2, "group") + k_way_workloads(data.domain, 2, "person")
    workloads += [Workload("group", ("NP",), ("SEX",)), Workload("person", ("NP",), ("SEX",), normalised=True)]
    for w in workloads:
        got = answers_by_node(data, w, "PUMA", listed)
        for i, node in enumerate(listed):
            assert np.allclose(got[i], normalised_answer(data.select(np.all(data.geo == node, axis=1)), w))


def test_errors_zero_on_identical_data_and_positive_otherwise():
    rng = np.random.default_rng(1)
    a, b = random_data(rng, n=300), random_data(rng, n=300)
    ws = k_way_workloads(a.domain, 3, "person")
    assert query_errors(a, a, ws, "PUMA")["max_error"] == 0
    e = query_errors(a, b, ws, "PUMA")
    assert 0 < e["mean_error"] <= e["max_error"] <= 1
    assert two_way_l1(a, a, "PUMA", n_pairs=5)["mean_l1"] == 0
    assert 0 < two_way_l1(a, b, "PUMA", n_pairs=5)["mean_l1"] <= 2


def test_k_way_workloads_counts():
    d = random_data(np.random.default_rng(2)).domain  # 2 group + 2 person attributes
    assert len(k_way_workloads(d, 3, "group")) == 4
    assert len(k_way_workloads(d, 3, "person")) == 4  # every triple has a person attribute
    assert all(isinstance(w, Workload) for w in k_way_workloads(d, 2, "group", limit=3))


def test_query_errors_by_level_equal_a_per_node_brute_force():
    """Several candidates and levels at once equal the definition: per node of the level, the
    max and mean |difference| of normalised answers over every cell of every workload, averaged
    over the nodes (the truth's nodes; a node a candidate lacks answers zeros). A state's counts are
    its PUMAs' sums, except for a candidate with households in a PUMA the truth lacks (``d``: they
    count in their state, not in any PUMA)."""
    rng = np.random.default_rng(4)
    true, b, c, d = random_data(rng, n=150), random_data(rng, n=120), random_data(rng, n=90), random_data(rng, n=90)
    geo = d.geo.copy()
    geo[:15, 1] = 900
    d = d.with_geo(geo)
    ws = k_way_workloads(true.domain, 2, "group") + k_way_workloads(true.domain, 2, "person")
    got = query_errors_by_level(true, {"b": b, "c": c, "d": d}, ws, ["PUMA", "ST"])
    for name, synth in (("b", b), ("c", c), ("d", d)):
        for level, k in (("ST", 1), ("PUMA", 2)):
            maxes, means = [], []
            for node in np.unique(true.geo[:, :k], axis=0):
                diffs = []
                for w in ws:
                    t = normalised_answer(true.select(np.all(true.geo[:, :k] == node, axis=1)), w).reshape(-1)
                    mask = np.all(synth.geo[:, :k] == node, axis=1)
                    s = normalised_answer(synth.select(mask), w).reshape(-1) if mask.any() else np.zeros_like(t)
                    diffs.append(np.abs(t - s))
                d = np.concatenate(diffs)
                maxes.append(d.max())
                means.append(d.mean())
            assert got[name][level]["max_error"] == pytest.approx(np.mean(maxes))
            assert got[name][level]["mean_error"] == pytest.approx(np.mean(means))
            assert query_errors(true, synth, ws, level) == got[name][level]


def test_two_way_l1_by_candidate_equals_a_per_node_brute_force():
    """Every candidate at once equals the definition on the same pairs: per node of the truth, the
    L1 distance of the normalised 2-way person-level marginal (household attributes joined to
    their persons), averaged over pairs and nodes; a candidate's persons outside the truth's nodes
    are ignored and a node it lacks counts as an all-zero marginal."""
    rng = np.random.default_rng(7)
    true, other = random_data(rng, n=120), random_data(rng, n=90)
    geo = other.geo.copy()
    geo[:20, 1] = 900  # households in a PUMA the truth does not have
    geo[geo[:, 1] == 300, 1] = 200  # and no household in PUMA 300
    candidates = {"same": true, "other": other.with_geo(geo)}
    got = two_way_l1_by_candidate(true, candidates, "PUMA", n_pairs=6, rng=np.random.default_rng(3))
    pair_rng = np.random.default_rng(3)
    pairs = [tuple(pair_rng.choice(4, 2, replace=False)) for _ in range(6)]
    sizes = list(true.domain.group_sizes) + list(true.domain.person_sizes)

    def joined(d):  # one row per person: group attributes, then person attributes
        return np.concatenate([d.group[d.person_household], d.person], axis=1)

    def marginal(d, node, a, b):
        rows = joined(d)[np.all(d.geo[d.person_household] == node, axis=1)]
        m = np.zeros((sizes[a], sizes[b]))
        for r in rows:
            m[r[a], r[b]] += 1
        return m / max(m.sum(), 1)

    nodes = np.unique(true.geo, axis=0)
    for name, d in candidates.items():
        per = [np.mean([np.abs(marginal(true, n, a, b) - marginal(d, n, a, b)).sum() for a, b in pairs]) for n in nodes]
        assert got[name]["mean_l1"] == pytest.approx(np.mean(per)) and got[name]["max_l1"] == pytest.approx(np.max(per))
    assert got["same"]["mean_l1"] == 0 and got["other"]["mean_l1"] > 0
    assert two_way_l1(true, candidates["other"], "PUMA", n_pairs=6, rng=np.random.default_rng(3)) == got["other"]
