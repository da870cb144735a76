"""Noise-aware prior update: the maximum a-posteriori distribution on the support.

Tao et al.'s update (``engine.prior_update.prior_update``) first projects the noisy answers onto
what the support can produce and then matches them *exactly* at least relative entropy. That is
the right thing when the noise is small, but at small budgets it fits the noise: every cell is
forced to its noisy value, however large σ is relative to the signal. Here the same two pieces of
information — the public prior p and the Gaussian measurements ỹ_w = A_w x + N(0, σ_w²) — are
combined by their likelihoods instead:

    q* = argmin_q  α · KL(q ‖ p) + Σ_w ‖G · A_w q − ỹ_w‖² / (2 σ_w²),      q ∈ simplex(support)

where G is the node's household total (answers are per household: A_w q are expected counts per
household), σ_w is the measurement's noise in counts, and α > 0 (``prior_strength``, in
households) is how strongly the public prior is trusted. As α → 0 (or σ → 0) the solution tends to
Tao et al.'s minimum-relative-entropy distribution among those that best fit the answers; as
α → ∞ it stays at p. Measurements of all workloads are fitted jointly, so inconsistent noisy answers
are reconciled by their precisions instead of cycling (see the limits of the cyclic update).

The problem is convex; its Fenchel dual in λ (one entry per measured cell) is smooth and
unconstrained:

    min_λ  α log Σ_h p_h exp((Aᵀλ)_h / α) − λ·ỹ/G + ½ Σ_c s_c² λ_c²,      s_c = σ_c / G,

with q_h ∝ p_h exp((Aᵀλ)_h / α) at the optimum, solved by L-BFGS-B on sparse mat-vecs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize
from scipy.special import logsumexp

from engine.measurement import Measurement
from engine.support import Support


def map_update(
    support: Support,
    prior: np.ndarray,
    measurements: Sequence[Measurement],
    total: float,
    *,
    prior_strength: float = 1.0,
    max_iter: int = 500,
    tol: float = 1e-10,
) -> tuple[np.ndarray, dict]:
    """The MAP distribution on the support (module docstring). ``measurements``: noisy counts of
    the node with their σ, divided here by the household total G = ``total``
    (:meth:`~engine.measurement.Measurement.answers`). Returns (weights, diagnostics)."""
    p = np.asarray(prior, dtype=np.float64)
    p = p / p.sum()
    if not measurements:
        return p, {"iterations": 0, "converged": True}
    G = max(float(total), 1.0)
    alpha = float(prior_strength)
    if alpha <= 0:
        raise ValueError("prior_strength must be > 0")
    A = sp.vstack([support.incidence(m.workload) for m in measurements]).tocsr().astype(np.float64)
    y = np.concatenate([m.answers(G) for m in measurements])
    s2 = np.concatenate([np.full(m.noisy_answer.size, (m.sigma / G) ** 2) for m in measurements])
    if A.shape[0] != y.shape[0]:
        raise ValueError("answers do not match the workloads' cells")
    At = A.T.tocsr()
    live = p > 0
    logp = np.full(p.shape, -np.inf)
    logp[live] = np.log(p[live])

    def f(lam):
        u = logp + (At @ lam) / alpha
        lse = logsumexp(u[live])
        q = np.zeros_like(p)
        q[live] = np.exp(u[live] - lse)
        val = alpha * lse - lam @ y + 0.5 * np.sum(s2 * lam * lam)
        grad = A @ q - y + s2 * lam
        return val, grad

    res = minimize(f, np.zeros(A.shape[0]), jac=True, method="L-BFGS-B", options={"maxiter": max_iter, "ftol": tol, "gtol": 1e-9})
    u = logp + (At @ res.x) / alpha
    q = np.zeros_like(p)
    q[live] = np.exp(u[live] - logsumexp(u[live]))
    fit = A @ q
    diag = {
        "iterations": int(res.nit),
        "converged": bool(res.success),
        "l1_to_noisy_answers": float(np.abs(fit - y).sum()),
        "kl_to_prior": float(np.sum(q[live] * (np.log(np.maximum(q[live], 1e-300)) - logp[live]))),
        "prior_strength": alpha,
    }
    return q, diag
