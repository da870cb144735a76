"""engine.synthesis: the count-of-counts size histogram as a noisy measurement inside the MAP fit.

Properties: it is weighed by its precision (σ → 0 reproduces it, σ → ∞ leaves the prior), and
a correctly specified measurement never makes the size marginal worse on average (Bayesian
combination of the prior with an unbiased measurement), unlike imposing the noisy sizes.
"""

from fractions import Fraction

import numpy as np
import pytest

from engine.queries import Workload, answer
from engine.support import Support
from engine.synthesis import size_measurement, synthesize_node
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
        size_measurement(DOMAIN, [1, 2, 3], 1.0, 6)
    m = size_measurement(DOMAIN, [10, 20, 30, 40], 2.0, 100)
    assert m.workload == NP and np.allclose(m.answer, [0.1, 0.2, 0.3, 0.4]) and m.sigma == 2.0


def test_precision_decides(setting):
    support, private = setting
    truth = answer(private, NP).astype(float)
    G = private.n_households
    exact = synthesize_node(support, support.weights, [], Fraction(0), never_called, G,
                            prior_strength=0.1, extra=[size_measurement(DOMAIN, truth, 1e-3, G)])
    assert np.abs(size_marginal(support, exact.weights) - truth / G).max() < 1e-3
    vague = synthesize_node(support, support.weights, [], Fraction(0), never_called, G,
                            prior_strength=0.1, extra=[size_measurement(DOMAIN, truth, 1e6, G)])
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
                              prior_strength=0.1, extra=[size_measurement(DOMAIN, noisy, sigma, G)])
        fitted.append(np.abs(size_marginal(support, res.weights) - truth / G).sum())
        imposed.append(np.abs(np.clip(noisy, 0, None) / G - truth / G).sum())
    assert np.mean(fitted) <= prior_err + 1e-9  # the measurement is information: never worse than the prior
    assert np.mean(fitted) <= np.mean(imposed) + 1e-9  # and never worse than imposing it
