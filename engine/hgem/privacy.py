"""Budget split and sensitivities for H-GEM rounds (ρ-zCDP).

GEM (Liu, Vietri & Wu 2021, Algorithm 2) splits a total ρ evenly over T rounds and, inside a
round, between the selection (exponential mechanism) and the measurement (Gaussian mechanism)
with a weight α. This module states the accounting used here, per the design doc
(``design/hierarchical_queries.md``, "Accounting"):

* selection: an ε₀-DP exponential mechanism costs ρ_sel = ε₀²/8 (the bounded-range bound of
  Cesar & Rogers 2021), so ε₀ = √(8 ρ_sel); permute-and-flip is charged the generic ε-DP → zCDP
  bound ρ_sel = ε₀²/2 (as ``engine.privacy.accountant`` does), so ε₀ = √(2 ρ_sel);
* measurement: a Gaussian mechanism with L2 sensitivity Δ and noise σ costs ρ_meas = Δ²/(2σ²),
  so σ = Δ / √(2 ρ_meas);
* per round ρ_round = ρ / T, ρ_sel = α ρ_round, ρ_meas = (1 − α) ρ_round (GEM: α = 1/2);
  sequential composition over T rounds sums to ρ;
* optionally a share of ρ first measures workloads chosen from public data, evenly, with no
  selection, and the rounds split the rest: :func:`state_budget`, the split the pipeline and the
  benchmarks charge, exact in fractions (:func:`gem_budget` is its float reference).

The privacy mechanisms themselves are injected by the caller (``engine/privacy``); these helpers
only compute parameters and sensitivities.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from engine.domain import Domain
from engine.hgem.settings import HGEMSettingsError
from engine.privacy.accountant import epsilon_for_exponential_rho, exponential_mechanism_rho
from engine.privacy.ledger import BudgetExceededError
from engine.queries import PrivacyUnit, Workload


@dataclass(frozen=True)
class RoundBudget:
    """Per-round privacy parameters of an adaptive-measurements run (ρ-zCDP)."""

    rho_total: float
    rounds: int
    alpha: float
    rho_round: float
    rho_select: float
    rho_measure: float
    epsilon0: float  # ε of the selection mechanism (ρ_sel = ε₀²/8)

    def sigma(self, l2_sensitivity: float) -> float:
        """Gaussian σ (in the units of ``l2_sensitivity``) so that one measurement costs ρ_meas."""
        return float(l2_sensitivity) / math.sqrt(2.0 * self.rho_measure)


def gem_budget(
    rho: float, rounds: int, alpha: float = 0.5, selection: str = "exponential_mechanism"
) -> RoundBudget:
    """Split ``rho`` over ``rounds`` rounds; ``alpha`` is the selection share of each round.

    selection: ``"exponential_mechanism"`` (ρ_sel = ε₀²/8) or ``"permute_and_flip"`` (ρ_sel = ε₀²/2).
    """
    if rho <= 0 or rounds < 1 or not 0.0 < alpha < 1.0:
        raise ValueError("need rho > 0, rounds >= 1 and 0 < alpha < 1")
    per = {"exponential_mechanism": 8.0, "permute_and_flip": 2.0}
    if selection not in per:
        raise ValueError(f"selection must be one of {sorted(per)}")
    rr = rho / rounds
    rs, rm = alpha * rr, (1.0 - alpha) * rr
    return RoundBudget(float(rho), int(rounds), float(alpha), rr, rs, rm, math.sqrt(per[selection] * rs))


@dataclass(frozen=True)
class StateBudget:
    """The exact split of one node's ρ (:func:`state_budget`): ``n_initial`` measurements at
    ``rho_initial`` each, then ``rounds`` rounds of a selection at ``rho_select`` = ε₀²/8 and a
    measurement at ``rho_measure``."""

    rho_node: Fraction
    rounds: int
    n_initial: int
    rho_initial: Fraction
    rho_rounds: Fraction
    rho_round: Fraction
    rho_select: Fraction
    rho_measure: Fraction
    epsilon0: float

    def total(self) -> Fraction:
        """What the whole run charges (sequential composition): never above ``rho_node``."""
        return self.n_initial * self.rho_initial + self.rounds * (self.rho_select + self.rho_measure)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (fractions as exact strings)."""
        return {k: (str(v) if isinstance(v, Fraction) else v) for k, v in self.__dict__.items()}


def state_budget(rho_node: Fraction, rounds: int, alpha: Fraction, initial_share: Fraction, n_initial: int = 0) -> StateBudget:
    """Exact split of ρ_node: ``initial_share`` × ρ_node evenly over the ``n_initial`` initial
    workloads (no initial workloads: share 0), the rest over the rounds by the GEM split of
    :func:`gem_budget`, in fractions: ρ_round = ρ_rounds / T, ρ_sel = ε₀²/8 ≤ α ρ_round (ε₀ the
    largest float that fits), ρ_meas = (1 − α) ρ_round. ``rounds`` = 0 needs the whole ρ_node
    initial. Raises :class:`BudgetExceededError` if the split would spend more than ρ_node."""
    rounds, alpha, rho_node = int(rounds), Fraction(alpha), Fraction(rho_node)
    share = Fraction(initial_share) if n_initial > 0 else Fraction(0)
    if not 0 <= share <= 1 or rounds < 0:
        raise HGEMSettingsError(f"need 0 <= initial share <= 1 and rounds >= 0, got {share} and {rounds}")
    rho_initial = share * rho_node / n_initial if n_initial > 0 else Fraction(0)
    rho_rounds = rho_node - share * rho_node
    common: dict[str, Any] = dict(rho_node=rho_node, rounds=rounds, n_initial=int(n_initial), rho_initial=rho_initial, rho_rounds=rho_rounds)
    if rounds == 0:
        if rho_rounds != 0:
            raise HGEMSettingsError("no adaptive rounds: the initial workloads must take the whole node budget")
        out = StateBudget(**common, rho_round=Fraction(0), rho_select=Fraction(0), rho_measure=Fraction(0), epsilon0=0.0)
    else:
        if rho_rounds <= 0:
            raise HGEMSettingsError("adaptive rounds without budget: lower the initial share or set the rounds to 0")
        rho_round = rho_rounds / rounds
        rho_sel_planned = alpha * rho_round
        eps0 = epsilon_for_exponential_rho(rho_sel_planned)
        rho_meas = rho_round - rho_sel_planned
        ref = gem_budget(float(rho_rounds), rounds, float(alpha))  # the documented float split
        if not (math.isclose(ref.rho_measure, float(rho_meas), rel_tol=1e-9) and math.isclose(ref.epsilon0, eps0, rel_tol=1e-9)):
            raise RuntimeError(f"H-GEM budget split: the exact split ({rho_meas}, ε₀ {eps0}) disagrees with gem_budget's {ref}")
        out = StateBudget(**common, rho_round=rho_round, rho_select=exponential_mechanism_rho(eps0), rho_measure=rho_meas,
                          epsilon0=eps0)
    if out.total() > rho_node:  # a raised error, never an assert (python -O strips asserts)
        raise BudgetExceededError(f"H-GEM budget split would spend more than the node's ρ = {rho_node}")
    return out


def cell_sensitivity(w: Workload, domain: Domain, unit: PrivacyUnit) -> float:
    """L∞ sensitivity of the count vector: how much one cell can change.

    group level: one household is in or out of a cell (a moved household leaves one cell and
    enters another): 1. person level: a household's ≤ M persons can all fall into one cell: M
    (under the person unit too: a household's M persons leave one cell for another, or a whole
    household of M appears). Never above the L1 bound of
    ``Workload.sensitivity``.
    """
    l1, _ = w.sensitivity(domain, unit)
    per_cell = 1.0 if w.level == "group" else float(domain.max_size)
    return min(l1, per_cell)


def score_sensitivity(
    workloads: Iterable[Workload], domain: Domain, unit: PrivacyUnit, n_households: float, n_persons: float
) -> float:
    """Sensitivity of the selection score max_y |q_y(D) − q_y(Â)| over normalised answers.

    Taken as the maximum over the candidate workloads (one ε₀ for the whole candidate set) with
    N_G, N_I treated as public constants (as in the H-GEM paper, appendix A.2).
    """
    best = 0.0
    for w in workloads:
        n = n_households if w.level == "group" else n_persons
        best = max(best, cell_sensitivity(w, domain, unit) / max(float(n), 1.0))
    return best


def measurement_l2_sensitivity(w: Workload, domain: Domain, unit: PrivacyUnit, n_households: float, n_persons: float) -> float:
    """L2 sensitivity of the normalised answer vector (count L2 from Workload.sensitivity / N)."""
    _, l2 = w.sensitivity(domain, unit)
    n = n_households if w.level == "group" else n_persons
    return l2 / max(float(n), 1.0)
