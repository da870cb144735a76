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
    assert res.total == 250.0 and res.diagnostics["total"]["trace"] == []
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
    # without a partition the first estimate is the count; the alternation moves G from there
    person_and_size = [PERSON_SEX, Workload("person", ("NP",), ("AGE",))]
    for wrong in (G + 80.0, G - 80.0):
        res = synthesize_node(support, support.weights, person_and_size, Fraction(1),
                              gaussian_measure(private, np.random.default_rng(6), 3.0), wrong, total_sd=60.0)
        assert len(res.diagnostics["total"]["trace"]) >= 2 and abs(res.total - G) < 40.0, res.diagnostics["total"]


def test_the_alternation_stops_near_the_fixed_point_of_the_total(setting):
    """The kept G lies within half a household of the fixed point G* = F(G*) up to F's
    contraction, G* found by brute force: bisection of F(G) − G, each F from a posterior fitted
    from scratch at that G."""
    from engine.synthesis._node import fit_total, measure_node, update_node

    support, private = setting
    G_true = private.n_households
    noise = {}

    def measure(w, rho):  # the same noisy answers on every call
        if w not in noise:
            counts = answer(private, w).astype(float)
            noise[w] = counts + np.random.default_rng(len(noise) + 11).normal(0, 30.0, counts.size)
        return noise[w], 30.0

    given, sd = G_true + 60.0, 40.0
    res = synthesize_node(support, support.weights, WORKLOADS, Fraction(1), measure, given, total_sd=sd, prior_strength=0.1)
    measured = measure_node(WORKLOADS, Fraction(1), measure)

    def F(G):
        return fit_total(support, update_node(support, support.weights, measured, G, "map", 0.1, tol=1e-12).weights, measured, given, sd)

    lo, hi = given - 3 * sd, given + 3 * sd
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if F(mid) > mid else (lo, mid)
    G_star = 0.5 * (lo + hi)
    trace = res.diagnostics["total"]["trace"]
    G_last, F_last = trace[-1]
    c = (F_last - trace[-2][1]) / (G_last - trace[-2][0]) if len(trace) > 1 else 0.0  # F's slope between the last two rounds
    assert len(trace) > 1 and abs(F_last - G_last) < 0.5 * 1.01
    assert abs(res.total - G_star) <= 0.5 / (1.0 - min(max(c, 0.0), 0.9)) * 1.05, (trace, G_star)


def test_warm_dual_is_the_line_through_the_last_two_fits():
    """Two fits: the line through their duals at the new total; one fit (or two at one total):
    its dual scaled by the ratio of totals; no dual: none."""
    from engine.synthesis._node import warm_dual

    d0, d1 = np.array([1.0, -2.0, 0.5]), np.array([1.5, -1.0, 0.25])
    np.testing.assert_allclose(warm_dual([(100.0, d0), (110.0, d1)], 115.0), d1 + 0.5 * (d1 - d0))
    np.testing.assert_allclose(warm_dual([(50.0, d1), (100.0, d0), (110.0, d1)], 100.0), d0)  # the last two only
    np.testing.assert_allclose(warm_dual([(100.0, d0)], 120.0), 1.2 * d0)
    np.testing.assert_allclose(warm_dual([(100.0, d0), (100.0, d1)], 120.0), 1.2 * d1)
    np.testing.assert_allclose(warm_dual([(100.0, None), (110.0, d1)], 120.0), d1 * 120.0 / 110.0)
    assert warm_dual([], 100.0) is None and warm_dual([(100.0, d0), (110.0, None)], 120.0) is None


def test_the_line_through_two_fits_starts_next_to_the_optimum(setting):
    """At a third total the line through two fits' duals reaches the cold fit's posterior (within
    the solver's tolerance) in fewer iterations than the last dual scaled, which is what makes the
    total's later rounds cheap."""
    from engine.synthesis._node import measure_node, update_node, warm_dual

    support, private = setting
    measured = measure_node(WORKLOADS, Fraction(1), gaussian_measure(private, np.random.default_rng(21), 20.0))
    G = [private.n_households * f for f in (0.96, 0.98, 0.99)]
    fits = [(g, update_node(support, support.weights, measured, g, "map", 0.1).dual) for g in G[:2]]
    cold = update_node(support, support.weights, measured, G[2], "map", 0.1)
    line = update_node(support, support.weights, measured, G[2], "map", 0.1, dual0=warm_dual(fits, G[2]))
    scaled = update_node(support, support.weights, measured, G[2], "map", 0.1, dual0=warm_dual(fits[1:], G[2]))
    assert np.abs(line.weights - cold.weights).sum() < 1e-4
    assert line.diagnostics["iterations"] < scaled.diagnostics["iterations"]


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


def test_the_joint_total_is_more_accurate_than_the_noisy_count_on_average(setting):
    """The statistical claim behind it: with the count's noise (sd 40) and the workloads' (σ 6),
    the joint estimate's RMS error is well below the count's, and it is not biased."""
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
