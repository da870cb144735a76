"""Empirical-Bayes prior strength (engine.synthesis._prior_strength): the eigen form of the marginal
likelihood against the dense Gaussian log-density, the choice recovering the strength that
generated the data (statistical test), the choice reaching synthesize_node's fit, and the floor
lifting it."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from engine.queries._measurement import Measurement
from engine.queries._queries import Workload, answer
from engine.queries._support import Support
from engine.synthesis._node import synthesize_node
from engine.synthesis._prior_strength import choose_prior_strength, marginal_log_likelihood
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)
WORKLOADS = [Workload("group", ("TEN", "NP")), Workload("person", ("R18",), ("AGE",)), Workload("person", (), ("SEX", "RAC"))]


@pytest.mark.parametrize("empty_cells", [False, True])
def test_eigen_form_equals_the_dense_gaussian_log_density_up_to_a_constant(empty_cells):
    """With ``empty_cells`` the prior puts no weight on the households of one tenure: cells only
    they fall in have no prior spread (the eigen form sets them aside, the dense form keeps them)."""
    data = random_data(DOMAIN, 200, seed=1)
    s = Support.from_data(data)
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(s.n_support))
    if empty_cells:
        p[data.group[:, DOMAIN.group_index("TEN")] == 0] = 0.0
        p /= p.sum()
        assert np.any(s.answer(WORKLOADS[0], p) == 0)
    G = 500.0
    ms = [Measurement(w, G * s.answer(w, p) + rng.normal(0, 4.0, w.n_cells(DOMAIN)), 4.0 + i) for i, w in enumerate(WORKLOADS)]
    strengths = [0.01, 0.1, 1.0]
    got = marginal_log_likelihood(s, p, ms, G, strengths)
    A = sp.vstack([s.incidence(m.workload) for m in ms]).toarray()
    y = np.concatenate([m.noisy_answer for m in ms])
    S = np.diag(np.concatenate([np.full(m.noisy_answer.size, m.variance) for m in ms]))
    Sigma = np.diag(p) - np.outer(p, p)
    d = y - G * A @ p
    dense = []
    for r in strengths:
        C = G * G * A @ Sigma @ A.T / (r * G + 1) + S
        dense.append(-0.5 * (np.linalg.slogdet(C)[1] + d @ np.linalg.solve(C, d)))
    np.testing.assert_allclose(got - got[0], np.array(dense) - dense[0], rtol=1e-7, atol=1e-6)


@pytest.mark.parametrize("true_strength", [0.02, 0.5])
def test_the_choice_recovers_the_strength_that_generated_the_data(true_strength):
    """Statistical test: nodes drawn as q ~ Dirichlet(α p) with α = r·G, their households drawn from
    q, measured with Gaussian noise; the candidate r of largest marginal likelihood is the true one
    in most draws."""
    data = random_data(DOMAIN, 300, seed=3)
    s = Support.from_data(data)
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.full(s.n_support, 5.0))
    G = 2000
    candidates = [true_strength / 10, true_strength, true_strength * 10]
    hits = 0
    for _ in range(20):
        q = rng.dirichlet(true_strength * G * p + 1e-9)
        counts = rng.multinomial(G, q / q.sum())
        ms = [Measurement(w, answer(data, w, counts) + rng.normal(0, 3.0, w.n_cells(DOMAIN)), 3.0) for w in WORKLOADS]
        hits += choose_prior_strength(s, p, ms, G, candidates).strength == true_strength
    assert hits >= 14


def node_from_prior(strength: float, seed: int = 7):
    """A node of G = 2000 households drawn as q ~ Dirichlet(strength·G·p) around a random prior p on
    a random support: (data, support, p, G, household counts, the generator for the noise)."""
    data = random_data(DOMAIN, 300, seed=seed)
    s = Support.from_data(data)
    rng = np.random.default_rng(seed + 1)
    p = rng.dirichlet(np.full(s.n_support, 5.0))
    G = 2000
    q = rng.dirichlet(strength * G * p + 1e-9)
    return data, s, p, G, rng.multinomial(G, q / q.sum()), rng


def test_a_nearly_flat_likelihood_keeps_the_strongest_prior():
    """Few, very noisy measurements: the likelihood cannot tell the candidates apart, and the
    strongest prior is kept; the same data with small noise pick the generating strength."""
    data, s, p, G, counts, rng = node_from_prior(0.02)
    w = WORKLOADS[0]
    noisy = [Measurement(w, answer(data, w, counts) + rng.normal(0, 2000.0, w.n_cells(DOMAIN)), 2000.0)]
    choice = choose_prior_strength(s, p, noisy, G, [0.002, 0.02, 0.2])
    assert choice.strength == 0.2 and max(choice.loglik) - choice.loglik[2] < 2
    sharp = [Measurement(w, answer(data, w, counts) + rng.normal(0, 3.0, w.n_cells(DOMAIN)), 3.0) for w in WORKLOADS]
    assert choose_prior_strength(s, p, sharp, G, [0.002, 0.02, 0.2]).strength == 0.02


def test_synthesize_node_fits_with_the_chosen_strength():
    data = random_data(DOMAIN, 200, seed=5)
    s = Support.from_data(data)
    rng = np.random.default_rng(6)
    truth = data.take(rng.integers(0, data.n_households, 400))

    def measure(w, rho):
        sigma = w.sensitivity(DOMAIN, "household")[1] / np.sqrt(2 * float(rho))
        return answer(truth, w) + rng.normal(0, sigma, w.n_cells(DOMAIN)), sigma

    res = synthesize_node(s, s.weights, WORKLOADS, Fraction(1, 2), measure, truth.n_households, strengths=(0.01, 0.1, 1.0))
    choice = res.diagnostics["prior_strength_choice"]
    assert choice["strength"] in (0.01, 0.1, 1.0) and len(choice["loglik"]) == 3
    assert res.diagnostics["prior_strength"] == pytest.approx(choice["strength"] * truth.n_households)
    with pytest.raises(ValueError, match="positive"):
        choose_prior_strength(s, s.weights, [Measurement(WORKLOADS[0], np.zeros(6), 1.0)], 10, [0.0, 1.0])


def test_the_floor_raises_the_empirical_bayes_choice():
    """The public simulation's floor (engine.synthesis._strength_floor): sharp measurements of a node far from
    the prior make empirical Bayes pick the weakest candidate; a floor between candidates lifts it to
    the next one at or above, a floor above all to the strongest, and a floor below the choice changes
    nothing."""
    data, s, p, G, counts, rng = node_from_prior(0.002)
    ms = [Measurement(w, answer(data, w, counts) + rng.normal(0, 3.0, w.n_cells(DOMAIN)), 3.0) for w in WORKLOADS]
    cands = [0.002, 0.02, 0.2]
    free = choose_prior_strength(s, p, ms, G, cands)
    assert free.strength == 0.002 and free.floor == 0.0
    assert choose_prior_strength(s, p, ms, G, cands, floor=0.001).strength == 0.002
    lifted = choose_prior_strength(s, p, ms, G, cands, floor=0.01)
    assert lifted.strength == 0.02 and lifted.floor == 0.01 and lifted.loglik == free.loglik
    assert lifted.to_dict()["floor"] == 0.01
    assert choose_prior_strength(s, p, ms, G, cands, floor=5.0).strength == 0.2
    # a floor that leaves one candidate (or none) decides alone: the likelihood is not computed
    for floor in (0.2, 5.0):
        only = choose_prior_strength(s, p, ms, G, cands, floor=floor)
        assert only.strength == 0.2 and all(math.isnan(v) for v in only.loglik)
        assert only.to_dict()["loglik"] == [None, None, None] and json.dumps(only.to_dict())
