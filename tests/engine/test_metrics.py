import numpy as np

from engine.metrics import answers_by_node, k_way_workloads, query_errors, two_way_l1
from engine.queries import Workload, normalised_answer
from tests.engine.test_hierarchical_data import random_data


def test_answers_by_node_equal_per_node_answers():
    data = random_data(np.random.default_rng(0), n=200)
    nodes = np.unique(data.geo, axis=0)
    for w in k_way_workloads(data.domain, 2, "group") + k_way_workloads(data.domain, 2, "person"):
        got = answers_by_node(data, w, "PUMA", nodes)
        for i, node in enumerate(nodes):
            sub = data.select(np.all(data.geo == node, axis=1))
            assert np.allclose(got[i], normalised_answer(sub, w))


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
