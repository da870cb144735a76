"""How far to trust the public prior: the MAP update's prior strength chosen from the node's own
noisy measurements by empirical Bayes (type-II maximum likelihood).

The MAP update (:mod:`engine.synthesis._map_update`) weighs the prior by α = r·G pseudo-households. The right
r depends on how far the private node is from the public data and on the budget, which no fixed
value knows (the best value differs between states and between budgets of one state:
``benchmarks/results/HISTORY.md``). Here r is read off the
measurements themselves, so that where they contradict the prior the prior weighs less.

Model (the Laplace view of the MAP prior): the node's household distribution q scatters around the
prior p like a Dirichlet of α pseudo-households, Cov q = Σ_p / (α + 1) with Σ_p = diag(p) − p pᵀ;
every measurement is y = G·A q + e with e ~ N(0, σ² I). To first order

    y ~ N(G·A p,  G²·A Σ_p Aᵀ / (α + 1) + S),      S = diag(σ²),

and r is the candidate that maximises this Gaussian marginal likelihood of the noisy answers, a
weaker prior than the strongest candidate only where the data favour it clearly (a log-likelihood
gain of at least :data:`MIN_GAIN`). With
the whitened matrix C = S^(−½) G² A Σ_p Aᵀ S^(−½) = U diag(λ) Uᵀ (one eigendecomposition) and
z = Uᵀ S^(−½)(y − G·A p), the log-likelihood is, up to a constant,

    −½ Σ_i [ log(1 + λ_i/(α + 1)) + z_i² / (1 + λ_i/(α + 1)) ],

cheap for any number of candidates. The choice is a function of the noisy answers and public data:
post-processing, no privacy cost. Candidates are a bounded set (``PriorStrengthRule.candidates``)
so that one node's noise cannot push the prior to either extreme.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.queries import Measurement, Support, centred_gram

__all__ = ["DEFAULT_CANDIDATES", "MIN_GAIN", "PriorStrengthChoice", "choose_prior_strength", "marginal_log_likelihood"]

DEFAULT_CANDIDATES: tuple[float, ...] = (0.03, 0.05, 0.1)  # the range the benchmark's refits spanned (module docstring)


@dataclass(frozen=True)
class PriorStrengthChoice:
    """The chosen relative strength ``strength`` (α = strength · G), the log-likelihood of every
    candidate (``loglik``, same order as ``candidates``) and the floor the choice was held to
    (``floor``, :mod:`engine.synthesis._strength_floor`; 0: none). The log-likelihoods are NaN when the floor
    left a single candidate, which is then the choice without them."""

    strength: float
    candidates: tuple[float, ...]
    loglik: tuple[float, ...]
    floor: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"strength": self.strength, "candidates": list(self.candidates),
                "loglik": [round(v, 3) if math.isfinite(v) else None for v in self.loglik],  # None: not computed (the floor decided)
                "floor": self.floor}


def marginal_log_likelihood(support: Support, prior: np.ndarray, measurements: Sequence[Measurement], total: float,
                            strengths: Sequence[float]) -> np.ndarray:
    """The Gaussian marginal log-likelihood (module docstring, up to one constant) of the noisy
    counts of ``measurements`` at every relative prior strength in ``strengths``."""
    ms = [m for m in measurements if m.noisy_answer.size]
    if not ms or any(m.sigma <= 0 for m in ms):
        raise ValueError("empirical Bayes needs measurements with positive noise")
    prior = np.asarray(prior, dtype=np.float64)
    G = max(float(total), 1.0)
    # the stacked incidence on the households' joint patterns, p summed per pattern: A Σ_p Aᵀ is the same
    A, pattern_of = support.cache.joint_patterns([m.workload for m in ms])
    p = np.bincount(pattern_of, weights=prior / prior.sum(), minlength=A.shape[1])
    y = np.concatenate([m.noisy_answer for m in ms])
    inv_sd = np.concatenate([np.full(m.noisy_answer.size, 1.0 / m.sigma) for m in ms])
    Ap = A @ p
    # a cell no household of positive prior weight falls in has C's row and column 0: a direction of
    # λ = 0 on its own (f = 1, its whitened residual z = y/σ), so the eigendecomposition runs on the others
    on = A @ (p > 0).astype(np.float64) > 0
    C = centred_gram(A[on], p)  # A Σ_p Aᵀ, scaled in place below: G² D B D, D = diag(1/σ)
    C *= inv_sd[on][:, None]
    C *= inv_sd[on][None, :]
    C *= G * G
    C = C + C.T  # symmetrised exactly, the halving in place: one dense copy at a time
    C /= 2
    lam, U = np.linalg.eigh(C)  # numpy's, which releases the GIL (scipy's holds it): the worker's other thread runs meanwhile
    del C
    lam = np.maximum(lam, 0.0)
    z2 = (U.T @ (inv_sd * (y - G * Ap))[on]) ** 2
    off = float(np.sum((inv_sd * y)[~on] ** 2))
    out = []
    for r in strengths:
        f = 1.0 + lam / (float(r) * G + 1.0)
        out.append(-0.5 * (float(np.sum(np.log(f) + z2 / f)) + off))
    return np.asarray(out)


MIN_GAIN = 2.0  # log-likelihood: a weaker prior (or, in engine.synthesis._prior_mixture, a wider one) is taken only at a likelihood ratio of at least e² ≈ 7.4


def choose_prior_strength(support: Support, prior: np.ndarray, measurements: Sequence[Measurement], total: float,
                          candidates: Sequence[float], min_gain: float = MIN_GAIN, floor: float = 0.0) -> PriorStrengthChoice:
    """The candidate relative strength of largest marginal likelihood — but the strongest candidate
    unless the best beats it by ``min_gain`` in log-likelihood: where the measurements carry little
    information (tiny budgets, small states) the likelihood is nearly flat, and a weak prior would
    let their noise in for nothing (``benchmarks/results/HISTORY.md``). ``floor``: the choice is raised to the smallest candidate
    of at least ``floor`` (the public simulation's weakest useful prior, :mod:`engine.synthesis._strength_floor`;
    the largest candidate if none is that strong). When at most one candidate is at or above the
    floor, that rule alone decides and the likelihood (a dense eigendecomposition in the measured
    cells) is not computed."""
    cands = tuple(float(c) for c in candidates)
    if not cands or any(c <= 0 for c in cands):
        raise ValueError("candidate prior strengths must be positive")
    if sum(c >= floor for c in cands) <= 1:
        # at most one candidate at or above the floor: whatever the likelihood, the choice is the
        # strongest (the rules below), so its dense cells × cells eigendecomposition is not computed
        return PriorStrengthChoice(max(cands), cands, tuple(math.nan for _ in cands), float(floor))
    ll = marginal_log_likelihood(support, prior, measurements, total, cands)
    strongest = max(range(len(cands)), key=lambda i: cands[i])
    best = max(range(len(cands)), key=lambda i: (ll[i], cands[i]))
    if ll[best] - ll[strongest] < min_gain:
        best = strongest
    if cands[best] < floor:
        allowed = [i for i in range(len(cands)) if cands[i] >= floor]
        best = min(allowed, key=lambda i: cands[i]) if allowed else strongest
    return PriorStrengthChoice(cands[best], cands, tuple(float(v) for v in ll), float(floor))
