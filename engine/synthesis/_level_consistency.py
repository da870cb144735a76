"""A parent's released tables are the sums of its children's: hold the children's sum to the parent.

Each PUMA posterior is its state's posterior updated with the PUMA's own noisy measurements. What a
PUMA fit takes from its noise does not cancel when the PUMAs are added up, so a state's released
answers — the sums of its PUMAs' — drift from the state posterior, which was fitted to the state's
own measurements with the state's larger budget, so the sum is the less accurate of the two
(``benchmarks/results/HISTORY.md``).

:func:`rake_to_parent` tilts every child by one common factor per household so that the children's
sum comes close to the parent's answers on the parent's measured workloads, by the noise-aware MAP
update of :mod:`engine.synthesis._map_update` on the sum (prior: the children's sum; "measurements": the
parent posterior's counts on those workloads, each with the parent measurement's σ, so the pull is
as strong as the parent's evidence):

    f_h = q*_h / X̄_h,   q*: the MAP fit of the sum X̄ = Σ_c G_c q_c / Σ_c G_c to G·A_w q_parent,
    q_c' ∝ q_c · f        (each child renormalised to its own total G_c).

A common factor keeps what tells the children apart (their ratios q_c / q_c' are equal) and their
totals; only the part of the children's deviations that adds up in the parent's tables is removed.
Post-processing of DP posteriors: no privacy cost.

The other direction, :func:`children_sum`: a workload measured at every child of a node is also a
measurement of the node itself — the sum of the children's noisy answers, with the sum of their
noise variances — so the parent's own fit takes its children's measurements in beside its own,
and what the PUMA level measures informs its state too. Post-processing of measurements already charged at the children's level: no privacy cost.

The children's household totals, :func:`totals_to_parent`: each child's total is estimated from
its posterior (``engine.synthesis._node``), which tells the children apart far better than their own
counts, but leans upward: the noisy answers are regressed on the answers of a posterior that is
drawn toward its prior, and a regressor shrunk toward its mean inflates the slope. The lean is
common to the children and adds up in the parent's total. The consistent household counts (an
integer least-squares fit of unbiased measurements, summing to the parent's) carry no such lean,
so the fitted totals are scaled to the children's consistent sum: the fits keep the shares, the
counts set the level. Post-processing of DP totals: no privacy cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.count_of_counts import largest_remainder_round
from engine.queries import Measurement, Support, Workload
from engine.synthesis._map_update import map_fit

__all__ = ["children_sum", "rake_to_parent", "totals_to_parent"]


def children_sum(children: Sequence[Sequence[Measurement]]) -> list[Measurement]:
    """The measurements of a parent node implied by its children's: for every workload measured at
    each of the ``children`` (one list of measurements per child, together covering the parent's
    households exactly once), the sum of the children's noisy answers, whose noise variance is the
    sum of theirs (independent noise). Workloads missing at some child are left out; the order is
    the first child's. ρ 0: the children's measurements were charged where they were made."""
    if not children:
        return []
    by_id = [{m.workload.id: m for m in ms} for ms in children]
    out = []
    for m in children[0]:
        parts = [x for x in (c.get(m.workload.id) for c in by_id) if x is not None]
        if len(parts) < len(children):
            continue
        shapes = {x.noisy_answer.shape for x in parts}
        if len(shapes) != 1:
            raise ValueError(f"{m.workload.id}: the children's answers have different shapes {sorted(shapes)}")
        noisy = np.sum([x.noisy_answer for x in parts], axis=0)
        out.append(Measurement(m.workload, noisy, float(np.sqrt(sum(x.variance for x in parts)))))
    return out


# The rake's targets are the state posterior's counts held with the state measurements' σ (tens of
# households a cell): at this solver tolerance the raked counts stay within a small fraction of that
# of a tighter fit's, and the rake, one of a state's largest fits, stops sooner
# (benchmarks/results/HISTORY.md)
RAKE_TOL = 1e-7


def rake_to_parent(
    support: Support,
    children: Sequence[np.ndarray],
    totals: Sequence[float],
    parent: np.ndarray,
    workloads: Sequence[tuple[Workload, float]],
    *,
    prior_strength: float = 0.1,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The children's weights (each normalised) tilted by one common factor per support household
    so that their sum, Σ_c ``totals[c]`` · ``children[c]``, fits ``parent`` (a distribution on the
    same support) on ``workloads`` — (workload, σ in counts) pairs, the parent's measured workloads
    and their noise. ``prior_strength``: the MAP update's α relative to the children's summed total.
    Returns (new weights, diagnostics: the sum's squared distance to the parent's counts per σ
    before and after)."""
    if len(children) != len(totals) or not children:
        raise ValueError("give one total per child and at least one child")
    q = [np.asarray(c, dtype=np.float64) for c in children]
    if any(c.shape != (support.n_support,) or np.any(c < 0) or c.sum() <= 0 for c in q):
        raise ValueError("every child needs non-negative weights with positive mass, one per support household")
    q = [c / c.sum() for c in q]
    G = np.asarray(totals, dtype=np.float64)
    if np.any(G < 0) or G.sum() <= 0:
        raise ValueError("the children's totals must be non-negative with a positive sum")
    p = np.asarray(parent, dtype=np.float64)
    if p.shape != (support.n_support,) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("the parent needs non-negative weights with positive mass, one per support household")
    p = p / p.sum()
    if not workloads:
        return q, {"workloads": 0}
    total = float(G.sum())
    mix = sum(g * c for g, c in zip(G, q)) / total
    targets = [Measurement(w, total * support.answer(w, p), float(sigma)) for w, sigma in workloads]

    def distance(x: np.ndarray) -> float:
        return float(sum(np.sum(((total * support.answer(m.workload, x) - m.noisy_answer) / m.sigma) ** 2) for m in targets))

    fit = map_fit(support, mix, targets, total, prior_strength=max(prior_strength * total, 1e-6), tol=RAKE_TOL)
    factor = np.divide(fit.weights, mix, out=np.ones_like(mix), where=mix > 0)
    out = []
    for c in q:
        t = c * factor
        s = t.sum()
        out.append(t / s if s > 0 else c)
    after = sum(g * c for g, c in zip(G, out)) / total
    return out, {"workloads": len(targets), "distance_before": distance(mix), "distance_after": distance(after),
                 "iterations": fit.diagnostics.get("iterations")}


def totals_to_parent(fitted: Sequence[float], counts: Sequence[int]) -> np.ndarray:
    """The children's household totals as integers summing to the sum of their ``counts`` (the
    consistent household counts, whose sum is the parent's): the ``fitted`` totals scaled to that
    sum and rounded by largest remainder; the counts themselves where the fitted totals are all 0."""
    f = np.asarray(fitted, dtype=np.float64)
    g = np.asarray(counts, dtype=np.int64)
    if f.shape != g.shape or f.ndim != 1 or np.any(f < 0) or np.any(g < 0):
        raise ValueError("give one non-negative fitted total and one non-negative count per child")
    total = int(g.sum())
    if f.sum() <= 0:
        return g.copy()
    return largest_remainder_round(f * (total / f.sum()), total)
