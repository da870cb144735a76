"""The weakest prior a state's update may use, simulated on the public data.

Empirical Bayes (:mod:`engine.synthesis._prior_strength`) reads the prior strength off the node's measured
workloads alone. At large budgets it fits those closely by concentrating the posterior on few
public households, and the marginals nobody measured pay for it: it can choose a weaker prior
than the one that scores best on the marginals the state did not measure
(``benchmarks/results/HISTORY.md``). The measured answers cannot show this; the public data can.

Each public state in turn plays the private one, the other public states pooled are its prior (as
in :mod:`engine.synthesis._budget_split`). Its workloads are answered exactly and given Gaussian noise of the
state's measured ρ, split evenly as :func:`engine.synthesis._node.measure_node` splits it
(σ_w = L2(w)/√(2ρ_w)); the MAP update (:func:`engine.synthesis._map_update.map_fit`) is fitted at every
candidate strength, and each fit is scored on held-out marginals: the person-level 3-way marginals
of the domain's attributes (:func:`engine.queries._metrics.k_way_workloads`, a fixed sample of
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
from typing import Any

import numpy as np

from engine.data import HierarchicalData
from engine.queries import Measurement, PrivacyUnit, Support, Workload, answer, counted_person_cells, k_way_workloads
from engine.synthesis._map_update import map_fit

__all__ = ["FIT_TOL", "HELD_OUT", "StrengthFloor", "play_state", "played_states", "simulate_strength_floor", "strength_floor"]

HELD_OUT = 120  # held-out 3-way marginals per played state (a fixed random sample when the domain has more)
MAX_PLAYED = 12  # played states (a fixed random sample of the public states when there are more): the cost is one set of fits per played state
SEED = 20261125  # the simulated noise's seed: the floor is a function of the public data and ρ


@dataclass(frozen=True)
class StrengthFloor:
    """The floor (``floor``; 0 when no public state could be played) and, per played state (its
    state code), the held-out error of every candidate strength (``candidates`` order)."""

    floor: float
    candidates: tuple[float, ...]
    rho: float
    table: tuple[tuple[int, tuple[float, ...]], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "held-out error simulated on the public data (engine.synthesis._strength_floor): each public state as the private one, "
                      "the others as its prior; the floor is the smallest candidate any of them is best with",
            "floor": self.floor,
            "candidates": list(self.candidates),
            "rho_state_measured": self.rho,
            "played": [{"state": s, "held_out_l1": [round(v, 5) for v in errs], "best": self.candidates[int(np.argmin(errs))]}
                       for s, errs in self.table],
        }


class _HeldOut:
    """The held-out marginals of one played state: its own (normalised) and, for the households of
    ``data`` (the whole support; the played state's own carry weight 0 in every fit), every counted
    person's (household, cell), so that a fit is scored by one weighted bincount per marginal."""

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


FIT_TOL = 1e-7  # the fits only rank the candidates, as the adaptive rounds' (engine.synthesis._node.ROUND_FIT_TOL)


def played_states(public: HierarchicalData, max_played: int = MAX_PLAYED, seed: int = SEED) -> np.ndarray:
    """The public states that play the private one: all of them, or a fixed random sample of
    ``max_played`` when there are more; none when there is a single public state."""
    states = np.unique(public.geo[:, 0])
    if len(states) < 2:
        return states[:0]
    return states if len(states) <= max_played else np.sort(np.random.default_rng(seed).choice(states, max_played, replace=False))


def _checked(candidates: Sequence[float], rho: float, workloads: Sequence[Workload]) -> tuple[float, ...]:
    cands = tuple(sorted(float(c) for c in candidates))
    if not cands or any(c <= 0 for c in cands):
        raise ValueError("candidate prior strengths must be positive")
    if rho <= 0 or not workloads:
        raise ValueError("the strength simulation needs workloads measured with rho > 0")
    return cands


def play_state(support: Support, state: int, workloads: Sequence[Workload], unit: PrivacyUnit, rho: float,
               candidates: Sequence[float], *, held_out: int = HELD_OUT, seed: int = SEED, tol: float = FIT_TOL) -> tuple[float, ...]:
    """One public ``state`` played as the private one (module docstring): the held-out error of
    the MAP fit at every candidate strength (ascending order). ``support``: every public household
    (uniform weights); the prior is its households outside ``state`` — the played state's get
    weight 0, so one support (and its incidence cache, shared with the state fits) serves every
    played state. The simulated noise is seeded by ``seed`` and the state, so each played state is
    reproducible on its own (the flow plays them in parallel). Each fit starts from the previous
    candidate's dual (the optimum is unique: the start changes only the iterations); ``tol``: the
    fits' solver tolerance."""
    cands = _checked(candidates, rho, workloads)
    public = support.data
    d = public.domain
    evaluation = k_way_workloads(d, 3, "person", limit=held_out, rng=np.random.default_rng(seed))
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(state),)))
    rho_w = Fraction(rho) / len(workloads)
    mine = public.geo[:, 0] == state
    if not mine.any() or mine.all():
        raise ValueError(f"state {state} is not one of several public states")
    truth = public.select(mine)
    prior = np.where(mine, 0.0, support.weights)
    measured = []
    for w in workloads:
        sd = w.sensitivity(d, unit)[1] / np.sqrt(2.0 * float(rho_w))
        measured.append(Measurement(w, answer(truth, w) + rng.normal(0.0, sd, w.n_cells(d)), float(sd), rho_w))
    G = float(truth.n_households)
    score = _HeldOut(truth, public, evaluation)
    errs, dual = [], None
    for c in cands:
        fit = map_fit(support, prior, measured, G, prior_strength=c * G, tol=tol, dual0=dual)
        errs.append(score.l1(fit.weights))
        dual = fit.dual
    return tuple(errs)


def strength_floor(candidates: Sequence[float], rho: float, table: Sequence[tuple[int, Sequence[float]]]) -> StrengthFloor:
    """The floor from the played states' errors (:func:`play_state`, candidates ascending): the
    smallest candidate any played state is best with; 0 when none played."""
    cands = tuple(sorted(float(c) for c in candidates))
    rows = tuple((int(s), tuple(float(v) for v in errs)) for s, errs in table)
    if not rows:
        return StrengthFloor(0.0, cands, float(rho), ())
    return StrengthFloor(min(cands[int(np.argmin(errs))] for _, errs in rows), cands, float(rho), rows)


def simulate_strength_floor(support: Support, workloads: Sequence[Workload], unit: PrivacyUnit, rho: float,
                            candidates: Sequence[float], *, held_out: int = HELD_OUT, max_played: int = MAX_PLAYED,
                            seed: int = SEED) -> StrengthFloor:
    """The floor of the state's prior strength (module docstring) on the public households of
    ``support`` (uniform weights) for the state's ``workloads`` measured with ``rho`` per state (the part of its ρ they get) under ``unit``; ``candidates``:
    the relative strengths empirical Bayes chooses among; at most ``max_played`` public states
    play the private one (each against all the others): :func:`play_state` for each of
    :func:`played_states`, combined by :func:`strength_floor`."""
    _checked(candidates, rho, workloads)
    table = [(int(s), play_state(support, int(s), workloads, unit, rho, candidates, held_out=held_out, seed=seed))
             for s in played_states(support.data, max_played, seed)]
    return strength_floor(candidates, rho, table)
