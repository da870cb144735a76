"""How many attributes the PUMA level measures: as many as its budget can tell apart from the state.

A PUMA's one-way marginal of attribute ``a`` is measured to move the PUMA's posterior (its state's
posterior, :mod:`engine.synthesis._node`) where the PUMA differs from its state. Both sides of that
trade are known before any private measurement (no privacy cost):

- the signal, from the public data: :func:`between_puma_variation`, the L1 distance between a public
  PUMA's normalised marginal of ``a`` and its state's, averaged over the public PUMAs (weighted by
  their households; states with a single PUMA left out);
- the noise, from the budget: the marginal measured at a PUMA of ``G`` households with
  ``ρ_w = ρ / (k + pairs)`` (the PUMA workload's ``k`` one-way marginals and its two-way pairs share
  the level's ρ evenly, as :func:`engine.synthesis._node.measure_node` does) has Gaussian noise
  ``σ = L2 / √(2ρ_w)`` per cell, an expected L1 of ``√(2/π)·cells·σ``, and on the normalised scale
  :func:`expected_noise_l1` = ``√(2/π)·cells·σ / (G·m)``, ``m`` the workload's answer total per
  household on the public data (1 for a count of households).

The rule (:func:`choose_puma_attributes`): the ``minimum`` highest-ranked attributes of the public
ranking (:func:`engine.synthesis._workload_selection.select_workloads`, the attributes that vary most between
PUMAs) are always measured; the next one is added while its own expected noise, at the ρ split
over the enlarged workload, is at most its signal — a measurement noisier than the difference it is
there to capture spreads the level's ρ thinner for the others — stopping at the first that fails
or at ``maximum``. More ρ per PUMA, or larger PUMAs, measure more attributes; at small budgets
the PUMA level keeps its ``minimum``.

Why a rule rather than a fixed number: more PUMA attributes than four lower the error only where
the budget is large and the PUMAs are large enough for each marginal to carry more signal than
noise; with small PUMAs or small budgets they spread the level's ρ too thin, and past six they lose
everywhere (the peer benchmark's runs: ``benchmarks/results/HISTORY.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.data import HierarchicalData, unique_rows
from engine.queries import PrivacyUnit, Workload, answer, counts_by_node
from engine.synthesis._workload_selection import WorkloadSelection

__all__ = ["PumaAttributeChoice", "between_puma_variation", "choose_puma_attributes", "expected_noise_l1", "keep_puma_attributes"]


def between_puma_variation(public: HierarchicalData, workloads: Sequence[Workload]) -> np.ndarray:
    """Per workload: the mean over the public PUMAs, weighted by their households, of the L1
    distance between the PUMA's normalised answer and its state's (module docstring). States with
    one PUMA carry no such variation and are left out; 0 where no state has two PUMAs."""
    geo_state, geo_puma = public.domain.geography[0], public.domain.geography[1]
    states = unique_rows(public.geo[:, :1])
    pumas, households = unique_rows(public.geo[:, :2], return_counts=True)
    puma_state = np.searchsorted(states[:, 0], pumas[:, 0])
    several = np.bincount(puma_state, minlength=len(states))[puma_state] >= 2
    weight = households * several
    out = np.zeros(len(workloads))
    if weight.sum() <= 0:
        return out
    for i, w in enumerate(workloads):
        c_s, _ = counts_by_node(public, w, geo_state, states)
        c_p, _ = counts_by_node(public, w, geo_puma, pumas)
        share_s = c_s / np.maximum(c_s.sum(axis=1, keepdims=True), 1e-300)
        share_p = c_p / np.maximum(c_p.sum(axis=1, keepdims=True), 1e-300)
        dist = np.abs(share_p - share_s[puma_state]).sum(axis=1)
        out[i] = float((weight * dist).sum() / weight.sum())
    return out


def expected_noise_l1(public: HierarchicalData, w: Workload, unit: PrivacyUnit, rho_w: float, households: float) -> float:
    """Expected L1 distance that the Gaussian noise at ``rho_w`` adds to ``w``'s normalised answer
    at a node of ``households`` households (module docstring); the answer's total per household
    ``m`` is taken from the public data."""
    if rho_w <= 0 or households <= 0:
        return math.inf
    sigma = w.sensitivity(public.domain, unit)[1] / math.sqrt(2.0 * rho_w)
    per_household = float(answer(public, w).sum()) / max(public.n_households, 1)
    if per_household <= 0:
        return math.inf
    return math.sqrt(2.0 / math.pi) * w.n_cells(public.domain) * sigma / (households * per_household)


@dataclass(frozen=True)
class PumaAttributeChoice:
    """``count`` one-way PUMA marginals chosen by the signal-to-noise rule (module docstring);
    ``candidates``: per ranked attribute beyond the minimum, (workload id, its signal, its
    expected noise with it added, whether it was added)."""

    count: int
    minimum: int
    rho_puma: float
    households: float
    candidates: tuple[tuple[str, float, float, bool], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "signal to noise from the public data (engine.synthesis._puma_attributes): the ranked PUMA attributes beyond the minimum "
                      "are added while the expected noise of the added one-way marginal at the PUMA level's rho is at most "
                      "its between-PUMA variation on the public data",
            "puma_attributes": self.count,
            "minimum": self.minimum,
            "rho_per_puma": self.rho_puma,
            "typical_puma_households": self.households,
            "candidates": [{"workload": w, "signal_l1": round(s, 6), "expected_noise_l1": round(n, 6) if math.isfinite(n) else None,
                            "added": a} for w, s, n, a in self.candidates],  # None: no ρ (or no household) to measure with
        }


def choose_puma_attributes(public: HierarchicalData, ranked: Sequence[Workload], n_pairs: int, unit: PrivacyUnit, rho_puma: float,
                           households: float, *, minimum: int, maximum: int) -> PumaAttributeChoice:
    """How many of the ``ranked`` one-way PUMA workloads (best first) to measure: ``minimum``,
    then one more while the added one's :func:`expected_noise_l1` at ``rho_puma`` split over
    ``k + n_pairs`` workloads is at most its :func:`between_puma_variation` (module docstring), up
    to ``maximum`` and the ranking's length. ``households``: a typical PUMA's household count."""
    if minimum < 1 or maximum < minimum:
        raise ValueError(f"need 1 <= minimum <= maximum, got minimum {minimum} and maximum {maximum}")
    if n_pairs < 0:
        raise ValueError(f"n_pairs must be non-negative, got {n_pairs}")
    top = min(maximum, len(ranked))
    count = min(minimum, len(ranked))
    extra = list(ranked[count:top])
    signal = between_puma_variation(public, extra)
    rows = []
    stopped = False
    for w, s in zip(extra, signal):
        k = count + 1
        noise = expected_noise_l1(public, w, unit, rho_puma / (k + n_pairs), households)
        added = bool(not stopped and noise <= s)
        if added:
            count = k
        else:
            stopped = True
        rows.append((w.id, float(s), float(noise), added))
    return PumaAttributeChoice(count, minimum, float(rho_puma), float(households), tuple(rows))


def keep_puma_attributes(public: HierarchicalData, selection: WorkloadSelection, unit: PrivacyUnit, rho_puma: float, households: float, *,
                         minimum: int, maximum: int) -> tuple[WorkloadSelection, PumaAttributeChoice]:
    """The ``selection`` with as many of its ranked PUMA attributes as :func:`choose_puma_attributes`
    picks (its other PUMA workloads, the pairs, share the level's ρ), and the choice."""
    ranked = set(selection.puma_ranked)
    choice = choose_puma_attributes(public, selection.puma_ranked, sum(w not in ranked for w in selection.puma), unit, rho_puma, households,
                                    minimum=minimum, maximum=maximum)
    return selection.with_puma_attributes(choice.count), choice
