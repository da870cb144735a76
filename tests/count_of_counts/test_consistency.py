import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from engine.count_of_counts import Hierarchy, RunsTable, consistent_histograms, estimate_hc, top_down
from engine.count_of_counts._consistency import leaves_only, match_runs
from engine.count_of_counts._estimators import hc_query

from .helpers import double_geometric, laplace_variance, random_tree


def runs_of(node, sizes, var=None):
    u, c = np.unique(sizes, return_counts=True)
    v = np.ones(u.size) if var is None else var(u, c)
    return RunsTable(np.full(u.size, node), u, c, v)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(0, 10**6))
def test_matching_is_optimal(n_children, seed):
    rng = np.random.default_rng(seed)
    child_sizes = [rng.integers(0, 7, rng.integers(0, 9)) for _ in range(n_children)]
    G = sum(c.size for c in child_sizes)
    parent_sizes = np.sort(rng.integers(0, 7, G))
    P = runs_of(0, parent_sizes)
    C = RunsTable.concat([runs_of(i + 1, c) for i, c in enumerate(child_sizes)])
    parent_of = np.array([-1] + [0] * n_children)
    m = match_runs(P, C, parent_of)
    # a perfect matching between groups
    assert np.array_equal(np.bincount(m.parent_entry, m.count, minlength=len(P)), P.count)
    assert np.array_equal(np.bincount(m.child_entry, m.count, minlength=len(C)), C.count)
    assert np.all(m.count > 0)
    # with least cost (brute force over groups, expanded only here)
    if G:
        allc = np.concatenate(child_sizes)
        cost = np.abs(parent_sizes[:, None] - allc[None, :])
        r, c = linear_sum_assignment(cost)
        assert m.cost(P, C) == cost[r, c].sum()


def test_matching_many_parents_at_once():
    rng = np.random.default_rng(5)
    h = random_tree(rng, (3, 6), (1, 5))
    ids1 = h.level_range(1)
    P, C, bf = [], [], 0
    for p in ids1:
        kids = np.flatnonzero(h.parent == p)
        cs = [rng.integers(0, 9, rng.integers(0, 12)) for _ in kids]
        G = sum(c.size for c in cs)
        ps = np.sort(rng.integers(0, 9, G))
        P.append(runs_of(p, ps))
        C += [runs_of(k, c) for k, c in zip(kids, cs)]
        if G:
            cost = np.abs(ps[:, None] - np.concatenate(cs)[None, :])
            r, c = linear_sum_assignment(cost)
            bf += cost[r, c].sum()
    P, C = RunsTable.concat(P), RunsTable.concat(C)
    assert match_runs(P, C, h.parent).cost(P, C) == bf


def test_proportional_tie_split():
    # paper, Section 5.2.1: 300 parent groups of size 1; children hold 200/100/100 of size 1
    P = RunsTable([0, 0], [1, 2], [300, 100], [1.0, 1.0])
    C = RunsTable([1, 2, 3], [1, 1, 1], [200, 100, 100], [1.0, 1.0, 1.0])
    m = match_runs(P, C, np.array([-1, 0, 0, 0]))
    first = {int(c): int(n) for p, c, n in zip(m.parent_entry, m.child_entry, m.count) if p == 0}
    assert first == {0: 150, 1: 75, 2: 75}
    # rounding by largest remainder: 7 split over 2/2/2 -> 3/2/2 (ties to the first child)
    P = RunsTable([0, 0], [1, 2], [7, 5], [1.0, 1.0])
    C = RunsTable([1, 2, 3], [1, 1, 1], [4, 4, 4], [1.0, 1.0, 1.0])
    m = match_runs(P, C, np.array([-1, 0, 0, 0]))
    first = sorted(int(n) for p, n in zip(m.parent_entry, m.count) if p == 0)
    assert sum(first) == 7 and first == [2, 2, 3]


def _noisy_estimates(h, rng, K=20, eps=0.7):
    Hl = np.zeros((h.n_nodes, K + 1), np.int64)
    for v in h.leaves():
        Hl[v] = np.bincount(np.minimum(rng.geometric(0.4, rng.integers(0, 300)), K), minlength=K + 1)
    H = h.aggregate_up(Hl)
    G = H.sum(1)
    q = hc_query(H, K, "person")
    noisy = double_geometric(q.values, 1 / eps, rng)
    return H, G, estimate_hc(noisy, G, laplace_variance(1 / eps), node_ids=np.arange(h.n_nodes))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(["weighted", "average"]))
def test_top_down_properties(seed, merge):
    rng = np.random.default_rng(seed)
    h = random_tree(rng)
    K = 20
    H, G, est = _noisy_estimates(h, rng, K)
    final = top_down(h, est, K, merge)
    assert set(np.unique(final.node)) <= set(h.leaves())
    out = consistent_histograms(h, final, K)
    assert out.dtype.kind == "i" and np.all(out >= 0)
    assert np.array_equal(out.sum(1), G)
    for v in range(h.n_nodes):
        kids = np.flatnonzero(h.parent == v)
        if kids.size:
            assert np.array_equal(out[kids].sum(0), out[v])
    lo = consistent_histograms(h, leaves_only(h, est), K)
    assert np.array_equal(lo.sum(1), G)


def test_top_down_unbalanced_and_exact():
    # a leaf at level 1 next to a subtree; exact (noiseless) estimates are kept exactly
    h = Hierarchy.from_parent_map({"r": None, "a": "r", "b": "r", "b1": "b", "b2": "b"})
    K = 6
    Hl = np.zeros((5, K + 1), np.int64)
    Hl[h.index["a"]] = [0, 3, 2, 0, 0, 0, 1]
    Hl[h.index["b1"]] = [0, 1, 1, 1, 0, 0, 0]
    Hl[h.index["b2"]] = [0, 0, 4, 0, 2, 0, 0]
    H = h.aggregate_up(Hl)
    est = estimate_hc(hc_query(H, K, "person").values, H.sum(1), 2.0, node_ids=np.arange(5))
    out = consistent_histograms(h, top_down(h, est, K), K)
    assert np.array_equal(out, H)


def test_weighted_merge_uses_variances():
    h = Hierarchy.from_parent_map({"r": None, "c": "r"})
    est = RunsTable([0, 1], [10, 4], [1, 1], [1.0, 3.0])  # parent is 3x more precise
    out = top_down(h, est, K=20)
    assert out.size.tolist() == [8]  # (10/1 + 4/3) / (1 + 1/3) = 8.5 -> 8 (half to even)
    out = top_down(h, est, K=20, merge="average")
    assert out.size.tolist() == [7]
