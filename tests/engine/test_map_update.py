"""The default update rule (MAP, engine.synthesis._map_update): limits and a brute-force convex solve.

    q* = argmin_q α KL(q ‖ p) + Σ_w ‖G A_w q − ỹ_w‖² / (2σ_w²) over the simplex of the support.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from engine.queries._measurement import Measurement
from engine.queries._queries import Workload, answer
from engine.queries._support import Support
from engine.synthesis._map_update import map_fit
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=3)
WORKLOADS = [Workload("group", ("NP",), ()), Workload("group", ("TEN",), ()), Workload("person", (), ("SEX",))]


@pytest.fixture(scope="module")
def tiny():
    public = random_data(DOMAIN, 12, seed=31)
    private = random_data(DOMAIN, 60, seed=32)
    return Support.from_data(public), private


def measurements(support, private, sigma, rng=None, G=None, workloads=WORKLOADS):
    G = private.n_households if G is None else G
    out = []
    for w in workloads:  # σ in households: a normalised workload's rows count NORM_SCALE per household
        y = answer(private, w).astype(float)
        sd = sigma * w.household_unit
        if rng is not None:
            y = y + rng.normal(0, sd, y.size)
        out.append(Measurement(w, y, sd))
    return out


def objective(support, p, ms, G, alpha):
    def f(q):
        q = np.clip(q, 1e-300, None)
        kl = float(np.sum(q * (np.log(q) - np.log(p))))
        fit = sum(float(np.sum((G * support.answer(m.workload, q) - m.noisy_answer) ** 2)) / (2 * m.sigma**2) for m in ms)
        return alpha * kl + fit
    return f


def brute_force(support, p, ms, G, alpha):
    """The convex problem solved directly over the simplex (SLSQP from several starts)."""
    f = objective(support, p, ms, G, alpha)
    n = p.size
    best = None
    for start in (p, np.full(n, 1 / n), np.random.default_rng(0).dirichlet(np.ones(n))):
        r = minimize(f, start, method="SLSQP", bounds=[(0, 1)] * n, constraints=[{"type": "eq", "fun": lambda q: q.sum() - 1}],
                     options={"maxiter": 2000, "ftol": 1e-14})
        if best is None or r.fun < best.fun:
            best = r
    return best.x, best.fun


NORMALISED = [WORKLOADS[0], Workload("person", ("TEN",), ("SEX",), normalised=True), Workload("person", (), ("SEX",), normalised=True)]


@pytest.mark.parametrize("alpha", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("workloads", [WORKLOADS, NORMALISED], ids=["counts", "normalised"])
def test_map_update_equals_a_brute_force_convex_solve(tiny, alpha, workloads):
    """``normalised``: workloads whose rows count in units of NORM_SCALE per household, which the
    solver rescales to households in its products (the problem is the same)."""
    support, private = tiny
    rng = np.random.default_rng(int(alpha * 10))
    G = private.n_households
    ms = measurements(support, private, 3.0, rng, workloads=workloads)
    p = support.weights / support.weights.sum()
    q = map_fit(support, p, ms, G, prior_strength=alpha).weights
    q_bf, f_bf = brute_force(support, p, ms, G, alpha)
    f = objective(support, p, ms, G, alpha)
    assert f(q) <= f_bf + 1e-6 * max(1.0, abs(f_bf))  # at least as good as the direct solve
    assert np.abs(q - q_bf).sum() < 1e-3


def test_a_huge_prior_strength_keeps_the_prior(tiny):
    support, private = tiny
    p = support.weights / support.weights.sum()
    q = map_fit(support, p, measurements(support, private, 3.0, np.random.default_rng(1)), private.n_households, prior_strength=1e9).weights
    assert np.abs(q - p).max() < 1e-6


def test_vanishing_noise_fits_producible_answers(tiny):
    """Answers the support can produce exactly (those of some q₀ on it) are matched as σ → 0."""
    support, _ = tiny
    q0 = np.random.default_rng(2).dirichlet(np.ones(support.n_support))
    G = 1000.0
    ms = [Measurement(w, G * support.answer(w, q0), 1e-4) for w in WORKLOADS]
    p = support.weights / support.weights.sum()
    q = map_fit(support, p, ms, G, prior_strength=1.0).weights
    for m in ms:
        assert np.abs(support.answer(m.workload, q) - m.answers(G)).max() < 1e-5
    assert abs(q.sum() - 1) < 1e-9 and q.min() >= 0


def test_a_warm_start_changes_the_iterations_not_the_optimum(tiny):
    """The dual is strictly convex: starting from the (rescaled) solution at another total reaches
    the same posterior, in fewer iterations (what the joint household-total fit relies on)."""
    support, private = tiny
    p = support.weights / support.weights.sum()
    raw = measurements(support, private, 3.0, np.random.default_rng(5))  # noisy counts
    G0, G1 = private.n_households * 0.95, float(private.n_households)
    first = map_fit(support, p, raw, G0, prior_strength=0.1 * G0)
    cold = map_fit(support, p, raw, G1, prior_strength=0.1 * G1)
    warm = map_fit(support, p, raw, G1, prior_strength=0.1 * G1, dual0=first.dual * G1 / G0)
    assert np.abs(warm.weights - cold.weights).sum() < 1e-4  # both within the solver's tolerance of the optimum
    assert warm.diagnostics["iterations"] <= cold.diagnostics["iterations"]


def test_households_outside_the_prior_stay_at_zero_and_ties_split_by_prior(tiny):
    """Households the prior excludes keep weight 0; households with equal columns in every measured
    workload keep their prior ratio (the solver works on the distinct columns)."""
    support, private = tiny
    p = np.random.default_rng(3).dirichlet(np.ones(support.n_support))
    p[0] = 0.0
    ms = measurements(support, private, 3.0, np.random.default_rng(4))
    q = map_fit(support, p, ms, private.n_households, prior_strength=1.0).weights
    assert q[0] == 0.0 and abs(q.sum() - 1) < 1e-12
    _, pattern_of = support.cache.joint_patterns([m.workload for m in ms])
    ratio = np.divide(q, p, out=np.zeros_like(q), where=p > 0)
    for u in np.unique(pattern_of):
        members = np.flatnonzero((pattern_of == u) & (p > 0))
        np.testing.assert_allclose(ratio[members], ratio[members][0], rtol=1e-9)


def test_fits_sharing_a_support_equal_fits_on_a_fresh_one(tiny):
    """Fits on one support whose priors exclude different households (the restriction of the
    incidence to the prior's patterns is kept between fits) are bit for bit the fits on a fresh
    support."""
    support, private = tiny
    ms = measurements(support, private, 3.0, np.random.default_rng(6))
    rng = np.random.default_rng(7)
    priors = []
    for zeros in ([0, 1], [2], [0, 1]):
        p = rng.dirichlet(np.ones(support.n_support))
        p[zeros] = 0.0
        priors.append(p)
    for p in priors:
        shared = map_fit(support, p, ms, private.n_households, prior_strength=1.0)
        fresh = map_fit(Support.from_data(support.data), p, ms, private.n_households, prior_strength=1.0)
        np.testing.assert_array_equal(shared.weights, fresh.weights)
        assert shared.weights[p == 0].max() == 0.0
