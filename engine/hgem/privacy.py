"""Budget split and sensitivities for H-GEM / MWEM rounds (ρ-zCDP).

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
  selection (``split_initial``), and the rounds split the rest.

The privacy mechanisms themselves are injected by the caller (``engine/privacy``); these helpers
only compute parameters and sensitivities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.domain import Domain
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


def split_initial(rho: float, initial_share: float, n_initial: int) -> tuple[float, float]:
    """Split ``rho`` between ``n_initial`` measurements taken before the rounds (workloads chosen from
    public data, no selection cost) and the adaptive rounds: returns (ρ per initial measurement,
    ρ left for the rounds). The initial share is spent evenly over its workloads (as the prior
    update spends a node's ρ, ``engine.synthesis.measure_node``); the rounds then split what is left
    with :func:`gem_budget`. Sequential composition: n_initial · ρ_each + ρ_rounds = ρ.
    """
    if rho <= 0 or not 0.0 <= initial_share <= 1.0:
        raise ValueError("need rho > 0 and 0 <= initial_share <= 1")
    if initial_share > 0 and n_initial < 1:
        raise ValueError("an initial share needs at least one initial workload")
    if initial_share == 0:
        return 0.0, float(rho)
    rho_initial = float(rho) * float(initial_share)
    return rho_initial / int(n_initial), float(rho) - rho_initial


def rho_from_epsilon(epsilon: float, delta: float) -> float:
    """The largest ρ with ρ + 2√(ρ log(1/δ)) ≤ ε (the standard zCDP → (ε, δ) conversion)."""
    L = math.log(1.0 / delta)
    r = (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2
    return r


def cell_sensitivity(w: Workload, domain: Domain, unit: PrivacyUnit) -> float:
    """L∞ sensitivity of the count vector: how much one cell can change.

    group level: one household is in or out of a cell (a moved household leaves one cell and
    enters another): 1. person level: a household's ≤ M persons can all fall into one cell: M
    (under the person unit, M − 1 movers plus the added person). Never above the L1 bound of
    ``Workload.sensitivity``.
    """
    l1, _ = w.sensitivity(domain, unit)
    per_cell = 1.0 if w.level == "group" else float(domain.max_size)
    return min(l1, per_cell)


def score_sensitivity(
    workloads, domain: Domain, unit: PrivacyUnit, n_households: float, n_persons: float
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
