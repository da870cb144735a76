"""The prior update (Tao et al. Algorithm 1, IDE) on the support: noiseless answers reproduced at
least KL, convergence on non-partition workloads, noisy answers projected onto feasible ones."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import null_space

from engine.queries._measurement import Measurement, normalise_counts
from engine.queries._projection import kl_divergence
from engine.queries._queries import Workload
from engine.queries._support import Support
from engine.synthesis._prior_update import prior_update
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)


WORKLOADS = [
    Workload("group", ("TEN", "NP")),
    Workload("group", ("R18",)),
    Workload("group", ("NP",), ("AGE",)),
    Workload("person", ("TEN",), ("AGE",)),
    Workload("person", (), ("SEX", "RAC")),
]


G = 250.0  # the node's household total: measurements are counts, the update divides them by it


def _target_measurements(s: Support, x: np.ndarray, workloads):
    return [Measurement(w, G * s.answer(w, x) / x.sum(), 0.0) for w in workloads]


def test_noiseless_update_reproduces_answers_with_least_kl():
    rng = np.random.default_rng(9)
    s = Support.from_data(random_data(DOMAIN, 150, seed=10))
    prior = rng.dirichlet(np.full(s.n_support, 2.0))
    x = prior * np.exp(rng.normal(0, 0.7, s.n_support))
    x /= x.sum()
    ws = [WORKLOADS[i] for i in (0, 1, 3, 4)]  # two partitions, two person-level workloads
    res = prior_update(s, _target_measurements(s, x, ws), total=G, prior=prior, T=150, tol=1e-8)
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
        res = prior_update(s, _target_measurements(s, x, [w]), total=G, T=3, tol=1e-8)
        assert len(res.history) == 1
        np.testing.assert_allclose(s.answer(w, res.weights), s.answer(w, x), atol=1e-8)


def test_non_partition_workloads_converge_to_their_answers():
    rng = np.random.default_rng(11)
    s = Support.from_data(random_data(DOMAIN, 150, seed=10))
    x = rng.dirichlet(np.ones(s.n_support))
    ws = [WORKLOADS[3], WORKLOADS[4]]
    res = prior_update(s, _target_measurements(s, x, ws), total=G, T=100, order="random", rng=rng, tol=1e-8)
    for w in ws:
        np.testing.assert_allclose(s.answer(w, res.weights), s.answer(w, x), atol=1e-7)
    # with a "contains" workload the cyclic projections converge too, but slowly: the error keeps
    # falling sweep after sweep
    ws = [WORKLOADS[2], WORKLOADS[3]]
    res = prior_update(s, _target_measurements(s, x, ws), total=G, T=30, tol=1e-8)
    errs = np.array([h["l1_feasible"] for h in res.history])
    assert np.all(np.diff(errs[8:]) < 0) and errs[-1] < errs[0] / 4


def test_noisy_update_diagnostics_and_infeasible_answers():
    rng = np.random.default_rng(13)
    s = Support.from_data(random_data(DOMAIN, 300, seed=14))
    x = rng.dirichlet(np.ones(s.n_support))
    ms = [Measurement(m.workload, m.noisy_answer + rng.normal(0, 0.005 * G, m.noisy_answer.size), 0.005 * G)
          for m in _target_measurements(s, x, WORKLOADS)]
    res = prior_update(s, ms, total=G, T=5)
    assert len(res.history) == 5
    assert res.weights.sum() == pytest.approx(1.0) and np.all(res.weights >= 0)
    for h in res.history:
        assert np.isfinite([h["l1_noisy"], h["l1_feasible"], h["kl_to_prior"]]).all()
    # the feasible targets are at least as close to the noisy answers as the prior's answers
    for m in ms:
        y = res.targets[m.workload.id]
        assert np.all(y >= -1e-12)
        assert np.abs(y - m.answers(G)).sum() <= np.abs(s.answer(m.workload) - m.answers(G)).sum() + 1e-9
    # the prior update beats the prior on the (unseen) truth for the measured workloads
    err_prior = sum(np.abs(s.answer(m.workload) - s.answer(m.workload, x)).sum() for m in ms)
    err_post = sum(np.abs(s.answer(m.workload, res.weights) - s.answer(m.workload, x)).sum() for m in ms)
    assert err_post < err_prior


def test_normalising_noisy_counts():
    np.testing.assert_allclose(normalise_counts(np.array([2.0, 6.0]), 8), [0.25, 0.75])
    np.testing.assert_allclose(normalise_counts(np.array([2.0, -1.0]), 0), [2.0, -1.0])
