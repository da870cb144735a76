"""The exponential mechanism's ε²/8 charge needs the ε-bounded-range condition
(engine.privacy._accountant.exponential_mechanism_rho): for neighbouring D, D' the score differences
q(D,r) − q(D',r) over the candidates r must span at most 2Δ, Δ the sensitivity handed to the
mechanism. Checked here for the scores the pipeline builds in H-GEM's selection rounds
(PrivateSession.select_worst_workload: max-abs-error scores over the candidate workloads of
engine.hgem.state, normalised by public constants, Δ from engine.hgem.privacy.score_sensitivity), on
random and worst-case neighbours under both privacy units.
"""

import numpy as np
import pytest

from engine.hgem.privacy import score_sensitivity
from engine.hgem.settings import HGEMSettings
from engine.hgem.workloads import candidate_workloads
from engine.privacy._session import max_abs_error_scores
from engine.queries._queries import answer
from tests.privacy.test_workload_sensitivity import DATA, DOMAIN, rederive
from tests.sensitivity_harness import neighbour_pairs

N_G = 60.0  # the DP household count of the node: public once measured, fixed before the rounds
N_I = N_G * 2.5  # N_G × the public mean household size
CANDIDATES = candidate_workloads(DOMAIN, HGEMSettings())
NORMALISERS = [N_G if w.level == "group" else N_I for w in CANDIDATES]
N_CELLS = [w.n_cells(DOMAIN) for w in CANDIDATES]


def targets(data):
    return np.concatenate([answer(data, w).astype(np.float64).ravel() / n for w, n in zip(CANDIDATES, NORMALISERS)])


def em_log_probs(scores, sensitivity, epsilon):
    z = epsilon * scores / (2.0 * sensitivity)
    return z - np.logaddexp.reduce(z)


@pytest.mark.parametrize("unit", ["household", "person"])
def test_selection_scores_are_bounded_range(unit):
    rng = np.random.default_rng(11)
    pairs = neighbour_pairs(DATA, unit, trials=80, rng=rng, rederive=rederive)
    delta = score_sensitivity(CANDIDATES, DOMAIN, unit, N_G, N_I)
    eps = 0.7
    # model answers as train_hgem hands them over: the model's normalised answers, here a
    # perturbation of the data's own (small errors make the max-abs score switch cells often)
    base = targets(DATA)
    models = [base + rng.normal(0, s, size=base.size) for s in (0.0, 0.005, 0.05)] + [rng.random(base.size)]
    widest = 0.0
    for model in models:
        for a, b in pairs:
            diff = max_abs_error_scores(model, targets(b), N_CELLS) - max_abs_error_scores(model, targets(a), N_CELLS)
            assert np.abs(diff).max() <= delta + 1e-12
            span = diff.max() - diff.min()
            assert span <= 2 * delta + 1e-12
            ratio = em_log_probs(max_abs_error_scores(model, targets(b), N_CELLS), delta, eps) - em_log_probs(
                max_abs_error_scores(model, targets(a), N_CELLS), delta, eps)
            assert ratio.max() - ratio.min() <= eps + 1e-9  # ε-bounded range, directly
            widest = max(widest, float(np.abs(diff).max()))
    # the bound is not vacuous: some neighbour moves a score by a large part of Δ
    assert widest >= 0.5 * delta


def test_a_too_small_sensitivity_breaks_the_condition():
    rng = np.random.default_rng(3)
    pairs = neighbour_pairs(DATA, "household", trials=40, rng=rng, rederive=rederive)
    delta = score_sensitivity(CANDIDATES, DOMAIN, "household", N_G, N_I)
    model = targets(DATA)
    worst = max(float(np.ptp(max_abs_error_scores(model, targets(b), N_CELLS) - max_abs_error_scores(model, targets(a), N_CELLS)))
                for a, b in pairs)
    assert worst > 2 * (delta / 4)  # Δ/4 would not be a valid sensitivity: the check can fail
