"""Projections on the support (Tao et al. Alg. 1 lines 6–10, Def. 3.1, the two-stage L1 / I-projection),
each against a brute-force solve."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog, minimize

from engine.queries._projection import (
    entropy_projection,
    kl_divergence,
    least_relative_entropy_update,
    project_simplex_l1,
    project_to_hull_l1,
)
from engine.queries._queries import Workload
from engine.queries._support import Support
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


def test_closed_form_update_survives_underflowed_mass():
    """Regression: a row whose prior mass is subnormal must not overflow into inf/NaN."""
    p = np.array([1e-310, 1e-310, 0.5, 0.5 - 2e-310])
    cells = np.array([0, 0, 1, 1])
    q = least_relative_entropy_update(p, cells, np.array([0.3, 0.7]))
    assert np.all(np.isfinite(q)) and q.sum() == pytest.approx(1.0)
    assert q[:2].sum() == pytest.approx(0.3) and q[0] == pytest.approx(q[1])
