"""One state's release: the only place the engine's pieces are composed, for the flow and for a notebook.

The flow's tasks (``tasks/synthesize.py``) run the steps below on Dask workers and persist each
result; :func:`synthesize_state` runs them in one call. Both take the same
:class:`~engine.synthesis._settings.SynthesisSettings`, so a notebook reproduces the release a
configuration ships (the flow-vs-engine identity test holds them to the same bytes).

1. the workloads, chosen from the **public** data by mutual information (:func:`choose_workloads`,
   no privacy cost), and how many one-way marginals the PUMA level's ρ carries
   (:func:`choose_puma_workloads`, public data and the DP PUMA household counts);
2. the state posterior (:func:`fit_state`): the public households, widened by their flipped copies
   where the state's measurements ask for them (:mod:`engine.synthesis._prior_mixture`), reweighted by the
   state's measured workloads, its adaptive rounds, its count-of-counts size histogram and the sums
   of its PUMAs' measurements (:func:`engine.synthesis._level_consistency.children_sum`), the prior strength
   chosen by empirical Bayes above the public simulation's floor (:mod:`engine.synthesis._strength_floor`);
3. the PUMAs (:func:`release_pumas`): each PUMA's posterior updated from the state's with its own
   measurements, the fitted totals held to the state's count, the posteriors raked together to the
   state posterior on its measured workloads, and the households drawn balanced on the support's
   low-order marginals, the state's PUMAs with error diffusion (:mod:`engine.synthesis._balanced_sampling`).

Every read of the confidential data is a charged measurement of the :class:`PrivateSession`; a
rerun reads the stored answers back, so everything after the measurements is a deterministic
function of them, the public data and the sampling seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from engine.data import HierarchicalData, Node, node_key
from engine.privacy import BudgetPlan, PrivateSession
from engine.queries import Measurement, PrivacyUnit, Support, Workload
from engine.synthesis._adaptive import SelectFn, initial_rho
from engine.synthesis._balanced_sampling import BalanceTargets
from engine.synthesis._household_sampling import household_order, sample_sibling_households
from engine.synthesis._level_consistency import children_sum, rake_to_parent, totals_to_parent
from engine.synthesis._node import MeasureFn, NodeResult, initial_measurements, size_measurement, synthesize_node
from engine.synthesis._prior_mixture import Flip, MixtureChoice, WidenedSupport, node_prior, resolve_flips, used_flips, widen
from engine.synthesis._puma_attributes import PumaAttributeChoice, keep_puma_attributes
from engine.synthesis._settings import SynthesisSettings
from engine.synthesis._strength_floor import simulate_strength_floor
from engine.synthesis._uncertainty import Recording, recording_measure
from engine.synthesis._workload_selection import WorkloadSelection, select_workloads

__all__ = ["STATE_SHARES", "NodeCount", "PumaFit", "StateFit", "StateRelease", "choose_puma_workloads", "choose_workloads", "fit_state",
           "floor_rho", "measured_counts", "node_rng", "release_pumas", "session_measure", "session_puma_sums", "session_select", "state_plan",
           "synthesize_state"]

STATE_SHARES: Mapping[str, Fraction] = {
    "group_counts": Fraction(1, 10), "state_synthesis": Fraction(9, 20), "puma_synthesis": Fraction(9, 20),
}
_LEVEL = {"group_counts": "puma", "state_synthesis": "state", "puma_synthesis": "puma"}


def state_plan(*, rho: float | Fraction | None = None, epsilon: float | None = None, delta: float = 1e-10,
               shares: Mapping[str, Fraction | float] = STATE_SHARES) -> BudgetPlan:
    """A budget for :func:`synthesize_state` without a count-of-counts stage: ``rho`` (ρ-zCDP), or
    (``epsilon``, ``delta``) converted by the CKS bound; ``shares`` over its three stages (each at
    one level: the PUMA household counts, the state's and the PUMAs' synthesis)."""
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
    """The select callable of the adaptive rounds (:mod:`engine.synthesis._adaptive`) for one node: the
    session's exponential mechanism over the private answers, charged and persisted before use."""

    def select(candidates: Sequence[Workload], model_counts: np.ndarray, penalty: np.ndarray, epsilon: float, tag: str) -> int:
        return session.select_worst_fit(stage, level, node, tag, candidates, model_counts, penalty, epsilon)

    return select


def session_measure(session: PrivateSession, stage: str, level: str, node: Node) -> MeasureFn:
    """The measure callable of :func:`engine.synthesis._node.synthesize_node` for one node: every noisy
    answer is charged and persisted by the session before it is used (read back on a rerun)."""

    def measure(w: Workload, rho: Fraction) -> tuple[np.ndarray, float]:
        m = session.measure_workload(stage, level, node, w, rho)
        return m.noisy_answer, m.scale

    return measure


def session_puma_sums(session: PrivateSession, pumas: Sequence[Node], workloads: Sequence[Workload], rho: Fraction) -> list[Measurement]:
    """A state's measurements implied by its PUMAs': every PUMA workload's noisy answers summed over
    the state's ``pumas`` (all of them), their variances summed
    (:func:`engine.synthesis._level_consistency.children_sum`). Each PUMA is measured through the session with
    its own fit's arguments (``workloads`` at the PUMA level's ``rho``), so each answer is charged
    once, at the PUMA level, and the PUMA's fit reads the stored answer back."""
    return children_sum([initial_measurements(workloads, rho, session_measure(session, "puma_synthesis", "puma", tuple(n)), None)
                         for n in pumas])


SizeEstimate = tuple[Sequence[float], float]  # (noisy households of size 1..K, noise sd of one entry)


@dataclass(frozen=True)
class NodeCount:
    """A node's household count as synthesis takes it: ``households`` (DP and consistent across
    levels; exact only under the declared invariant), the count's noise sd ``sd`` (> 0: the node's
    total is estimated from its posterior; 0: taken as given) and, when the count-of-counts
    stage ran, its size histogram ``sizes`` (an extra noisy measurement of the size marginal)."""

    households: int
    sd: float = 0.0
    sizes: SizeEstimate | None = None

    def size_extra(self, support: Support) -> list[Measurement]:
        return [] if self.sizes is None else [size_measurement(support.data.domain, self.sizes[0], self.sizes[1])]


def choose_workloads(public: HierarchicalData, settings: SynthesisSettings, *, sizes_measured: bool = False) -> WorkloadSelection:
    """Every level's workloads from mutual information on the public data (no privacy cost):
    normalised, every person counted, the persons' two-way marginals completed at the state, the
    PUMA attributes ranked up to ``settings.puma_attributes_max`` (:func:`choose_puma_workloads`
    keeps a prefix). ``sizes_measured``: the count-of-counts stage measures every PUMA's size
    histogram, so the size attribute is not measured again as a PUMA one-way marginal."""
    return select_workloads(public, normalise=True, complete_pairs=True, puma_max_attributes=settings.puma_attributes_max,
                            puma_exclude=(public.domain.size_attribute,) if sizes_measured else ())


def choose_puma_workloads(public: HierarchicalData, selection: WorkloadSelection, unit: PrivacyUnit, rho_puma: Fraction,
                          puma_households: Sequence[float], settings: SynthesisSettings) -> tuple[WorkloadSelection, PumaAttributeChoice]:
    """The selection with as many ranked PUMA one-way marginals as the PUMA level's ρ carries at the
    median of the PUMAs' DP household counts (:mod:`engine.synthesis._puma_attributes`; post-processing)."""
    rho = initial_rho(rho_puma, settings.adaptive_at("puma"))
    median = float(np.median(puma_households)) if len(puma_households) else 0.0
    return keep_puma_attributes(public, selection, unit, float(rho), median, minimum=settings.puma_attributes, maximum=settings.puma_attributes_max)


def floor_rho(rho_state: Fraction, settings: SynthesisSettings) -> float:
    """The ρ per state at which the public simulation plays the state's workloads: the part of the
    state's ρ its public-chosen workloads get (:mod:`engine.synthesis._strength_floor`)."""
    return float(initial_rho(rho_state, settings.adaptive_at("state")))


@dataclass
class StateFit:
    """A state's posterior: ``result`` (weights, fitted total, diagnostics) on ``support`` (the
    public support, or the widened one where the prior mixture took the flipped copies in) from the
    ``prior`` it was updated from; ``record``: the state's own measurements (σ and noisy answers, for
    its error estimates); ``sums``: the PUMA sums it took in; ``mixture``: the prior mixture's choice."""

    support: Support
    prior: np.ndarray
    result: NodeResult
    record: Recording
    sums: list[Measurement]
    mixture: MixtureChoice | None = None
    flips: tuple[Flip, ...] = ()

    @property
    def widened(self) -> bool:
        return bool(self.flips)

    def targets(self) -> list[tuple[Workload, float]]:
        """The state's measured workloads (the given ones and its adaptive rounds') with their σ:
        what its PUMAs' posteriors are raked to."""
        return [(Workload.from_id(w), s) for w, s in self.record.sigmas.items()]


def fit_state(session: PrivateSession, state: int, support: Support, widen_by: Callable[[tuple[Flip, ...]], WidenedSupport],
              selection: WorkloadSelection, count: NodeCount, settings: SynthesisSettings, *, pumas: Sequence[Node],
              strength_floor: float) -> StateFit:
    """The state posterior (module docstring, step 2). ``support``: the public support (uniform
    weights); ``widen_by``: it widened by the given flips (those the prior mixture weighs in: a
    cache's, or :func:`engine.synthesis._prior_mixture.widen`); ``pumas``:
    every PUMA of the state, whose measurements (made here, read back by :func:`release_pumas`) it
    takes in as their sums; ``strength_floor``: the public simulation's floor of the prior strength."""
    plan = session.ledger.plan
    node = (int(state),)
    rho_state, rho_puma = plan.allocation("state_synthesis", "state"), plan.allocation("puma_synthesis", "puma")
    sums = session_puma_sums(session, pumas, selection.puma, rho_puma) if pumas and selection.puma else []
    measure, record = recording_measure(session_measure(session, "state_synthesis", "state", node))
    extra = [*count.size_extra(support), *sums]
    adaptive = settings.adaptive_at("state")
    # the flips are chosen and weighed from the state's initial measurements (charged once: the fit
    # below reads the stored answers back)
    initial = initial_measurements(selection.state, rho_state, measure, adaptive) if settings.prior_flips else []
    flips = resolve_flips(settings.prior_flips, support, [*extra, *initial], count.households) if settings.prior_flips else ()
    node_support, prior, mixture = node_prior(support, flips, [*extra, *initial], count.households, widen_by)
    res = synthesize_node(node_support, prior, selection.state, rho_state, measure, total=count.households,
                          prior_strength=settings.prior_strength, extra=extra, total_sd=count.sd, adaptive=adaptive,
                          select=session_select(session, "state_synthesis", "state", node), unit=session.unit,
                          strengths=settings.strength_candidates, strength_floor=strength_floor, completion=selection.completed)
    if sums:
        res.diagnostics["puma_sums"] = {"pumas": len(pumas), "workloads": [m.workload.id for m in sums]}
    if mixture is not None:
        res.diagnostics["prior_mixture"] = mixture.to_dict()
    return StateFit(node_support, prior, res, record, sums, mixture, used_flips(flips, mixture))


@dataclass
class PumaFit:
    """One PUMA's posterior (``result``) from ``prior``, with its own measurements (``record``)."""

    node: Node
    prior: np.ndarray
    result: NodeResult
    record: Recording


@dataclass
class PumaRelease:
    """A state's PUMAs: their fits, released household totals and drawn households (node order)."""

    fits: list[PumaFit]
    totals: list[int]
    draws: list[HierarchicalData]


def release_pumas(session: PrivateSession | None, support: Support, state_prior: np.ndarray | None, workloads: Sequence[Workload],
                  counts: Sequence[tuple[Node, NodeCount]], settings: SynthesisSettings, seed: int, *,
                  targets: Sequence[tuple[Workload, float]] = (), balance: BalanceTargets | None = None) -> PumaRelease:
    """Every PUMA of one state (module docstring, step 3), in node order. ``support``: the state
    posterior's; ``state_prior``: its weights (None: the public-only baseline — each PUMA the public
    prior updated with its size histogram alone, nothing measured); ``targets``: the state's
    measured workloads with their σ (:meth:`StateFit.targets`), to which the PUMA posteriors are
    raked; ``balance``: the support's balance marginals (built here when not given)."""
    if (session is None) != (state_prior is None):
        raise ValueError("PUMA posteriors from a state posterior measure through a session; the public-only baseline measures nothing")
    ordered = sorted(counts, key=lambda nc: tuple(nc[0]))
    prior = support.weights if state_prior is None else np.asarray(state_prior)
    rho = Fraction(0) if session is None else session.ledger.plan.allocation("puma_synthesis", "puma")
    fits = []
    for node, count in ordered:
        measure: MeasureFn | None = None
        record, select = Recording(), None
        if session is not None:
            measure, record = recording_measure(session_measure(session, "puma_synthesis", "puma", node))
            select = session_select(session, "puma_synthesis", "puma", node)
        res = synthesize_node(support, prior, [] if session is None else workloads, rho, measure, total=count.households,
                              prior_strength=settings.prior_strength, extra=count.size_extra(support), total_sd=count.sd,
                              adaptive=None if session is None else settings.adaptive_at("puma"), select=select,
                              unit="household" if session is None else session.unit)
        fits.append(PumaFit(tuple(node), prior, res, record))
    totals = [int(t) for t in totals_to_parent([f.result.total for f in fits], [c.households for _, c in ordered])]
    weights = [f.result.weights for f in fits]
    if targets and session is not None:
        weights, _ = rake_to_parent(support, weights, totals, prior, list(targets), prior_strength=settings.prior_strength)
    nodes = [f.node for f in fits]
    draws = sample_sibling_households(support, weights, totals, [node_rng(seed, n) for n in nodes], nodes,
                                      order=household_order(support.data), balance=balance or BalanceTargets.for_data(support.data))
    return PumaRelease(fits, totals, draws)


@dataclass
class StateRelease:
    """``data``: the synthetic households and persons of every PUMA (geography filled in);
    ``households``: {PUMA: released household count}; ``workloads``: what was measured at each
    level; ``diagnostics``: {node key: the update's diagnostics}."""

    data: HierarchicalData
    households: dict[Node, int]
    workloads: dict[str, list[str]]
    diagnostics: dict[str, dict[str, Any]] = field(default_factory=dict)


def measured_counts(session: PrivateSession, pumas: Sequence[Node]) -> dict[Node, NodeCount]:
    """Every PUMA's household count measured through the session (discrete Gaussian, sensitivity 1
    under both units; the ``group_counts`` stage at the PUMA level), the state's their sum."""
    rho = session.ledger.plan.allocation("group_counts", "puma")
    measured = {n: session.measure_household_count("group_counts", "puma", n, rho) for n in pumas}
    counts = {n: NodeCount(int(round(max(float(m.noisy_answer[0]), 0.0))), float(m.scale)) for n, m in measured.items()}
    state = (int(pumas[0][0]),)
    counts[state] = NodeCount(sum(c.households for c in counts.values()), float(np.sqrt(sum(c.sd ** 2 for c in counts.values()))))
    return counts


def synthesize_state(session: PrivateSession, state: int, public: HierarchicalData, settings: SynthesisSettings | None = None, *,
                     seed: int = 0, counts: Mapping[Node, NodeCount] | None = None, strength_floor: float | None = None,
                     sizes_measured: bool = False) -> StateRelease:
    """One state's synthetic microdata (module docstring). ``public``: the public prior's households
    (other states; their geography is ignored); ``settings``: the synthesis settings (the defaults
    when None; the release config's: ``ReleaseConfig.synthesis_settings``); ``seed``: the sampling
    seed; ``counts``: the state's and its PUMAs' household counts (:class:`NodeCount`; the flow's come
    from its count-of-counts stage) — when None every PUMA's count is measured here
    (:func:`state_plan` budgets it); ``strength_floor``: the prior strength's floor (None: simulated
    on ``public``, :func:`engine.synthesis._strength_floor.simulate_strength_floor`); ``sizes_measured``: the
    counts carry size histograms of every PUMA, so the PUMA level does not measure the size
    marginal again (:func:`choose_workloads`)."""
    settings = SynthesisSettings() if settings is None else settings
    plan = session.ledger.plan
    pumas = sorted(n for n in session.nodes("puma") if n[0] == int(state))
    if not pumas:
        raise ValueError(f"state {state} has no PUMA in the declared geography")
    counts = measured_counts(session, pumas) if counts is None else counts
    node = (int(state),)
    support = Support.from_data(public)
    selection = choose_workloads(public, settings, sizes_measured=sizes_measured)
    selection, _ = choose_puma_workloads(public, selection, session.unit, plan.allocation("puma_synthesis", "puma"),
                                         [counts[n].households for n in pumas], settings)
    if strength_floor is None:
        strength_floor = simulate_strength_floor(support, selection.state, session.unit, floor_rho(plan.allocation("state_synthesis", "state"), settings),
                                                 settings.strength_candidates).floor
    st = fit_state(session, state, support, lambda flips: widen(public, flips, public_cache=support.cache), selection, counts[node], settings,
                   pumas=pumas, strength_floor=strength_floor)
    rel = release_pumas(session, st.support, st.result.weights, selection.puma, [(n, counts[n]) for n in pumas], settings, seed,
                        targets=st.targets())
    diagnostics = {node_key(node): st.result.diagnostics, **{node_key(f.node): f.result.diagnostics for f in rel.fits}}
    return StateRelease(HierarchicalData.concat(rel.draws), {f.node: t for f, t in zip(rel.fits, rel.totals)},
                        {"state": [w.id for w in selection.state], "puma": [w.id for w in selection.puma]}, diagnostics)
