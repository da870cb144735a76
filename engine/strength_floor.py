"""The weakest prior a state's update may use, simulated on the public data (issue 15 items 4 and 6).

Empirical Bayes (:mod:`engine.prior_strength`) reads the prior strength off the node's measured
workloads alone. At large budgets it fits those closely by concentrating the posterior on few
public households, and the marginals nobody measured pay for it: on the peer benchmark's set-up
(New Mexico private, ε = 2) it chose 0.03 while 0.1 scored 5 % better on the 3-way marginals the
state did not measure (``benchmarks/results/HISTORY.md``, sessions 3 and 4). The measured answers
cannot show this; the public data can.

Each public state in turn plays the private one, the other public states pooled are its prior (as
in :mod:`engine.budget_split`). Its workloads are answered exactly and given Gaussian noise of the
state's measured ρ, split evenly as :func:`engine.synthesis.measure_node` splits it
(σ_w = L2(w)/√(2ρ_w)); the MAP update (:func:`engine.map_update.map_fit`) is fitted at every
candidate strength, and each fit is scored on held-out marginals: the person-level 3-way marginals
of the domain's attributes (:func:`engine.metrics.k_way_workloads`, a fixed sample of
:data:`HELD_OUT` when there are more), mean L1 between normalised vectors. Each played state's best
candidate is read off; the **floor** is the smallest of them — the weakest prior that any public
state, played as the private one at this budget, is best with. Empirical Bayes still chooses above
it, so a state unlike the public data keeps the weak prior its measurements ask for wherever any
public state would want it too.

Everything here is a function of the public data, the workloads, ρ and a fixed seed: no privacy
cost, no confidential input. The noise is simulated, so the floor is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from engine.hierarchical_data import HierarchicalData
from engine.map_update import map_fit
from engine.measurement import Measurement
from engine.metrics import k_way_workloads
from engine.queries import PrivacyUnit, Workload, answer, counted_person_cells
from engine.support import Support

__all__ = ["HELD_OUT", "StrengthFloor", "simulate_strength_floor"]

HELD_OUT = 120  # held-out 3-way marginals per played state (a fixed random sample when the domain has more)
MAX_PLAYED = 12  # played states (a fixed random sample of the public states when there are more): the cost is one support per played state
SEED = 20261125  # the simulated noise's seed: the floor is a function of the public data and ρ


@dataclass(frozen=True)
class StrengthFloor:
    """The floor (``floor``; 0 when no public state could be played) and, per played state (its
    state code), the held-out error of every candidate strength (``candidates`` order)."""

    floor: float
    candidates: tuple[float, ...]
    rho: float
    table: tuple[tuple[int, tuple[float, ...]], ...]

    def to_dict(self) -> dict:
        return {
            "method": "held-out error simulated on the public data (engine.strength_floor): each public state as the private one, "
                      "the others as its prior; the floor is the smallest candidate any of them is best with",
            "floor": self.floor,
            "candidates": list(self.candidates),
            "rho_state_measured": self.rho,
            "played": [{"state": s, "held_out_l1": [round(v, 5) for v in errs], "best": self.candidates[int(np.argmin(errs))]}
                       for s, errs in self.table],
        }


class _HeldOut:
    """The held-out marginals of one played state: its own (normalised) and, for the prior's
    households, every counted person's (household, cell), so that a fit is scored by one weighted
    bincount per marginal."""

    def __init__(self, truth: HierarchicalData, data: HierarchicalData, workloads: Sequence[Workload]) -> None:
        self.n_cells = [w.n_cells(data.domain) for w in workloads]
        self.truth = []
        for w in workloads:
            a = answer(truth, w)
            self.truth.append(a / max(a.sum(), 1e-300))
        self.cells = [counted_person_cells(data, w) for w in workloads]

    def l1(self, weights: np.ndarray) -> float:
        """Mean L1 between the played state's normalised held-out marginals and the weighted prior's."""
        out = []
        for a, (hh, cells), n in zip(self.truth, self.cells, self.n_cells, strict=True):
            b = np.bincount(cells, weights=weights[hh], minlength=n)
            out.append(float(np.abs(a - b / max(b.sum(), 1e-300)).sum()))
        return float(np.mean(out))


def simulate_strength_floor(public: HierarchicalData, workloads: Sequence[Workload], unit: PrivacyUnit, rho: float,
                            candidates: Sequence[float], *, held_out: int = HELD_OUT, max_played: int = MAX_PLAYED,
                            seed: int = SEED) -> StrengthFloor:
    """The floor of the state's prior strength (module docstring) for the state's ``workloads``
    measured with ``rho`` per state (the part of its ρ they get) under ``unit``; ``candidates``:
    the relative strengths empirical Bayes chooses among; at most ``max_played`` public states
    play the private one (each against all the others)."""
    cands = tuple(sorted(float(c) for c in candidates))
    if not cands or any(c <= 0 for c in cands):
        raise ValueError("candidate prior strengths must be positive")
    if rho <= 0 or not workloads:
        raise ValueError("the strength simulation needs workloads measured with rho > 0")
    d = public.domain
    states = np.unique(public.geo[:, 0])
    if len(states) < 2:
        return StrengthFloor(0.0, cands, float(rho), ())
    evaluation = k_way_workloads(d, 3, "person", limit=held_out, rng=np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    played = states if len(states) <= max_played else np.sort(rng.choice(states, max_played, replace=False))
    rho_w = Fraction(rho) / len(workloads)
    sigma = [w.sensitivity(d, unit)[1] / np.sqrt(2.0 * float(rho_w)) for w in workloads]
    table = []
    for s in played:
        mine = public.geo[:, 0] == s
        truth, prior_data = public.select(mine), public.select(~mine)
        support = Support.from_data(prior_data)
        measured = [Measurement(w, answer(truth, w) + rng.normal(0.0, sd, w.n_cells(d)), float(sd), rho_w)
                    for w, sd in zip(workloads, sigma, strict=True)]
        G = float(truth.n_households)
        score = _HeldOut(truth, prior_data, evaluation)
        errs = tuple(score.l1(map_fit(support, support.weights, measured, G, prior_strength=c * G).weights) for c in cands)
        table.append((int(s), errs))
    floor = min(cands[int(np.argmin(errs))] for _, errs in table)
    return StrengthFloor(floor, cands, float(rho), tuple(table))
