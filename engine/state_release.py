"""One state's release without Prefect, run directories or files: a notebook's entry point.

:func:`synthesize_state` composes the engine's pieces the way the pipeline does, for one state:

1. every PUMA's household count, measured through the session (discrete Gaussian, sensitivity
   1 under both privacy units), the state's count their sum;
2. workloads chosen from the **public** data by mutual information (no privacy cost);
3. the state posterior: the public households reweighted by the state's measured workloads and
   the sums of its PUMAs' (:func:`engine.synthesis.synthesize_node`, household total estimated
   jointly with it; :func:`engine.level_consistency.children_sum`);
4. per PUMA, the state posterior updated with the PUMA's workloads, and its households drawn from
   it, balanced on the domain's low-order marginals, the state's PUMAs with error diffusion (:mod:`engine.balanced_sampling`;
   ``sampling="systematic"``: systematically along the households sorted by their attributes).

Every read of the confidential data is a charged measurement of the :class:`PrivateSession`; the
budget split is :func:`state_plan`'s (three stages, ρ shares of :data:`STATE_SHARES`), charged by
the session's ledger — in memory (``PrivacyLedger(None, plan)``) or in a file. The flow's per-node
tasks run steps 3 and 4 with the same functions; this module has no count-of-counts stage (the
flow's household counts also borrow from the nation and size histograms).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from engine.adaptive import AdaptiveRounds, SelectFn, initial_rho
from engine.balanced_sampling import BalanceTargets
from engine.geography import Node, node_key
from engine.hierarchical_data import HierarchicalData
from engine.household_sampling import household_order, sample_households, sample_sibling_households
from engine.level_consistency import children_sum
from engine.measurement import Measurement
from engine.prior_mixture import Flip, node_prior, widen
from engine.prior_strength import DEFAULT_CANDIDATES
from engine.privacy.budget import BudgetPlan
from engine.privacy.session import PrivateSession
from engine.puma_attributes import keep_puma_attributes
from engine.queries import Workload
from engine.strength_floor import simulate_strength_floor
from engine.support import Support
from engine.synthesis import MeasureFn, UpdateRule, initial_measurements, synthesize_node
from engine.workload_selection import PUMA_ATTRIBUTES, PUMA_ATTRIBUTES_MAX, select_workloads

__all__ = ["STATE_SHARES", "StateRelease", "node_rng", "session_measure", "session_puma_sums", "session_select", "state_plan",
           "synthesize_state"]

STATE_SHARES: Mapping[str, Fraction] = {
    "group_counts": Fraction(1, 10), "state_synthesis": Fraction(9, 20), "puma_synthesis": Fraction(9, 20),
}
_LEVEL = {"group_counts": "puma", "state_synthesis": "state", "puma_synthesis": "puma"}


def state_plan(*, rho: float | Fraction | None = None, epsilon: float | None = None, delta: float = 1e-10,
               shares: Mapping[str, Fraction | float] = STATE_SHARES) -> BudgetPlan:
    """The budget of :func:`synthesize_state`: ``rho`` (ρ-zCDP), or (``epsilon``, ``delta``)
    converted by the CKS bound; ``shares`` over its three stages (each at one level)."""
    if (rho is None) == (epsilon is None):
        raise ValueError("give rho or epsilon (with delta), not both")
    if set(shares) != set(STATE_SHARES):
        raise ValueError(f"shares must be given for exactly {sorted(STATE_SHARES)}")
    levels = {st: {_LEVEL[st]: 1} for st in shares}
    if rho is not None:
        return BudgetPlan(rho, shares, levels, delta=delta)
    if epsilon is None:
        raise ValueError("give rho or epsilon (with delta)")
    return BudgetPlan.from_eps_delta(epsilon, delta, shares, levels)


def node_rng(seed: int, node: Node) -> np.random.Generator:
    """Post-processing randomness of one node, reproducible from the sampling seed."""
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(x) for x in node)))


def session_select(session: PrivateSession, stage: str, level: str, node: Node) -> SelectFn:
    """The select callable of the adaptive rounds (:mod:`engine.adaptive`) for one node: the
    session's exponential mechanism over the private answers, charged and persisted before use."""

    def select(candidates: Sequence[Workload], model_counts: np.ndarray, penalty: np.ndarray, epsilon: float, tag: str) -> int:
        return session.select_worst_fit(stage, level, node, tag, candidates, model_counts, penalty, epsilon)

    return select


def session_measure(session: PrivateSession, stage: str, level: str, node: Node) -> MeasureFn:
    """The measure callable of :func:`engine.synthesis.synthesize_node` for one node: every noisy
    answer is charged and persisted by the session before it is used (read back on a rerun)."""

    def measure(w: Workload, rho: Fraction) -> tuple[np.ndarray, float]:
        m = session.measure_workload(stage, level, node, w, rho)
        return m.noisy_answer, m.scale

    return measure


def session_puma_sums(session: PrivateSession, pumas: Sequence[Node], workloads: Sequence[Workload], rho: Fraction,
                      adaptive: AdaptiveRounds | None = None) -> list[Measurement]:
    """A state's measurements implied by its PUMAs' (``synthesis.pumas_inform_state``): every PUMA
    workload's noisy answers summed over the state's ``pumas`` (all of them), their variances
    summed (:func:`engine.level_consistency.children_sum`). Each PUMA is measured through the
    session with its fit's own arguments (``workloads`` at the PUMA level's ``rho`` less its
    ``adaptive`` rounds' share: :func:`engine.synthesis.initial_measurements`), so each answer is
    charged once, at the PUMA level, and the PUMA's fit reads the stored answer back."""
    return children_sum([initial_measurements(workloads, rho, session_measure(session, "puma_synthesis", "puma", tuple(n)), adaptive)
                         for n in pumas])


@dataclass
class StateRelease:
    """``data``: the synthetic households and persons of every PUMA (geography filled in);
    ``households``: {PUMA: released household count}; ``workloads``: what was measured at each
    level; ``diagnostics``: {node key: the update's diagnostics}."""

    data: HierarchicalData
    households: dict[Node, int]
    workloads: dict[str, list[str]]
    diagnostics: dict[str, dict[str, Any]] = field(default_factory=dict)


def synthesize_state(session: PrivateSession, state: int, public: HierarchicalData, *, seed: int = 0,
                     person_first: int = 0, normalise: bool = True, puma_attributes: int = PUMA_ATTRIBUTES, update_rule: UpdateRule = "map", prior_strength: float = 0.1,
                     adaptive: AdaptiveRounds | None = None, sampling: Literal["balanced", "systematic"] = "balanced",
                     prior_strength_candidates: Sequence[float] = DEFAULT_CANDIDATES, strength_floor: bool = True,
                     pumas_inform_state: bool = True, puma_attributes_rule: Literal["signal_to_noise", "fixed"] = "signal_to_noise",
                     puma_attributes_max: int = PUMA_ATTRIBUTES_MAX, complete_pairs: bool = True,
                     prior_flips: Sequence[Flip] = ()) -> StateRelease:
    """One state's synthetic microdata (module docstring). ``public``: the public prior's
    households (other states; their geography is ignored); ``seed``: the sampling seed (the
    release is a function of it, the public data and the stored measurements);
    ``person_first``, ``normalise``, ``puma_attributes``, ``update_rule``, ``prior_strength``: as the release config's ``synthesis``;
    ``adaptive``: adaptive rounds at the state level (``synthesis.adaptive``); ``sampling``: how
    each PUMA's households are drawn (``synthesis.sampling``); ``prior_strength_candidates``: the
    state posterior's prior strength chosen among them by empirical Bayes (``()``: ``prior_strength``),
    held at or above the public simulation's floor (:mod:`engine.strength_floor`) unless
    ``strength_floor`` is false; ``pumas_inform_state``: the state's fit also takes in the sums of
    its PUMAs' measurements (:func:`engine.level_consistency.children_sum`), made before it;
    ``complete_pairs``: as the config's (the state also measures the persons' two-way marginals
    the selection leaves out); ``puma_attributes_rule``, ``puma_attributes_max``: as the config's (``signal_to_noise``: at least
    ``puma_attributes`` PUMA attributes, more while the PUMA level's ρ carries them at the median of
    the PUMAs' DP household counts, :mod:`engine.puma_attributes`); ``prior_flips``: as the config's
    (the state prior a mixture with the public households flipped in these binary person attributes,
    weighed by the state's measurements, :mod:`engine.prior_mixture`)."""
    plan = session.ledger.plan
    pumas = [n for n in session.nodes("puma") if n[0] == int(state)]
    if not pumas:
        raise ValueError(f"state {state} has no PUMA in the declared geography")
    count = {n: session.measure_household_count("group_counts", "puma", n, plan.allocation("group_counts", "puma")) for n in pumas}
    sd = {n: float(m.scale) for n, m in count.items()}
    G = {n: max(float(m.noisy_answer[0]), 0.0) for n, m in count.items()}
    by_rule = puma_attributes_rule == "signal_to_noise"
    sel = select_workloads(public, person_first=person_first, normalise=normalise,
                           puma_max_attributes=puma_attributes_max if by_rule else puma_attributes, complete_pairs=complete_pairs)
    support = Support.from_data(public)
    node = (int(state),)
    eb = prior_strength_candidates if update_rule == "map" else ()
    rho_state = plan.allocation("state_synthesis", "state")
    floor = 0.0
    if strength_floor and len(eb) > 1 and rho_state > 0:
        floor = simulate_strength_floor(support, sel.state, session.unit, float(initial_rho(rho_state, adaptive)), eb).floor
    rho_puma = plan.allocation("puma_synthesis", "puma")
    if by_rule:
        sel, _ = keep_puma_attributes(public, sel, session.unit, float(rho_puma), float(np.median(list(G.values()))),
                                      minimum=puma_attributes, maximum=puma_attributes_max)
    sums = session_puma_sums(session, pumas, sel.puma, rho_puma) if pumas_inform_state else []
    measure = session_measure(session, "state_synthesis", "state", node)
    if prior_flips and update_rule == "map":  # charged once: the fit below reads the stored answers back
        support, prior, mixture = node_prior(support, widen(public, prior_flips, public_cache=support.cache), [*sums, *initial_measurements(sel.state, rho_state, measure, adaptive)],
                                             max(sum(G.values()), 1.0))
    else:
        prior, mixture = support.weights, None
    state_res = synthesize_node(
        support, prior, sel.state, rho_state,
        measure, max(sum(G.values()), 1.0),
        rule=update_rule, prior_strength=prior_strength, total_sd=float(np.sqrt(sum(s * s for s in sd.values()))), extra=sums,
        adaptive=adaptive, select=session_select(session, "state_synthesis", "state", node), unit=session.unit,
        strengths=eb, strength_floor=floor, completion=sel.completed,
    )
    if mixture is not None:
        state_res.diagnostics["prior_mixture"] = mixture.to_dict()
    diagnostics = {node_key(node): state_res.diagnostics}
    order = household_order(support.data)
    balance = BalanceTargets.for_data(support.data) if sampling == "balanced" else None
    fits, released = {}, {}
    for n in pumas:
        res = synthesize_node(
            support, state_res.weights, sel.puma, rho_puma,
            session_measure(session, "puma_synthesis", "puma", n), max(G[n], 1.0),
            rule=update_rule, prior_strength=prior_strength, total_sd=sd[n],
        )
        diagnostics[node_key(n)] = res.diagnostics
        released[n] = int(round(res.total))
        fits[n] = res.weights
    nodes = sorted(pumas)
    if balance is not None:  # the PUMAs drawn together: each carries the earlier ones' balance residual
        parts = sample_sibling_households(support, [fits[n] for n in nodes], [released[n] for n in nodes], [node_rng(seed, n) for n in nodes],
                                          nodes, order=order, balance=balance)
    else:
        parts = [sample_households(support, fits[n], released[n], node_rng(seed, n), geo=n, order=order, method=sampling) for n in nodes]
    return StateRelease(HierarchicalData.concat(parts), released, {"state": [w.id for w in sel.state], "puma": [w.id for w in sel.puma]},
                        diagnostics)
