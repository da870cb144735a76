"""The prior update of Tao, Bater, Machanavajjhala — "Prior-Aware Distribution Estimation for
Differential Privacy": :func:`prior_update` is Algorithm 1 (IDE) as T sweeps over the measured
workloads on the weighted support of :mod:`engine.queries._support` (the distribution q is a weight vector
over whole public households, Tao et al. §3.2 / PMW-Pub §3.2), the per-node step PRIOR_UPDATE of
Algorithm 2 (state level, then every PUMA from the state's posterior). Each step is a projection of
:mod:`engine.queries._projection`: Definition 3.1 for a workload that partitions the households, the
two-stage L1 / I-projection otherwise.

Scale convention: every answer handled here is **per household of the node**: a noisy count
vector divided by the (noisy or public) number of households Ñ_G of the node (Alg. 2 line 5,
:meth:`engine.queries._measurement.Measurement.answers`). For a group-level workload this is the usual proportion; for a
person-level workload it is persons-per-household in each cell, which is linear in the household
distribution q (the person-normalised H-GEM answer, counts / N_I, is not linear in q).

The synthetic households are then drawn from the posterior by :mod:`engine.synthesis._household_sampling`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine.queries import (
    Measurement,
    SimplexMethod,
    Support,
    entropy_projection,
    kl_divergence,
    least_relative_entropy_update,
    project_simplex_l1,
    project_to_hull_l1,
)


@dataclass
class PriorUpdateResult:
    weights: np.ndarray
    targets: dict[str, np.ndarray]
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def diagnostics(self) -> dict[str, Any]:
        """JSON-serialisable convergence record (for the run's internal logs)."""
        return {"sweeps": self.history, "seconds": self.seconds}


class _Target:
    """Per-measurement state: the feasible answers y* and how to apply the update."""

    def __init__(
        self, support: Support, m: Measurement, total: float, p0: np.ndarray, simplex_method: SimplexMethod, tie_break: bool
    ):
        self.w = m.workload
        self.noisy = m.answers(total)
        n_cells = self.w.n_cells(support.data.domain)
        if self.noisy.shape != (n_cells,):
            raise ValueError(f"{self.w.id}: answer has shape {self.noisy.shape}, expected ({n_cells},)")
        self.A = support.incidence(self.w)
        self.partition = self.w.is_partition()
        self.newton_iterations = 0
        self.unconverged = 0
        if self.partition:
            self.cells = support.cache.partition_cells(self.w)
            allowed = np.bincount(self.cells, minlength=n_cells) > 0
            # Alg. 1 line 7: a partition of the support covers every point: Σy = 1.
            self.y = project_simplex_l1(self.noisy, allowed=allowed, method=simplex_method)
            return
        # Stage 1 once per node, on the support reachable from the prior (p0 > 0).
        self.patterns = support.patterns(self.w)
        self.reachable = self.patterns.mass(p0) > 0
        P = self.patterns.matrix[np.flatnonzero(self.reachable)]
        self.y, self.l1_optimal = project_to_hull_l1(P, self.noisy, reference=(self.A @ p0) if tie_break else None)
        self.p0 = p0
        self.lam: np.ndarray | None = None  # the last dual solution, warm-starts the next projection

    def apply(self, q: np.ndarray, newton_tol: float, newton_max_iter: int, revive: float) -> np.ndarray:
        if self.partition:
            return least_relative_entropy_update(q, self.cells, self.y)
        if np.any(self.reachable & (self.patterns.mass(q) <= 0)):
            # Some households reachable from the prior lost all their mass in an earlier partition
            # update (a cell answered 0), so y* may no longer be producible from q. As in Def. 3.1
            # case 2 (mass for a row of zero prior mass is spread over its domain points), the
            # reference measure gets back a vanishing share of the prior: q + revive · p0.
            q = q + revive * self.p0
            q /= q.sum()
        # A noisy answer outside the producible set (L* > 0) projects onto the boundary of that
        # set, where the dual has no finite minimiser: use the interior shift at once. An answer
        # inside it (L* = 0, e.g. noiseless) is first matched exactly.
        interior = 1e-3 if self.l1_optimal > 1e-12 else None
        z, info = entropy_projection(
            q, self.patterns, self.y, interior=interior, tol=newton_tol, max_iter=newton_max_iter, lam0=self.lam
        )
        self.lam = info.lam
        self.newton_iterations += info.iterations
        self.unconverged += not info.converged
        return z


def prior_update(
    support: Support,
    measurements: Sequence[Measurement],
    *,
    total: float = 1.0,
    prior: np.ndarray | None = None,
    T: int = 10,
    order: Literal["cyclic", "random"] = "cyclic",
    rng: np.random.Generator | None = None,
    simplex_method: SimplexMethod = "euclidean",
    tol: float = 1e-6,
    newton_tol: float = 1e-9,
    newton_max_iter: int = 30,
    tie_break: bool = True,
    revive: float = 1e-9,
) -> PriorUpdateResult:
    """Tao et al. Algorithm 1 (IDE) on a support of public households; PRIOR_UPDATE of Algorithm 2.

    Starting from ``prior`` (default: ``support.weights``), each of ``T`` sweeps visits every
    measurement once (``order="cyclic"`` in the given order, ``"random"`` in a fresh random order per
    sweep — Alg. 1 line 4 draws the partial workload at random) and replaces q by the
    least-relative-entropy distribution matching that workload's feasible answers:
    - partition workloads (group level, S_I = ∅): y* by :func:`project_simplex_l1` (lines 6–10) and
      the closed form of Definition 3.1 (line 11);
    - other workloads: y* by :func:`project_to_hull_l1` and the I-projection
      :func:`entropy_projection` (the same two-stage problem, solved numerically).
    T sweeps are T·|W| iterations of Alg. 1 (the paper used 2|W| iterations, i.e. T = 2).
    ``total``: the node's household total Ñ_G the noisy counts are divided by (the default 1 for
    measurements already per household). The noise σ of the measurements is not used: IDE matches
    the feasible answers exactly.

    Returns the posterior weights (a distribution on the support) with a per-sweep history:
    L1 workload error against the noisy answers (``l1_noisy``, summed over workloads) and against the
    feasible answers (``l1_feasible``, → 0 when the feasible answers are jointly consistent),
    the largest per-workload feasible error, and KL(q ‖ prior). Stops early when that largest
    error falls below ``tol``.
    """
    t0 = time.perf_counter()
    if prior is None:
        prior = support.weights
    p0 = np.asarray(prior, dtype=np.float64)
    if p0.shape != (support.n_support,) or p0.sum() <= 0:
        raise ValueError("prior must be a non-negative vector over the support with positive mass")
    q = p0 / p0.sum()
    p0 = q.copy()
    targets = [_Target(support, m, total, p0, simplex_method, tie_break) for m in measurements]
    rng = rng if rng is not None else np.random.default_rng(0)
    history: list[dict[str, Any]] = []
    for sweep in range(1, T + 1):
        idx = np.arange(len(targets)) if order == "cyclic" else rng.permutation(len(targets))
        for i in idx:
            q = targets[i].apply(q, newton_tol, newton_max_iter, revive)
            q /= q.sum()
        errs_noisy, errs_feasible = [], []
        for tg in targets:
            a = tg.A @ q
            errs_noisy.append(float(np.abs(a - tg.noisy).sum()))
            errs_feasible.append(float(np.abs(a - tg.y).sum()))
        history.append(
            {
                "sweep": sweep,
                "l1_noisy": float(sum(errs_noisy)),
                "l1_feasible": float(sum(errs_feasible)),
                "max_l1_feasible": float(max(errs_feasible, default=0.0)),
                "kl_to_prior": kl_divergence(q, p0),
            }
        )
        if history[-1]["max_l1_feasible"] < tol:
            break
    return PriorUpdateResult(
        weights=q,
        targets={tg.w.id: tg.y for tg in targets},
        history=history,
        seconds=time.perf_counter() - t0,
    )
