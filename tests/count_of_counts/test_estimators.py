import math

import numpy as np
import pytest
from scipy.optimize import minimize

from engine.count_of_counts import estimate_hc, k_from_noisy_max, largest_remainder_round
from engine.count_of_counts._estimators import estimate_hg, estimate_naive, hc_query, hg_query, max_size_query, naive_query, project_simplex
from engine.count_of_counts._forms import emd

from .helpers import double_geometric, laplace_variance


def neighbours(sizes, K):
    """All databases differing by one person (added to or removed from one group)."""
    for g in range(sizes.size):
        for d in (-1, 1):
            s = sizes.copy()
            s[g] += d
            if s[g] >= 0:
                yield s


def hist(sizes, K):
    return np.bincount(np.minimum(sizes, K), minlength=K + 1)


def test_sensitivities_bruteforce():
    rng = np.random.default_rng(0)
    K = 5
    for _ in range(30):
        sizes = rng.integers(0, 8, rng.integers(1, 8))
        H = hist(sizes, K)
        base = {
            "naive": naive_query(H, K, "person"),
            "hc": hc_query(H, K, "person"),
            "hg": hg_query(H, K, "person"),
            "max": max_size_query(np.bincount(sizes), "person"),
        }
        for s2 in neighbours(sizes, K):
            H2 = hist(s2, K)
            for name, q2 in (
                ("naive", naive_query(H2, K, "person")),
                ("hc", hc_query(H2, K, "person")),
                ("hg", hg_query(H2, K, "person")),
                ("max", max_size_query(np.bincount(s2), "person")),
            ):
                assert np.abs(base[name].values - q2.values).sum() <= base[name].l1_sensitivity


def test_household_unit_sensitivities_bruteforce():
    """Neighbours under the household unit: one group of any size 1..M added or removed. The
    reported L1 sensitivities bound every change and are attained (hc: K-1, a one-person group)."""
    rng = np.random.default_rng(3)
    K, M = 5, 8
    worst = {"naive": 0, "hc": 0, "max": 0}
    for _ in range(30):
        sizes = rng.integers(1, M + 1, rng.integers(0, 8))
        neighbours_ = [np.append(sizes, s) for s in range(1, M + 1)] + [np.delete(sizes, i) for i in range(sizes.size)]
        q = {"naive": naive_query(hist(sizes, K), K, "household"), "hc": hc_query(hist(sizes, K), K, "household"),
             "max": max_size_query(np.bincount(sizes, minlength=1), "household", max_size=M)}
        for s2 in neighbours_:
            q2 = {"naive": naive_query(hist(s2, K), K, "household"), "hc": hc_query(hist(s2, K), K, "household"),
                  "max": max_size_query(np.bincount(s2, minlength=1), "household", max_size=M)}
            for name in q:
                d = np.abs(q[name].values - q2[name].values).sum()
                assert d <= q[name].l1_sensitivity, (name, sizes, s2)
                worst[name] = max(worst[name], d)
    assert worst == {"naive": 1, "hc": K - 1, "max": M}
    assert hc_query(hist(np.array([2]), K), K, "household").l1_sensitivity == K - 1 != hc_query(hist(np.array([2]), K), K, "person").l1_sensitivity
    with pytest.raises(ValueError, match="household unit"):
        hg_query(hist(np.array([2]), K), K, "household")
    with pytest.raises(ValueError, match="max_size"):
        max_size_query(np.bincount([2]), "household")
    with pytest.raises(ValueError, match="privacy unit"):
        hc_query(hist(np.array([2]), K), K, "persons")


def test_projection_is_nnls():
    rng = np.random.default_rng(1)
    for _ in range(20):
        y = rng.normal(0, 5, 7)
        G = rng.integers(0, 30)
        x = project_simplex(y, G)
        assert np.all(x >= 0) and abs(x.sum() - G) < 1e-9
        res = minimize(lambda z, y=y: ((z - y) ** 2).sum(), np.full(7, G / 7), bounds=[(0, None)] * 7,
                       constraints=[{"type": "eq", "fun": lambda z, G=G: z.sum() - G}], method="SLSQP")
        assert ((x - y) ** 2).sum() <= res.fun + 1e-6


def test_largest_remainder():
    x = np.array([[0.5, 1.5, 1.0], [2.2, 0.4, 0.4]])
    r = largest_remainder_round(x, [3, 3])
    assert r.tolist() == [[1, 1, 1], [2, 1, 0]]
    assert np.array_equal(r.sum(1), [3, 3])


def test_k_from_noisy_max():
    assert k_from_noisy_max(100, math.sqrt(2)) == math.ceil(100 + 5 * math.sqrt(2))
    assert k_from_noisy_max(-50, math.sqrt(2)) == 1
    with pytest.raises(ValueError):
        k_from_noisy_max(10, 0.0)


def _true(rng, n, K):
    return np.stack([hist(np.minimum(rng.geometric(0.35, rng.integers(50, 500)), K), K) for _ in range(n)])


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_hc_estimator(norm):
    rng = np.random.default_rng(2)
    K, eps = 25, 0.5
    H = _true(rng, 6, K)
    G = H.sum(1)
    q = hc_query(H, K, "person")
    noisy = double_geometric(q.values, q.l1_sensitivity / eps, rng)
    v = laplace_variance(q.l1_sensitivity / eps)
    runs, Hh = estimate_hc(noisy, G, v, norm=norm, node_ids=np.arange(10, 16), return_histograms=True)
    assert Hh.dtype.kind == "i" and np.all(Hh >= 0) and np.array_equal(Hh.sum(1), G)
    assert np.array_equal(runs.histograms(np.arange(10, 16), K), Hh)
    assert np.allclose(runs.var, (4 / eps**2) / runs.count)  # the paper's Section 5.1.2 rule
    # the run variances follow the measurement's noise variance, whatever the mechanism (a Gaussian
    # of σ: 2σ² / count); a variance that is not positive and finite is refused
    gauss = estimate_hc(noisy, G, 9.0, norm=norm)
    assert np.allclose(gauss.var, 18.0 / gauss.count)
    for bad in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="noise variance"):
            estimate_hc(noisy, G, bad, norm=norm)
    # noiseless input is recovered exactly
    _, Hx = estimate_hc(q.values, G, v, norm=norm, return_histograms=True)
    assert np.array_equal(Hx, H)
    # and the estimate beats the naive baseline on average
    rn, Hn = estimate_naive(double_geometric(H, 2 / eps, rng), G, laplace_variance(2 / eps), return_histograms=True)
    assert np.all(Hn >= 0) and np.array_equal(Hn.sum(1), G)
    assert np.mean([emd(a, b) for a, b in zip(H, Hh)]) < np.mean([emd(a, b) for a, b in zip(H, Hn)])


def test_hg_estimator():
    rng = np.random.default_rng(3)
    K, eps = 25, 1.0
    H = _true(rng, 4, K)
    vecs = [double_geometric(hg_query(h, K, "person").values, 1 / eps, rng) for h in H]
    runs = estimate_hg(vecs, K, laplace_variance(1 / eps))
    est = runs.histograms(np.arange(4), K)
    assert np.all(est >= 0) and np.array_equal(est.sum(1), H.sum(1))
    assert runs.size.min() >= 0 and runs.size.max() <= K
    # variance 2/(eps^2 s) for a block of s groups: count is a multiple of 2/(eps^2 var)
    s = 2 / (eps**2 * runs.var)
    assert np.allclose(s, np.round(s)) and np.all(runs.count % np.round(s).astype(int) == 0)
    exact = estimate_hg([hg_query(h, K, "person").values for h in H], K, laplace_variance(1 / eps)).histograms(np.arange(4), K)
    assert np.array_equal(exact, H)
    # concatenated form with offsets gives the same answer
    offs = np.concatenate([[0], np.cumsum([v.size for v in vecs])])
    r2 = estimate_hg(np.concatenate(vecs), K, laplace_variance(1 / eps), offsets=offs)
    assert np.array_equal(r2.histograms(np.arange(4), K), est)
