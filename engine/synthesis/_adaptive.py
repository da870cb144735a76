"""Adaptive measurement rounds: spend part of a node's budget where the model is wrong.

After a node's public-chosen workloads are measured and fitted, ``rounds`` more workloads are
chosen one at a time from a candidate set — the one whose answers the current posterior gets most
wrong on the private data — measured, and fitted (AIM, McKenna et al. 2022, Algorithm 1: select by
the exponential mechanism, measure by the Gaussian mechanism, re-estimate; PMW-Pub, Liu et al.
2021, does the same over the public support). The prior update re-estimates after every second
pick (``engine.synthesis._node.PICKS_PER_FIT``): a pick scored on the model of the measurements
before the last one is post-processing of them all the same, so the accounting is unchanged.
Each round costs

    ρ_select = ε₀²/8       (exponential mechanism, bounded range: Cesar & Rogers 2021, Lemma 3.2;
                            ``engine.privacy._accountant.exponential_mechanism_rho``)
    ρ_measure               (Gaussian mechanism, ρ = Δ₂²/(2σ²): Bun & Steinke 2016, Prop. 1.6)

charged to the ledger by the private session before the draw and persisted, so a rerun reuses
the draw. The split of the node's ρ (:class:`RoundBudget`, :func:`split_rounds`) is exact in
fractions; H-GEM's rounds (``engine.hgem.privacy.state_budget``) are split by the same function.

The score of a candidate workload w is AIM's quality: ‖y_w(D) − G·A_w q‖₁ − √(2/π)·σ_w·cells_w —
the L1 distance between the private counts and the model's expected counts (G the node's DP
household total, a constant for the mechanism), less the expected L1 error of measuring w at this
round's σ_w (a data-independent offset that keeps large, noisy workloads from winning on noise).
The private session computes the scores and their sensitivity, max_w L1(w) under the privacy unit
(``PrivateSession.select_worst_fit``).

Candidates (:func:`candidate_workloads`): every workload on two or three attributes of the domain
(person level when it names a person attribute, with the measured workloads' ``first``; a
group-level partition otherwise) within a cell cap, minus the attribute sets the node already
measured at that level.

Where the node's workloads are normalised (``engine.queries._queries.Workload.normalised``), the chosen
workload is measured in that form too (:func:`measured_form`), and the candidates are scored on
the plain counts of each household's first ``select_first`` persons (:data:`SELECT_FIRST`, 2, by
default): the scores need the model's answers of every candidate, which plain counts give from one
grouping of the support's persons (:class:`engine.queries._queries.CandidateAnswers`), and their L1 sensitivity is 2 where
every person's counts have M. Two persons, not more: each further person lets the children of
large households into the scores, which helps a state whose large households the public data
mis-states, but raises the selection's sensitivity and with it its noise, which costs most at small
budgets (the peer benchmark's runs: ``benchmarks/results/HISTORY.md``, "Normalised workloads and
the selection's persons").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from engine.data import Domain
from engine.errors import DPReleaseError
from engine.privacy import BudgetExceededError, epsilon_for_exponential_rho, exponential_mechanism_rho
from engine.queries import PrivacyUnit, Workload

# select(candidates, model counts (concatenated), penalty per candidate, ε₀, round tag) -> index
SelectFn = Callable[[Sequence[Workload], np.ndarray, np.ndarray, float, str], int]

__all__ = ["SELECT_FIRST", "AdaptiveRounds", "RoundBudget", "SelectFn", "candidate_workloads",
           "expected_measurement_l1", "initial_rho", "measured_form", "round_budget", "selection_first", "split_rounds"]

SELECT_FIRST = 2  # normalised nodes: candidates scored on the plain counts of each household's first two persons (default)


@dataclass(frozen=True)
class AdaptiveRounds:
    """``rounds`` adaptive rounds taking ``share`` of the node's ρ, each round's ρ split
    ``select_share`` to the selection and the rest to the measurement (AIM: 1/10);
    ``max_cells``: the candidates' cell cap; ``max_attributes``: candidates on 2..max_attributes
    attributes; ``select_first``: at normalised nodes, the candidates are scored on the plain counts
    of each household's first this many persons (:func:`selection_first`)."""

    rounds: int = 0
    share: Fraction = Fraction(0)
    select_share: Fraction = Fraction(1, 10)
    max_cells: int = 1024
    max_attributes: int = 3
    select_first: int = SELECT_FIRST

    def __post_init__(self) -> None:
        object.__setattr__(self, "share", Fraction(self.share))
        object.__setattr__(self, "select_share", Fraction(self.select_share))
        if self.rounds < 0 or not 0 <= self.share < 1 or not 0 < self.select_share < 1:
            raise ValueError(f"need rounds >= 0, 0 <= share < 1, 0 < select_share < 1; got {self.rounds}, {self.share}, {self.select_share}")
        if (self.rounds == 0) != (self.share == 0):
            raise ValueError("adaptive rounds need a budget share and a budget share needs rounds")
        if self.max_attributes < 2:
            raise ValueError("candidates name at least two attributes")
        if self.select_first < 1:
            raise ValueError(f"select_first counts at least one person; got {self.select_first}")

    @property
    def active(self) -> bool:
        return self.rounds > 0


@dataclass(frozen=True)
class RoundBudget:
    """The exact split of a node's ρ (:func:`split_rounds`): ``initial`` for the public-chosen
    workloads (split evenly over them: :meth:`initial_each`), then per round ``select`` (= ε₀²/8,
    the exponential mechanism at ``epsilon0``) and ``measure``."""

    initial: Fraction
    select: Fraction
    measure: Fraction
    epsilon0: float
    rounds: int

    def total(self) -> Fraction:
        """What the whole run charges (sequential composition): never above the node's ρ."""
        return self.initial + self.rounds * (self.select + self.measure)

    def initial_each(self, n: int) -> Fraction:
        """Each of ``n`` public-chosen workloads' share of ``initial`` (none: 0)."""
        return self.initial / n if n > 0 else Fraction(0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (fractions as exact strings)."""
        return {"initial": str(self.initial), "select": str(self.select), "measure": str(self.measure),
                "epsilon0": self.epsilon0, "rounds": self.rounds}


def split_rounds(rho: Fraction, rounds: int, rounds_share: Fraction, select_share: Fraction) -> RoundBudget:
    """Split a node's ``rho``: ``rounds_share`` of it evenly over ``rounds`` rounds, the rest
    ``initial``. A round's ρ is planned ``select_share`` to the selection, whose ε₀ is the largest
    float with ε₀²/8 within that plan (so the selection costs at most its plan), and the rest of
    the round to the measurement. ``rounds`` = 0 needs ``rounds_share`` = 0 (all initial). Never
    spends more than ``rho``: raised, not asserted."""
    rho, rounds_share, select_share = Fraction(rho), Fraction(rounds_share), Fraction(select_share)
    if rounds < 0 or not 0 <= rounds_share <= 1 or (rounds == 0) != (rounds_share == 0) or not 0 < select_share < 1:
        raise DPReleaseError(f"adaptive rounds: cannot split rho over {rounds} rounds with share {rounds_share} "
                             f"and selection share {select_share}")
    if rounds == 0:
        return RoundBudget(rho, Fraction(0), Fraction(0), 0.0, 0)
    rounds_rho = rounds_share * rho
    per_round = rounds_rho / rounds
    eps0 = epsilon_for_exponential_rho(select_share * per_round)
    out = RoundBudget(rho - rounds_rho, exponential_mechanism_rho(eps0), per_round - select_share * per_round, eps0, int(rounds))
    if out.total() > rho or out.measure <= 0 or eps0 <= 0:
        raise BudgetExceededError(f"adaptive rounds: the split {out} does not fit the node's ρ = {rho}")
    return out


def initial_rho(rho: Fraction, plan: AdaptiveRounds | None) -> Fraction:
    """The part of a node's ``rho`` its given workloads get before any adaptive round (all of it
    without rounds, or at ρ = 0)."""
    rho = Fraction(rho)
    return rho if plan is None or not plan.active or rho <= 0 else round_budget(rho, plan).initial


def round_budget(rho: Fraction, plan: AdaptiveRounds) -> RoundBudget:
    """Split the node's ``rho`` by ``plan`` (:func:`split_rounds`)."""
    return split_rounds(rho, plan.rounds, plan.share, plan.select_share)


def measured_form(chosen: Workload, like: Sequence[Workload]) -> Workload:
    """The workload to measure for the candidate ``chosen``: normalised, counting the persons the
    node's normalised workloads count, when the node's workloads ``like`` are normalised (and
    ``chosen`` is no partition); ``chosen`` itself otherwise."""
    if chosen.is_partition() or not any(w.normalised for w in like):
        return chosen
    first = next((w.first for w in like if w.level == "person" and w.normalised), 0) if chosen.level == "person" else 0
    return Workload(chosen.level, chosen.group_attrs, chosen.person_attrs, first, True)


def selection_first(measured: Sequence[Workload], select_first: int) -> int:
    """The ``first`` of the candidates scored at a node that measured ``measured``: that of its
    person-level workloads; ``select_first`` (the plan's, :attr:`AdaptiveRounds.select_first`) where
    those are normalised and count every person (module docstring)."""
    person = next((w for w in measured if w.level == "person"), None)
    if person is None:
        return select_first if any(w.normalised for w in measured) else 0
    return person.first or (select_first if person.normalised else 0)


def candidate_workloads(domain: Domain, *, first: int = 0, max_cells: int = 1024, max_attributes: int = 3,
                        exclude: Sequence[Workload] = ()) -> list[Workload]:
    """Every workload on 2..``max_attributes`` attributes within ``max_cells`` cells: person level
    (counting the first ``first`` persons; 0: all) when it names a person attribute, a group-level
    partition otherwise; minus those of ``exclude``'s level and attribute sets (whatever persons
    they count and however normalised). Deterministic order (the domain's)."""
    names = [(a.name, "group", a.size) for a in domain.group] + [(a.name, "person", a.size) for a in domain.person]
    out: list[Workload] = []
    skip = {(w.level, w.group_attrs, w.person_attrs) for w in exclude}
    for k in range(2, max_attributes + 1):
        for combo in itertools.combinations(names, k):
            if math.prod(c[2] for c in combo) > max_cells:
                continue
            g = tuple(c[0] for c in combo if c[1] == "group")
            p = tuple(c[0] for c in combo if c[1] == "person")
            w = Workload("person", g, p, first) if p else Workload("group", g, ())
            if (w.level, w.group_attrs, w.person_attrs) not in skip:
                out.append(w)
    return out


def expected_measurement_l1(candidates: Sequence[Workload], domain: Domain, unit: PrivacyUnit, rho: Fraction) -> np.ndarray:
    """AIM's penalty: √(2/π)·σ_w·cells_w, the expected L1 error of measuring each candidate with
    the Gaussian mechanism at ``rho`` (σ_w = L2(w)/√(2ρ))."""
    sigma = np.array([w.sensitivity(domain, unit)[1] for w in candidates]) / math.sqrt(2.0 * float(rho))
    return math.sqrt(2.0 / math.pi) * sigma * np.array([w.n_cells(domain) for w in candidates], dtype=np.float64)
