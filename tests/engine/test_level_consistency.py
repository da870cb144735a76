"""Holding children to their parent (engine.synthesis._level_consistency): one common tilt, totals kept,
the children's sum pulled to the parent's answers by the parent's evidence, and the noise that
PUMA fits take from their own measurements removed from the sum (simulation); the children's
fitted household totals held to their consistent counts, which removes the joint fit's upward
lean from the parent's total (simulation)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from engine.queries._measurement import Measurement
from engine.queries._queries import Workload, answer
from engine.queries._support import Support
from engine.synthesis._level_consistency import RAKE_TOL, children_sum, rake_to_parent, totals_to_parent
from engine.synthesis._map_update import map_fit
from engine.synthesis._node import synthesize_node
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)
PARENT_WORKLOADS = [Workload("group", ("TEN", "NP")), Workload("person", ("R18",), ("AGE",)), Workload("person", (), ("SEX", "RAC"))]


def _setup(seed: int = 0):
    data = random_data(DOMAIN, 400, seed=seed)
    s = Support.from_data(data)
    rng = np.random.default_rng(seed + 1)
    parent = rng.dirichlet(np.full(s.n_support, 2.0))
    children = [parent * rng.lognormal(0.0, 0.4, s.n_support) for _ in range(4)]
    return s, parent, [c / c.sum() for c in children], np.array([300.0, 500.0, 250.0, 450.0])


def _distance(s: Support, children, totals, parent, sigma: float) -> float:
    mix = sum(g * c for g, c in zip(totals, children))
    G = totals.sum()
    return float(sum(np.sum(((s.answer(w, mix) - G * s.answer(w, parent)) / sigma) ** 2) for w in PARENT_WORKLOADS))


def test_one_common_tilt_keeps_totals_and_ratios_and_pulls_the_sum_to_the_parent():
    s, parent, children, totals = _setup()
    out, diag = rake_to_parent(s, children, totals, parent, [(w, 2.0) for w in PARENT_WORKLOADS])
    assert all(abs(c.sum() - 1) < 1e-12 for c in out)
    # the ratio new/old is the same factor for every child, up to each child's normalisation
    ratios = [o / c for o, c in zip(out, children)]
    for r in ratios[1:]:
        np.testing.assert_allclose(r / r.mean(), ratios[0] / ratios[0].mean(), rtol=1e-9)
    before, after = _distance(s, children, totals, parent, 2.0), _distance(s, out, totals, parent, 2.0)
    assert diag["distance_before"] == pytest.approx(before, rel=1e-9)
    assert after < 0.1 * before and diag["distance_after"] < 0.1 * diag["distance_before"]
    # weaker evidence (larger σ) pulls less
    loose, _ = rake_to_parent(s, children, totals, parent, [(w, 200.0) for w in PARENT_WORKLOADS])
    assert after < _distance(s, loose, totals, parent, 2.0) < before


def test_a_single_child_is_the_map_fit_of_it_to_the_parent_and_a_consistent_family_is_left_alone():
    s, parent, children, totals = _setup(3)
    out, _ = rake_to_parent(s, children[:1], totals[:1], parent, [(w, 2.0) for w in PARENT_WORKLOADS])
    G = float(totals[0])
    ref = map_fit(s, children[0], [Measurement(w, G * s.answer(w, parent), 2.0) for w in PARENT_WORKLOADS], G, prior_strength=0.1 * G,
                  tol=RAKE_TOL)
    np.testing.assert_allclose(out[0], ref.weights / ref.weights.sum(), rtol=1e-9, atol=1e-15)
    same, diag = rake_to_parent(s, [parent, parent], [10.0, 30.0], parent, [(w, 2.0) for w in PARENT_WORKLOADS])
    for c in same:
        np.testing.assert_allclose(c, parent / parent.sum(), rtol=1e-6)
    assert diag["distance_before"] < 1e-12
    unchanged, diag = rake_to_parent(s, children, totals, parent, [])
    assert diag == {"workloads": 0} and all(np.allclose(a, b) for a, b in zip(unchanged, children))


def test_the_sum_of_noisy_child_fits_gets_closer_to_the_truth():
    """Simulation: children are the parent's truth split in parts; each child's posterior is the
    parent posterior updated with the child's own noisy measurement (MAP). Held to the parent
    posterior, the children's sum errs less on the parent's workloads than without, averaged over
    noise draws."""
    data = random_data(DOMAIN, 600, seed=5)
    s = Support.from_data(data)
    rng = np.random.default_rng(6)
    truth = [rng.dirichlet(np.full(s.n_support, 0.8)) for _ in range(5)]
    G = np.array([400.0, 600.0, 500.0, 300.0, 700.0])
    parent_truth = sum(g * t for g, t in zip(G, truth)) / G.sum()
    child_w = [Workload("person", (), ("AGE",)), Workload("group", ("NP",))]
    sigma = 15.0
    err_plain, err_raked = [], []
    for _ in range(12):
        # the parent posterior: the truth measured with small noise
        pm = [Measurement(w, G.sum() * s.answer(w, parent_truth) + rng.normal(0, 3.0, w.n_cells(DOMAIN)), 3.0) for w in PARENT_WORKLOADS]
        parent = map_fit(s, s.weights, pm, G.sum(), prior_strength=0.1 * G.sum()).weights
        fits = []
        for g, t in zip(G, truth):
            cm = [Measurement(w, g * s.answer(w, t) + rng.normal(0, sigma, w.n_cells(DOMAIN)), sigma) for w in child_w]
            fits.append(map_fit(s, parent, cm, g, prior_strength=0.1 * g).weights)
        raked, _ = rake_to_parent(s, fits, G, parent, [(w, 3.0) for w in PARENT_WORKLOADS])
        def err(children):
            mix = sum(g * c for g, c in zip(G, children))
            return sum(np.abs(s.answer(w, mix) - G.sum() * s.answer(w, parent_truth)).sum() for w in PARENT_WORKLOADS)
        err_plain.append(err(fits))
        err_raked.append(err(raked))
    assert np.mean(err_raked) < 0.9 * np.mean(err_plain)


def test_children_sum_is_the_parents_answer_with_the_summed_variance():
    """Brute force on a partition of a dataset into children: noiseless children's answers add up
    to the parent's exactly, the σ is √Σσ²; a workload missing at one child is left out."""
    data = random_data(DOMAIN, 300, seed=8)
    part = np.random.default_rng(9).integers(0, 3, data.n_households)
    kids = [data.take(np.flatnonzero(part == k)) for k in range(3)]
    ws = [Workload("group", ("TEN", "NP")), Workload("person", ("R18",), ("AGE",)), Workload("person", (), ("SEX",), normalised=True)]
    sigmas = [1.0, 2.0, 3.0]
    children = [[Measurement(w, answer(kid, w), sd) for w in ws] for kid, sd in zip(kids, sigmas)]
    children[2] = children[2][:2]  # the normalised one was not measured at the third child
    got = children_sum(children)
    assert [m.workload for m in got] == ws[:2]
    for m in got:
        np.testing.assert_allclose(m.noisy_answer, answer(data, m.workload), atol=1e-9)
        assert m.sigma == pytest.approx(np.sqrt(1 + 4 + 9)) and m.rho == 0
    assert children_sum([]) == []
    with pytest.raises(ValueError, match="different shapes"):
        children_sum([[Measurement(ws[0], np.zeros(3), 1.0)], [Measurement(ws[0], np.zeros(4), 1.0)]])


def test_the_noise_of_children_sum_has_the_stated_sd():
    """Statistical: over many noise draws the summed measurement's error has the stated σ
    (chi-square bound on the variance ratio) and mean 0."""
    rng = np.random.default_rng(10)
    w = Workload("group", ("NP",))
    truth = [np.array([5.0, 3.0, 2.0, 1.0]), np.array([1.0, 4.0, 0.0, 2.0])]
    sds = [2.0, 5.0]
    errs = []
    for _ in range(2000):
        kids = [[Measurement(w, t + rng.normal(0, sd, t.size), sd)] for t, sd in zip(truth, sds)]
        (m,) = children_sum(kids)
        errs.append((m.noisy_answer - sum(truth)) / m.sigma)
    e = np.concatenate(errs)
    assert abs(e.mean()) < 4 / np.sqrt(e.size)
    assert abs(e.var() - 1) < 4 * np.sqrt(2 / e.size)


def test_the_parent_fit_with_its_childrens_sums_errs_less():
    """Simulation: a parent measured with its own workloads, its children measured with others;
    the parent's MAP fit errs less on the children's workloads (in the parent's tables) with the
    children's sums taken in than from its own measurements alone, averaged over noise draws, and
    no worse on its own workloads."""
    data = random_data(DOMAIN, 600, seed=11)
    s = Support.from_data(data)
    rng = np.random.default_rng(12)
    truth = [rng.dirichlet(np.full(s.n_support, 0.8)) for _ in range(4)]
    G = np.array([400.0, 600.0, 500.0, 300.0])
    parent_truth = sum(g * t for g, t in zip(G, truth)) / G.sum()
    child_w = [Workload("person", (), ("AGE",)), Workload("group", ("NP",)), Workload("person", (), ("SEX", "RAC"))]
    own = {"own": [], "with": []}
    theirs = {"own": [], "with": []}
    for _ in range(10):
        pm = [Measurement(w, G.sum() * s.answer(w, parent_truth) + rng.normal(0, 20.0, w.n_cells(DOMAIN)), 20.0) for w in PARENT_WORKLOADS]
        cm = [[Measurement(w, g * s.answer(w, t) + rng.normal(0, 8.0, w.n_cells(DOMAIN)), 8.0) for w in child_w] for g, t in zip(G, truth)]
        for name, extra in (("own", []), ("with", children_sum(cm))):
            q = map_fit(s, s.weights, pm + extra, G.sum(), prior_strength=0.1 * G.sum()).weights
            own[name].append(sum(np.abs(G.sum() * s.answer(w, q - parent_truth)).sum() for w in PARENT_WORKLOADS))
            theirs[name].append(sum(np.abs(G.sum() * s.answer(w, q - parent_truth)).sum() for w in child_w))
    assert np.mean(theirs["with"]) < 0.8 * np.mean(theirs["own"])
    assert np.mean(own["with"]) < 1.05 * np.mean(own["own"])


def test_bad_inputs_are_refused():
    s, parent, children, totals = _setup()
    with pytest.raises(ValueError, match="one total per child"):
        rake_to_parent(s, children, totals[:2], parent, [])
    with pytest.raises(ValueError, match="every child"):
        rake_to_parent(s, [children[0][:-1]], totals[:1], parent, [])
    with pytest.raises(ValueError, match="the parent"):
        rake_to_parent(s, children, totals, -parent, [])


def test_totals_to_parent_keeps_the_fitted_shares_at_the_counts_sum():
    out = totals_to_parent([101.4, 203.2, 0.0, 50.9], [95, 210, 3, 52])
    assert out.dtype == np.int64 and out.sum() == 360 and out[2] == 0
    np.testing.assert_allclose(out, np.array([101.4, 203.2, 0.0, 50.9]) * 360 / 355.5, atol=1.0)
    np.testing.assert_array_equal(totals_to_parent([0.0, 0.0], [4, 7]), [4, 7])  # nothing fitted: the counts
    np.testing.assert_array_equal(totals_to_parent([5.0, 5.0], [0, 0]), [0, 0])
    with pytest.raises(ValueError, match="one non-negative fitted total"):
        totals_to_parent([1.0, -1.0], [2, 2])
    with pytest.raises(ValueError, match="one non-negative fitted total"):
        totals_to_parent([1.0], [2, 2])


def test_the_parent_total_has_no_lean_once_the_fitted_totals_are_held_to_the_counts():
    """Children of different make-up fitted from one prior, each total jointly with its posterior
    from a noisy count (sd 20): the fitted totals lean upward (the answers are regressed on a
    posterior drawn toward the prior), so their sum misses the parent's true total by many standard
    errors; held to the counts' sum it does not (its error is the counts' noise, mean 0)."""
    domain = small_domain()
    support = Support.from_data(random_data(domain, 400, seed=1))
    workloads = [Workload("group", ("TEN", "NP", "R18")), Workload("person", ("TEN",), ("AGE", "SEX", "RAC"))]
    children = [random_data(domain, n, seed=10 + i, dependence=d) for i, (n, d) in enumerate([(300, 0.2), (250, 0.9), (350, 0.5), (200, 0.95)])]
    true = np.array([c.n_households for c in children])
    rng = np.random.default_rng(0)

    def measure(child):
        def noisy(w, rho):
            y = answer(child, w).astype(float).reshape(-1)
            return y + rng.normal(0.0, 8.0, y.shape), 8.0
        return noisy

    fitted_err, held_err = [], []
    for _ in range(12):
        counts = np.maximum(np.rint(true + rng.normal(0.0, 20.0, true.size)), 0).astype(np.int64)
        fitted = [synthesize_node(support, support.weights, workloads, Fraction(1), measure(c), float(g), total_sd=20.0).total
                  for c, g in zip(children, counts)]
        fitted_err.append(np.rint(fitted).sum() - true.sum())
        held_err.append(totals_to_parent(fitted, counts).sum() - true.sum())

    def standard_errors_from_zero(e: list) -> float:
        return float(np.mean(e) / (np.std(e, ddof=1) / np.sqrt(len(e))))

    assert standard_errors_from_zero(fitted_err) > 3.0, fitted_err  # the lean the holding removes
    assert abs(standard_errors_from_zero(held_err)) < 2.0, held_err
