"""Budget split and sensitivities for H-GEM rounds (ρ-zCDP).

GEM (Liu, Vietri & Wu 2021, Algorithm 2) splits a total ρ evenly over T rounds and, inside a
round, between the selection (exponential mechanism) and the measurement (Gaussian mechanism)
with a weight α. This module states the accounting used here, per the design doc
(``design/hierarchical_queries.md``, "Accounting"):

* selection: an ε₀-DP exponential mechanism costs ρ_sel = ε₀²/8 (the bounded-range bound of
  Cesar & Rogers 2021), so ε₀ = √(8 ρ_sel);
* measurement: a Gaussian mechanism with L2 sensitivity Δ and noise σ costs ρ_meas = Δ²/(2σ²),
  so σ = Δ / √(2 ρ_meas);
* per round ρ_round = ρ / T, ρ_sel = α ρ_round, ρ_meas = (1 − α) ρ_round (GEM: α = 1/2);
  sequential composition over T rounds sums to ρ;
* optionally a share of ρ first measures workloads chosen from public data, evenly, with no
  selection, and the rounds split the rest: :func:`state_budget`, the split the pipeline and the
  benchmarks charge, exact in fractions (the adaptive rounds' :class:`engine.synthesis._adaptive.RoundBudget`).

The privacy mechanisms themselves are injected by the caller (``engine/privacy``); these helpers
only compute parameters and sensitivities.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from engine.data import Domain
from engine.hgem.settings import HGEMSettingsError
from engine.queries import PrivacyUnit, Workload
from engine.synthesis import RoundBudget, split_rounds


def state_budget(rho_node: Fraction, rounds: int, alpha: Fraction, initial_share: Fraction, n_initial: int = 0) -> RoundBudget:
    """Exact split of ρ_node (:func:`engine.synthesis._adaptive.split_rounds`): ``initial_share`` × ρ_node
    for the ``n_initial`` initial workloads, evenly (``RoundBudget.initial_each``; no initial
    workloads: share 0), the rest over the rounds by the GEM split: ρ_round = ρ_rounds / T,
    ρ_sel = ε₀²/8 ≤ α ρ_round (ε₀ the largest float that fits), ρ_meas = (1 − α) ρ_round.
    ``rounds`` = 0 needs the whole ρ_node initial."""
    share = Fraction(initial_share) if n_initial > 0 else Fraction(0)
    if not 0 <= share <= 1 or rounds < 0:
        raise HGEMSettingsError(f"need 0 <= initial share <= 1 and rounds >= 0, got {share} and {rounds}")
    if rounds == 0 and share != 1:
        raise HGEMSettingsError("no adaptive rounds: the initial workloads must take the whole node budget")
    if rounds > 0 and share == 1:
        raise HGEMSettingsError("adaptive rounds without budget: lower the initial share or set the rounds to 0")
    return split_rounds(Fraction(rho_node), int(rounds), 1 - share, Fraction(alpha))


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
