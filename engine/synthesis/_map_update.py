"""Noise-aware prior update: the maximum a-posteriori distribution on the support.

Tao et al.'s update (``engine.synthesis._prior_update.prior_update``) first projects the noisy answers onto
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
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize

from engine.queries import Measurement, Support

# L-BFGS-B's relative reduction of the dual objective at which a fit stops. The released counts are
# the fitted answers times G, measured with noise of many households per cell: at this tolerance the
# fitted counts are within a small fraction of that noise of the optimum's, and the solver stops
# far sooner than at tighter ones (benchmarks/results/HISTORY.md).
FIT_TOL = 1e-8
# corrections L-BFGS keeps: the dual is ill-conditioned (cells that overlap across workloads share
# their curvature, directions they leave free have only the noise's), and a longer memory of its
# curvature takes fewer iterations, each a pair of sparse products, for an update of a few
# vectors of the cells' length (benchmarks/results/HISTORY.md)
MEMORY = 50


@dataclass
class MapFit:
    """The MAP posterior ``weights``, the dual solution ``dual`` (one entry per measured cell, the
    measurements' order; ``None`` when nothing was measured) and the solver's ``diagnostics``."""

    weights: np.ndarray
    dual: np.ndarray | None
    diagnostics: dict[str, Any]


def map_fit(
    support: Support,
    prior: np.ndarray,
    measurements: Sequence[Measurement],
    total: float,
    *,
    prior_strength: float = 1.0,
    max_iter: int = 500,
    tol: float = FIT_TOL,
    dual0: np.ndarray | None = None,
) -> MapFit:
    """The MAP distribution on the support (module docstring) with its dual. ``measurements``: noisy
    counts of the node with their σ, divided here by the household total G = ``total``
    (:meth:`~engine.queries._measurement.Measurement.answers`). ``dual0``: a starting point for the dual (for example the
    solution at a nearby household total, scaled by the ratio of totals: λ ∝ G·(ỹ − G·A q)/σ², and
    the prior strength grows with G too, so q's exponent Aᵀλ/α barely moves); the problem is
    strictly convex in λ, so the start changes only the number of iterations, not the optimum."""
    p = np.asarray(prior, dtype=np.float64)
    p = p / p.sum()
    if not measurements:
        return MapFit(p, None, {"iterations": 0, "converged": True})
    G = max(float(total), 1.0)
    alpha = float(prior_strength)
    if alpha <= 0:
        raise ValueError("prior_strength must be > 0")
    # households with equal columns of the stacked incidence get the same factor exp((Aᵀλ)_h / α):
    # solve on those patterns u with the prior mass P_u = Σ_{h∈u} p_h (the dual is unchanged,
    # α log Σ_h p_h e^{a_h·λ/α} = α log Σ_u P_u e^{a_u·λ/α}), then q_h = q_u · p_h / P_u.
    # Patterns of prior mass 0 keep mass 0.
    # a normalised workload's rows count in units of NORM_SCALE per household: each row, its answer
    # and its noise divided by its unit (the same problem, the dual rescaled), so that every row
    # speaks in households and L-BFGS, which is not invariant to a diagonal rescaling, sees one
    # scale (unscaled, a normalised node took four times the iterations). The rows are scaled in
    # the products (D A q and Aᵀ D λ, D = diag(1/unit)): the incidence and its transpose are the
    # ones cached with the support (IncidenceCache.joint_incidence), not copies
    workloads = [m.workload for m in measurements]
    A, At, pattern_of = support.cache.joint_incidence(workloads)
    y = np.concatenate([m.answers(G) for m in measurements])
    s2 = np.concatenate([np.full(m.noisy_answer.size, (m.sigma / G) ** 2) for m in measurements])
    if A.shape[0] != y.shape[0]:
        raise ValueError("answers do not match the workloads' cells")
    inv = np.concatenate([np.full(m.noisy_answer.size, 1.0 / m.workload.household_unit) for m in measurements])
    y = y * inv
    s2 = s2 * (inv * inv)
    P = np.bincount(pattern_of, weights=p, minlength=A.shape[1])
    live = np.flatnonzero(P > 0)
    if live.size < P.size:
        A, At = support.cache.live_incidence(workloads, live)
    logp = np.log(P[live])
    inv_alpha = 1.0 / alpha

    def dual_q(lam: np.ndarray) -> tuple[np.ndarray, float]:
        """q on the live patterns and log Σ_u P_u exp(a_u·λ/α), with one exponential pass."""
        u = At @ (lam * inv)
        u *= inv_alpha
        u += logp
        top = float(u.max())
        u -= top
        np.exp(u, out=u)
        z = float(u.sum())
        u /= z
        return u, top + float(np.log(z))

    def f(lam: np.ndarray) -> tuple[float, np.ndarray]:
        q, lse = dual_q(lam)
        s2lam = s2 * lam
        val = alpha * lse - lam @ y + 0.5 * float(s2lam @ lam)
        grad = inv * (A @ q) - y + s2lam
        return val, grad

    x0 = np.zeros(A.shape[0]) if dual0 is None or np.shape(dual0) != (A.shape[0],) else np.asarray(dual0, dtype=np.float64)
    res = minimize(f, x0, jac=True, method="L-BFGS-B", options={"maxiter": max_iter, "ftol": tol, "gtol": 1e-9, "maxcor": MEMORY})
    q_live, _ = dual_q(res.x)
    q_pattern = np.zeros(P.size)
    q_pattern[live] = q_live / P[live]
    q = q_pattern[pattern_of] * p
    fit = inv * (A @ q_live)
    diag = {
        "iterations": int(res.nit),
        "converged": bool(res.success),
        "l1_to_noisy_answers": float(np.abs(fit - y).sum()),
        "kl_to_prior": float(np.sum(q_live * (np.log(np.maximum(q_live, 1e-300)) - logp))),
        "prior_strength": alpha,
    }
    return MapFit(q, np.asarray(res.x), diag)
