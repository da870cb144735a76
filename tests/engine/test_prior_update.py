"""Prior update (Tao et al. Alg. 1 / Def. 3.1), entropy projections, PMW-Pub and sampling."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import null_space
from scipy.optimize import linprog, minimize

from engine.prior_update import (
    Measurement,
    entropy_projection,
    household_order,
    kl_divergence,
    least_relative_entropy_update,
    noisy_total_to_count,
    normalise_counts,
    pmw_pub,
    prior_update,
    project_simplex_l1,
    project_to_hull_l1,
    sample_households,
)
from engine.queries import Workload, answer
from engine.support import Support
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)


def _lp_simplex_l1(y, total, partial, allowed):
    """min Σe s.t. e ≥ ±(x − y), x ≥ 0, Σx = total (≤ if partial), x = 0 off ``allowed``."""
    n = y.size
    I = np.eye(n)
    A_ub = np.block([[I, -I], [-I, -I]])
    b_ub = np.concatenate([y, -y])
    row = np.concatenate([np.ones(n), np.zeros(n)])[None, :]
    bounds = [(0, None if a else 0) for a in allowed] + [(0, None)] * n
    kw = dict(A_ub=np.vstack([A_ub, row]), b_ub=np.concatenate([b_ub, [total]])) if partial else dict(
        A_ub=A_ub, b_ub=b_ub, A_eq=row, b_eq=[total])
    res = linprog(np.concatenate([np.zeros(n), np.ones(n)]), bounds=bounds, method="highs", **kw)
    return res.fun


@pytest.mark.parametrize("method", ["euclidean", "proportional"])
def test_simplex_l1_projection_is_lp_optimal(method):
    rng = np.random.default_rng(1)
    for trial in range(150):
        n = int(rng.integers(2, 15))
        y = rng.normal(1.0 / n, rng.choice([0.01, 0.1, 0.5]), size=n)
        if trial % 7 == 0:
            y = -np.abs(y)  # nothing positive: the fallback spreading
        partial = bool(trial % 2)
        allowed = rng.random(n) < 0.8
        allowed[0] = True
        x = project_simplex_l1(y, partial=partial, allowed=allowed, method=method)
        assert np.all(x >= 0) and np.all(x[~allowed] == 0)
        if partial:
            assert x.sum() <= 1 + 1e-12
        else:
            assert x.sum() == pytest.approx(1.0)
        assert np.abs(x - y).sum() == pytest.approx(_lp_simplex_l1(y, 1.0, partial, allowed), abs=1e-9)


def test_simplex_projection_choices():
    y = np.array([0.5, 0.4, 0.3, -0.1, 0.02])
    e = project_simplex_l1(y, method="euclidean")
    p = project_simplex_l1(y, method="proportional")
    np.testing.assert_allclose(p, np.array([0.5, 0.4, 0.3, 0, 0.02]) / 1.22)
    assert e[4] == 0 and e[0] - e[1] == pytest.approx(0.1)  # common threshold, small noise cell removed
    # a feasible answer is its own projection; a partial workload keeps a sub-unit sum untouched
    f = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_simplex_l1(f), f)
    np.testing.assert_allclose(project_simplex_l1(np.array([0.2, -0.1, 0.3]), partial=True), [0.2, 0, 0.3])
    np.testing.assert_allclose(project_simplex_l1(np.array([-1.0, -1.0]), fallback=np.array([1.0, 3.0])), [0.25, 0.75])


def _kl_argmin(p, A, y):
    """Brute force KL(q‖p) minimisation s.t. A q = y, Σq = 1 with a generic scipy optimiser (BFGS on
    the dual max_λ λᵀy − log Σ p e^{λᵀa}, dense matrices, no use of the engine's structure)."""
    keep = p > 0
    pk, Ak = p[keep], A[:, keep]

    def kl(q):
        q = np.maximum(q, 1e-300)
        return float(np.sum(q * np.log(q / pk)))

    def dual(l):
        s_ = np.log(pk) + Ak.T @ l
        m = s_.max()
        return m + np.log(np.exp(s_ - m).sum()) - l @ y

    res = minimize(dual, np.zeros(A.shape[0]), method="BFGS", options={"gtol": 1e-12, "maxiter": 10_000})
    s_ = np.log(pk) + Ak.T @ res.x
    qd = np.exp(s_ - s_.max())
    qd /= qd.sum()
    assert np.allclose(Ak @ qd, y, atol=1e-7), "brute force found no feasible optimum"
    best = qd
    out = np.zeros_like(p)
    out[keep] = best
    return out


def test_definition_3_1_equals_brute_force_kl_minimisation():
    rng = np.random.default_rng(2)
    for trial in range(25):
        N, C = 9, 3
        p = rng.dirichlet(np.ones(N))
        cells = rng.integers(0, C, size=N)
        partial = trial % 2 == 1
        if partial:
            cells[rng.random(N) < 0.3] = -1
            cells[0] = -1
        for c in range(C):
            cells[1 + c] = c  # every row has a point
        y = rng.dirichlet(np.ones(C + (1 if partial else 0)))[:C]
        A = np.stack([(cells == c).astype(float) for c in range(C)])
        q = least_relative_entropy_update(p, cells, y)
        np.testing.assert_allclose(A @ q, y, atol=1e-12)
        assert q.sum() == pytest.approx(1.0)
        ref = _kl_argmin(p, A, y)
        assert kl_divergence(q, p) <= kl_divergence(ref, p) + 1e-6
        np.testing.assert_allclose(q, ref, atol=1e-5)


def test_definition_3_1_cases_2_and_4():
    # case 2: a row whose points have zero prior mass gets its answer spread evenly
    p = np.array([0.5, 0.5, 0.0, 0.0, 0.0])
    cells = np.array([0, 0, 1, 1, -1])
    q = least_relative_entropy_update(p, cells, np.array([0.6, 0.3]))
    np.testing.assert_allclose(q, [0.3, 0.3, 0.15, 0.15, 0.1])  # case 4 for the uncovered point
    # case 3: uncovered points keep their relative prior mass
    p = np.array([0.2, 0.2, 0.3, 0.3])
    q = least_relative_entropy_update(p, np.array([0, 0, -1, -1]), np.array([0.1]))
    np.testing.assert_allclose(q, [0.05, 0.05, 0.45, 0.45])
    with pytest.raises(ValueError):
        least_relative_entropy_update(p, np.array([0, 0, 0, 0]), np.array([0.5, 0.2]))


def _tiny_support(n=14, seed=4):
    return Support.from_data(random_data(DOMAIN, n, seed=seed))


@pytest.mark.parametrize(
    "w",
    [Workload("group", ("TEN",), ("AGE",)), Workload("person", ("R18",), ("SEX",)), Workload("group", (), ("RAC",))],
    ids=lambda w: w.id,
)
def test_entropy_projection_equals_brute_force(w):
    rng = np.random.default_rng(5)
    s = _tiny_support()
    A = s.incidence(w).toarray()
    P = s.patterns(w)
    for _ in range(3):
        q = rng.dirichlet(np.ones(s.n_support))
        target = rng.dirichlet(np.ones(s.n_support))
        y = A @ target
        z, info = entropy_projection(q, P, y, interior=0.0, tol=1e-12)
        assert info.converged
        np.testing.assert_allclose(A @ z, y, atol=1e-9)
        ref = _kl_argmin(q, A, y)
        assert kl_divergence(z, q) <= kl_divergence(ref, q) + 1e-6
        np.testing.assert_allclose(z, ref, atol=1e-4)


def test_entropy_projection_reduces_to_definition_3_1_on_partitions():
    rng = np.random.default_rng(6)
    s = Support.from_data(random_data(DOMAIN, 200, seed=6))
    w = Workload("group", ("TEN", "NP"))
    cells = s.cache.partition_cells(w)
    q = rng.dirichlet(np.ones(s.n_support))
    y = project_simplex_l1(rng.random(w.n_cells(DOMAIN)), allowed=np.bincount(cells, minlength=12) > 0)
    z, info = entropy_projection(q, s.patterns(w), y, interior=0.0)
    np.testing.assert_allclose(z, least_relative_entropy_update(q, cells, y), atol=1e-10)


def test_hull_projection_is_l1_optimal_over_the_support():
    rng = np.random.default_rng(7)
    s = _tiny_support(n=25, seed=8)
    for w in [Workload("group", ("R18",), ("AGE",)), Workload("person", (), ("AGE", "SEX"))]:
        A = s.incidence(w).toarray()
        P = s.patterns(w)
        C, N = A.shape
        for _ in range(5):
            y_noisy = A @ rng.dirichlet(np.ones(N)) + rng.normal(0, 0.2, C)
            ref = s.answer(w)
            y_star, L = project_to_hull_l1(P.matrix, y_noisy, reference=ref)
            # brute-force LP over households
            I = np.eye(C)
            res = linprog(np.concatenate([np.zeros(N), np.ones(C)]),
                          A_ub=np.block([[A, -I], [-A, -I]]), b_ub=np.concatenate([y_noisy, -y_noisy]),
                          A_eq=np.concatenate([np.ones(N), np.zeros(C)])[None], b_eq=[1], method="highs")
            assert L == pytest.approx(res.fun, abs=1e-9)
            assert np.abs(y_star - y_noisy).sum() == pytest.approx(res.fun, abs=1e-7)
            # y* is producible: some distribution on the support answers it exactly
            feas = linprog(np.zeros(N), A_eq=np.vstack([A, np.ones(N)]), b_eq=np.concatenate([y_star, [1]]),
                           bounds=(0, None), method="highs")
            assert feas.status == 0


WORKLOADS = [
    Workload("group", ("TEN", "NP")),
    Workload("group", ("R18",)),
    Workload("group", ("NP",), ("AGE",)),
    Workload("person", ("TEN",), ("AGE",)),
    Workload("person", (), ("SEX", "RAC")),
]


def _target_measurements(s: Support, x: np.ndarray, workloads):
    return [Measurement(w, s.answer(w, x) / x.sum()) for w in workloads]


def test_noiseless_update_reproduces_answers_with_least_kl():
    rng = np.random.default_rng(9)
    s = Support.from_data(random_data(DOMAIN, 150, seed=10))
    prior = rng.dirichlet(np.full(s.n_support, 2.0))
    x = prior * np.exp(rng.normal(0, 0.7, s.n_support))
    x /= x.sum()
    ws = [WORKLOADS[i] for i in (0, 1, 3, 4)]  # two partitions, two person-level workloads
    res = prior_update(s, _target_measurements(s, x, ws), prior=prior, T=150, tol=1e-8)
    q = res.weights
    assert len(res.history) < 150  # stopped on tolerance
    for w in ws:
        np.testing.assert_allclose(s.answer(w, q), s.answer(w, x), atol=1e-8)
    # KL(q‖prior) is no larger than that of other distributions with the same answers
    A = np.vstack([s.incidence(w).toarray() for w in ws] + [np.ones((1, s.n_support))])
    Z = null_space(A)
    kl_q = kl_divergence(q, prior)
    assert kl_q <= kl_divergence(x, prior) + 1e-9
    for _ in range(200):
        v = Z @ rng.normal(size=Z.shape[1])
        neg = v < 0
        step = 0.9 * np.min(x[neg] / -v[neg]) if neg.any() else 1.0
        r = x + rng.uniform(0.1, 1.0) * step * v
        assert np.all(r >= -1e-15)
        np.testing.assert_allclose(A @ r, A @ x, atol=1e-12)
        assert kl_q <= kl_divergence(np.maximum(r, 0), prior) + 1e-8


def test_single_workload_is_matched_in_one_step():
    rng = np.random.default_rng(10)
    s = Support.from_data(random_data(DOMAIN, 200, seed=11))
    x = rng.dirichlet(np.ones(s.n_support))
    for w in WORKLOADS:
        res = prior_update(s, _target_measurements(s, x, [w]), T=3, tol=1e-8)
        assert len(res.history) == 1
        np.testing.assert_allclose(s.answer(w, res.weights), s.answer(w, x), atol=1e-8)


def test_non_partition_workloads_converge_to_their_answers():
    rng = np.random.default_rng(11)
    s = Support.from_data(random_data(DOMAIN, 150, seed=10))
    x = rng.dirichlet(np.ones(s.n_support))
    ws = [WORKLOADS[3], WORKLOADS[4]]
    res = prior_update(s, _target_measurements(s, x, ws), T=100, order="random", rng=rng, tol=1e-8)
    for w in ws:
        np.testing.assert_allclose(s.answer(w, res.weights), s.answer(w, x), atol=1e-7)
    # with a "contains" workload the cyclic projections converge too, but slowly (about 2% per
    # sweep on this instance): the error keeps falling sweep after sweep
    ws = [WORKLOADS[2], WORKLOADS[3]]
    res = prior_update(s, _target_measurements(s, x, ws), T=30, tol=1e-8)
    errs = np.array([h["l1_feasible"] for h in res.history])
    assert np.all(np.diff(errs[8:]) < 0) and errs[-1] < errs[0] / 4


def test_noisy_update_diagnostics_and_infeasible_answers():
    rng = np.random.default_rng(13)
    s = Support.from_data(random_data(DOMAIN, 300, seed=14))
    x = rng.dirichlet(np.ones(s.n_support))
    ms = [Measurement(m.workload, m.answer + rng.normal(0, 0.005, m.answer.size))
          for m in _target_measurements(s, x, WORKLOADS)]
    res = prior_update(s, ms, T=5)
    assert len(res.history) == 5
    assert res.weights.sum() == pytest.approx(1.0) and np.all(res.weights >= 0)
    for h in res.history:
        assert np.isfinite([h["l1_noisy"], h["l1_feasible"], h["kl_to_prior"]]).all()
    # the feasible targets are at least as close to the noisy answers as the prior's answers
    for m in ms:
        y = res.targets[m.workload.id]
        assert np.all(y >= -1e-12)
        assert np.abs(y - m.answer).sum() <= np.abs(s.answer(m.workload) - m.answer).sum() + 1e-9
    # the prior update beats the prior on the (unseen) truth for the measured workloads
    err_prior = sum(np.abs(s.answer(m.workload) - s.answer(m.workload, x)).sum() for m in ms)
    err_post = sum(np.abs(s.answer(m.workload, res.weights) - s.answer(m.workload, x)).sum() for m in ms)
    assert err_post < err_prior


def test_normalising_noisy_counts():
    assert noisy_total_to_count(-3.2) == 0 and noisy_total_to_count(10.7) == 10
    np.testing.assert_allclose(normalise_counts(np.array([2.0, 6.0]), 8), [0.25, 0.75])
    np.testing.assert_allclose(normalise_counts(np.array([2.0, -1.0]), 0), [2.0, -1.0])


def test_pmw_pub_rounds_use_the_callables_and_reduce_error():
    rng = np.random.default_rng(15)
    pub = Support.from_data(random_data(DOMAIN, 300, seed=16, dependence=0.2))
    priv = random_data(DOMAIN, 500, seed=17, dependence=0.9)
    ws = WORKLOADS
    truth = [answer(priv, w) for w in ws]
    seen = []

    def select(scores, sensitivity):
        seen.append((scores.copy(), sensitivity))
        return int(np.argmax(scores))

    measured = []

    def measure(w):
        measured.append(w)
        return answer(priv, w) + rng.normal(0, 1.0, w.n_cells(DOMAIN))

    def err(q):
        return sum(np.abs(pub.answer(w, q) * priv.n_households - t).sum() for w, t in zip(ws, truth))

    res = pmw_pub(pub, ws, truth, select, measure, total=priv.n_households, T=4, rng=rng)
    assert len(seen) == 4 and all(sv == 1.0 for _, sv in seen)
    assert [len(sc) for sc, _ in seen] == [5, 4, 3, 2]  # no repeats by default
    assert res.selected == [w.id for w in measured] and len(set(res.selected)) == 4
    assert err(res.last) < err(pub.weights)
    assert res.weights.sum() == pytest.approx(1.0)
    # MWEM from uniform over the public support (PMW-Pub's ablation) runs through the same code
    res_u = pmw_pub(pub, ws, truth, select, measure, total=priv.n_households, T=3, prior=pub.uniform().weights)
    assert len(res_u.selected) == 3


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




def test_closed_form_update_survives_underflowed_mass():
    """Regression: a row whose prior mass is subnormal must not overflow into inf/NaN."""
    from engine.prior_update import least_relative_entropy_update

    p = np.array([1e-310, 1e-310, 0.5, 0.5 - 2e-310])
    cells = np.array([0, 0, 1, 1])
    q = least_relative_entropy_update(p, cells, np.array([0.3, 0.7]))
    assert np.all(np.isfinite(q)) and q.sum() == pytest.approx(1.0)
    assert q[:2].sum() == pytest.approx(0.3) and q[0] == pytest.approx(q[1])
