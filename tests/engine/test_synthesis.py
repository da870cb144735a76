"""engine.synthesis._node: the count-of-counts size histogram as a noisy measurement inside the MAP fit.

Properties: it is weighed by its precision (σ → 0 reproduces it, σ → ∞ leaves the prior), and
a correctly specified measurement never makes the size marginal worse on average (Bayesian
combination of the prior with an unbiased measurement), unlike imposing the noisy sizes.
"""

from fractions import Fraction

import numpy as np
import pytest

from engine.queries._queries import Workload, answer
from engine.queries._support import Support
from engine.synthesis._node import size_measurement, synthesize_node
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain()
NP = Workload("group", ("NP",), ())


def never_called(w, rho):
    raise AssertionError("no own measurement at rho = 0")


def size_marginal(support, weights):
    return support.incidence(NP) @ weights


@pytest.fixture(scope="module")
def setting():
    public = random_data(DOMAIN, 400, seed=1)
    private = random_data(DOMAIN, 300, seed=2)
    # make the private sizes differ from the public ones: drop most 4-person households
    keep = (private.sizes < 4) | (np.arange(private.n_households) % 4 == 0)
    private = private.select(keep)
    return Support.from_data(public), private


def test_size_measurement_checks_its_length(setting):
    with pytest.raises(ValueError, match="size counts for the 4 codes of NP"):
        size_measurement(DOMAIN, [1, 2, 3], 1.0)
    m = size_measurement(DOMAIN, [10, 20, 30, 40], 2.0)
    assert m.workload == NP and np.allclose(m.noisy_answer, [10, 20, 30, 40]) and m.sigma == 2.0 and m.rho == 0
    assert np.allclose(m.answers(100), [0.1, 0.2, 0.3, 0.4])


def test_precision_decides(setting):
    support, private = setting
    truth = answer(private, NP).astype(float)
    G = private.n_households
    exact = synthesize_node(support, support.weights, [], Fraction(0), never_called, G,
                            prior_strength=0.1, extra=[size_measurement(DOMAIN, truth, 1e-3)])
    assert np.abs(size_marginal(support, exact.weights) - truth / G).max() < 1e-3
    vague = synthesize_node(support, support.weights, [], Fraction(0), never_called, G,
                            prior_strength=0.1, extra=[size_measurement(DOMAIN, truth, 1e6)])
    assert np.abs(vague.weights - support.weights / support.weights.sum()).max() < 1e-6
    nothing = synthesize_node(support, support.weights, [], Fraction(0), never_called, G)
    assert nothing.diagnostics == {"measured": 0}


@pytest.mark.parametrize("sigma", [2.0, 8.0, 30.0])
def test_a_noisy_size_measurement_never_hurts_on_average(setting, sigma):
    support, private = setting
    truth = answer(private, NP).astype(float)
    G = private.n_households
    rng = np.random.default_rng(int(sigma))
    prior_err = np.abs(size_marginal(support, support.weights / support.weights.sum()) - truth / G).sum()
    fitted, imposed = [], []
    for _ in range(40):
        noisy = truth + rng.normal(0, sigma, truth.size)
        res = synthesize_node(support, support.weights, [], Fraction(0), never_called, G,
                              prior_strength=0.1, extra=[size_measurement(DOMAIN, noisy, sigma)])
        fitted.append(np.abs(size_marginal(support, res.weights) - truth / G).sum())
        imposed.append(np.abs(np.clip(noisy, 0, None) / G - truth / G).sum())
    assert np.mean(fitted) <= prior_err + 1e-9  # the measurement is information: never worse than the prior
    assert np.mean(fitted) <= np.mean(imposed) + 1e-9  # and never worse than imposing it


# --- the node's household total, estimated jointly with the posterior -------------------------

PERSON_SEX = Workload("person", (), ("SEX",))
WORKLOADS = [NP, Workload("group", ("TEN",), ()), PERSON_SEX]


def gaussian_measure(private, rng, sigma):
    def measure(w, rho):
        counts = answer(private, w).astype(float)
        return counts + rng.normal(0, sigma, counts.size), sigma
    return measure


def test_fit_total_is_the_weighted_least_squares_solution(setting):
    """Brute force: G minimising Σ_w ‖ỹ_w − G a_w‖²/σ_w² + (total − G)²/sd², by a dense solve."""
    from engine.queries._measurement import Measurement
    from engine.synthesis._node import fit_total

    support, private = setting
    rng = np.random.default_rng(3)
    q = rng.dirichlet(np.ones(support.data.n_households))
    measured = [Measurement(w, answer(private, w) + rng.normal(0, s, answer(private, w).size), s)
                for w, s in zip(WORKLOADS, [3.0, 5.0, 8.0])]
    total, sd = 280.0, 20.0
    rows = [support.answer(m.workload, q)[:, None] / m.sigma for m in measured] + [np.array([[1.0 / sd]])]
    rhs = [m.noisy_answer / m.sigma for m in measured] + [np.array([total / sd])]
    expected = np.linalg.lstsq(np.vstack(rows), np.concatenate(rhs), rcond=None)[0][0]
    assert fit_total(support, q, measured, total, sd) == pytest.approx(expected, rel=1e-12)
    # a vanishing sd pins the total; a huge one leaves the workloads to decide
    assert fit_total(support, q, measured, total, 1e-9) == pytest.approx(total, abs=1e-6)
    free = np.linalg.lstsq(np.vstack(rows[:-1]), np.concatenate(rhs[:-1]), rcond=None)[0][0]
    assert fit_total(support, q, measured, total, 1e9) == pytest.approx(free, rel=1e-9)


def test_a_given_total_is_kept_and_its_sd_is_validated(setting):
    support, private = setting
    measure = gaussian_measure(private, np.random.default_rng(5), 4.0)
    res = synthesize_node(support, support.weights, WORKLOADS, Fraction(1), measure, 250.0)
    assert res.total == res.diagnostics["total"]["normaliser"] == res.diagnostics["total"]["fitted"] == 250.0
    with pytest.raises(ValueError, match="total_sd must be >= 0"):
        synthesize_node(support, support.weights, WORKLOADS, Fraction(1), measure, 250.0, total_sd=-1.0)


def test_noiseless_workloads_recover_the_true_total_from_a_wrong_count(setting):
    support, private = setting
    G = private.n_households
    measure = gaussian_measure(private, np.random.default_rng(6), 1e-3)
    for wrong in (G + 80.0, G - 80.0):
        res = synthesize_node(support, support.weights, WORKLOADS, Fraction(1), measure, wrong, total_sd=60.0)
        assert abs(res.total - G) < 1.0, res.diagnostics["total"]
        assert res.diagnostics["total"]["given"] == wrong
    # without a partition the posterior-free estimate is the count (the posterior is fitted there);
    # the estimate from the posterior moves G from it towards the workloads'
    person_and_size = [PERSON_SEX, Workload("person", ("NP",), ("AGE",))]
    for wrong in (G + 80.0, G - 80.0):
        res = synthesize_node(support, support.weights, person_and_size, Fraction(1),
                              gaussian_measure(private, np.random.default_rng(6), 3.0), wrong, total_sd=60.0)
        assert res.diagnostics["total"]["normaliser"] == wrong and abs(res.total - G) < 0.8 * abs(wrong - G), res.diagnostics["total"]


def test_the_posterior_is_fitted_at_the_posterior_free_total_and_the_total_estimated_from_it(setting):
    """A noisy count: the posterior is the fit at :func:`start_total`'s inverse-variance merge of the
    count and the partitions' sums (kept in the count's trust region), the same as a fit at that
    total given outright; the node's total is :func:`fit_total`'s least squares on that posterior."""
    from engine.synthesis._node import fit_total, measure_node, start_total

    support, private = setting
    noise = {}

    def measure(w, rho):  # the same noisy answers on every call
        if w not in noise:
            counts = answer(private, w).astype(float)
            noise[w] = counts + np.random.default_rng(len(noise) + 11).normal(0, 30.0, counts.size)
        return noise[w], 30.0

    given, sd = private.n_households + 60.0, 40.0
    res = synthesize_node(support, support.weights, WORKLOADS, Fraction(1), measure, given, total_sd=sd, prior_strength=0.1)
    measured = measure_node(WORKLOADS, Fraction(1), measure)
    G0 = float(np.clip(start_total(measured, given, sd), given - 3 * sd, given + 3 * sd))
    assert res.diagnostics["total"]["normaliser"] == G0 != given
    fixed = synthesize_node(support, support.weights, WORKLOADS, Fraction(1), measure, G0, prior_strength=0.1)
    np.testing.assert_allclose(res.weights, fixed.weights, rtol=1e-12, atol=1e-15)
    assert res.total == res.diagnostics["total"]["fitted"] == pytest.approx(fit_total(support, fixed.weights, measured, given, sd), rel=1e-12)


def test_scaled_dual_scales_with_the_total():
    """A fit's dual scaled by the ratio of totals (the dual scales with G); no dual: none."""
    from engine.synthesis._node import scaled_dual

    d = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(scaled_dual(d, 100.0, 120.0), 1.2 * d)
    np.testing.assert_allclose(scaled_dual(d, 0.5, 2.0), 2.0 * d)  # totals below one household count as one
    assert scaled_dual(None, 100.0, 120.0) is None


def test_the_total_stays_in_its_trust_region(setting):
    """"Contains" and person counts can be met by other household sizes: G is pinned weakly and
    may not leave total ± 3 sd."""
    support, private = setting
    G = private.n_households
    weak = [Workload("group", ("TEN",), ("AGE",)), PERSON_SEX]
    for wrong in (G + 80.0, G - 80.0):
        res = synthesize_node(support, support.weights, weak, Fraction(1), gaussian_measure(private, np.random.default_rng(8), 1e-3),
                              wrong, total_sd=10.0)
        assert wrong - 30.0 <= res.total <= wrong + 30.0, res.diagnostics["total"]
    person_only = [PERSON_SEX]
    res = synthesize_node(support, support.weights, person_only, Fraction(1), gaussian_measure(private, np.random.default_rng(9), 1.0),
                          G + 50.0, total_sd=1e4)
    assert abs(res.total - (G + 50.0)) < 1.0  # persons alone say nothing about the household count


def test_the_total_from_the_posterior_is_more_accurate_than_the_noisy_count_on_average(setting):
    """The statistical claim behind it: with the count's noise (sd 40) and the workloads' (σ 6),
    the estimate's RMS error is well below the count's, and it is not biased."""
    support, private = setting
    G = private.n_households
    rng = np.random.default_rng(7)
    count_err, joint_err = [], []
    for _ in range(30):
        noisy_total = G + rng.normal(0, 40.0)
        res = synthesize_node(support, support.weights, WORKLOADS, Fraction(1), gaussian_measure(private, rng, 6.0),
                              noisy_total, total_sd=40.0)
        count_err.append(noisy_total - G)
        joint_err.append(res.total - G)
    rms = lambda e: float(np.sqrt(np.mean(np.square(e))))  # noqa: E731
    assert rms(joint_err) < 0.5 * rms(count_err), (rms(joint_err), rms(count_err))
    assert abs(np.mean(joint_err)) < 3 * rms(joint_err) / np.sqrt(30) + 2.0
