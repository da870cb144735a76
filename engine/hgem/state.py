"""One state's H-GEM as the pipeline runs it, shared by ``tasks.hgem`` and the benchmarks.

:func:`run_state` (= :func:`fit_state` + sampling) trains the H-GEM generator on one state and
samples synthetic households from it, reaching the private data only through
:class:`StateOracles` — the pipeline's come from the private session (:func:`session_oracles`:
every answer and every selection charged to the ledger before it is drawn, persisted before it is
used, read back on a rerun), the benchmarks' from in-memory data (:func:`local_oracles`, nothing
charged). The settings are one :class:`engine.hgem.settings.HGEMSettings` (the release config's
``advanced.hgem`` section).

1. candidates Q: ``settings.kway``-way group- and person-level workloads
   (``engine.hgem.workloads.candidate_workloads``);
2. GEM^Pub: pretraining on the PUBLIC data's answers (no privacy cost; ``settings.pretrain_steps``);
3. initial measurements: the state workloads chosen from the public data (the prior update's
   state workloads) are measured first, ``settings.initial_share`` × ρ_node evenly over them, with
   no selection (tag ``"initial"``); ``train_hgem`` fits them in its round 0;
4. ``settings.rounds`` adaptive rounds (``engine.hgem.train.train_hgem``); what the initial
   measurements leave is split as in GEM (``engine.hgem.privacy.state_budget``, α =
   ``settings.alpha``), in exact fractions: ρ_round = ρ_rounds / T, ρ_sel = ε₀²/8 ≤ α ρ_round,
   ρ_meas = ρ_round − α ρ_round. Round r (tag ``"round-<r>"``):

   * select: the exponential mechanism at ε₀ over the candidates' max-abs-error scores, computed
     by the oracle against the private answers (the session's
     ``PrivateSession.select_worst_workload``), score sensitivity
     ``engine.hgem.privacy.score_sensitivity``;
   * measure: the discrete Gaussian on the chosen workload's integer counts at ρ_meas, through
     the canonical :data:`engine.synthesis._node.MeasureFn` (noisy counts, σ).

   Units (what ``train_hgem`` expects): normalised answers, group level = fraction of households,
   person level = fraction of persons (``engine.hgem.answers``). Scores and measurements are
   divided by constants fixed before the rounds at no further privacy cost (:class:`Normalisers`),
   so that the score sensitivity is exact:
     - group level: N_G = the state's DP household count (from the count-of-counts or
       household-counts stage; exact only under the ``puma_household_counts`` invariant);
     - person level: N̂_I = N_G × the PUBLIC data's mean household size. The state's true person
       count is never used, so it costs nothing; the price is a small bias when the state's mean
       size differs from the public data's.
   The update is the MAP rule of ``engine.hgem.train`` with the relative-entropy prior to the public
   fit at strength ``prior_strength`` × N_G households (the prior update's α).
5. households are drawn from the output generator (``engine.hgem.sampling``: balanced components,
   stratified draws).

Resume: an oracle that persists its answers (the session's) makes a rerun charge exactly what one
clean run charges: every selection and measurement already made is read back. Before anything is
spent, the charges still missing are checked against the node's remaining budget
(:func:`outstanding_rho`), so a run that cannot finish spends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from engine.data import Domain, HierarchicalData, Node, node_key
from engine.hgem.config import HGEMResult, NormalisedMeasurement, RoundRecord, make_generator
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import resolve_device
from engine.hgem.pretrain import pretrain_public
from engine.hgem.privacy import score_sensitivity, state_budget
from engine.hgem.sampling import HouseholdStructure, sample_households
from engine.hgem.settings import HGEMSettings
from engine.hgem.train import train_hgem
from engine.hgem.workloads import candidate_workloads
from engine.privacy import BudgetExceededError, PrivateSession, discrete_gaussian, exponential_mechanism, max_abs_error_scores
from engine.queries import PrivacyUnit, Workload, answer
from engine.synthesis import MeasureFn, RoundBudget, local_measure

__all__ = [
    "INITIAL_TAG", "Normalisers", "SelectAt", "StateFit", "StateOracles", "fit_state", "local_oracles",
    "outstanding_rho", "pretrained_generator", "round_tag", "run_state", "session_oracles", "state_seeds",
]

INITIAL_TAG = "initial"  # the measurements before the rounds

# select(tag, candidates, normalisers, model answers, ε₀, score sensitivity) -> index of the chosen candidate
SelectAt = Callable[[str, Sequence[Workload], Sequence[float], np.ndarray, float, float], int]


def round_tag(r: int) -> str:
    """The tag of round ``r``'s selection and measurement (``"round-<r>"``)."""
    return f"round-{int(r)}"


@dataclass(frozen=True)
class StateOracles:
    """How one state's H-GEM reaches the private data.

    measure    ``measure(tag)`` → the canonical :data:`engine.synthesis._node.MeasureFn` of that tag's
               measurements (``(workload, ρ) -> (noisy counts, σ)``, discrete Gaussian)
    select     :data:`SelectAt`: the exponential mechanism over the candidates' scores
    paid       ``(tag, name)`` of the charges already made for this node (a rerun reads them
               back; name ``"select"`` for a selection, the workload id for a measurement)
    remaining  the node's budget left, checked before anything is spent; None: not checked
    name       what the oracles measure, for messages (e.g. ``"hgem ST=50"``)
    """

    measure: Callable[[str], MeasureFn]
    select: SelectAt
    paid: frozenset[tuple[str, str]] = frozenset()
    remaining: Fraction | None = None
    name: str = "hgem"


def session_oracles(session: PrivateSession, stage: str, level: str, node: Node) -> StateOracles:
    """The pipeline's oracles: every answer and selection charged and persisted by ``session``
    (keys ``<stage>/<node>/<tag>/<workload id>`` and ``<stage>/<node>/<tag>/select``)."""
    node = tuple(int(x) for x in node)
    nk = node_key(node)
    prefix = f"{stage}/{nk}/"

    def measure(tag: str) -> MeasureFn:
        def at(w: Workload, rho: Fraction) -> tuple[np.ndarray, float]:
            m = session.measure_workload(stage, level, node, w, rho, tag=tag)
            return m.noisy_answer, float(m.scale)

        return at

    def select(tag: str, workloads: Sequence[Workload], normalisers: Sequence[float], model_answers: np.ndarray, epsilon: float,
               sensitivity: float) -> int:
        return session.select_worst_workload(stage, level, node, tag, workloads, normalisers, model_answers, epsilon,
                                             sensitivity)

    paid = frozenset(_tag_and_name(c.key[len(prefix):]) for c in session.ledger.charges() if c.key.startswith(prefix))
    return StateOracles(measure, select, paid, session.ledger.remaining(stage, level, nk), f"{stage} {nk}")


def _tag_and_name(rest: str) -> tuple[str, str]:
    tag, _, name = rest.partition("/")
    return tag, name


def local_oracles(private: HierarchicalData, unit: PrivacyUnit,
                  noise: Callable[[np.ndarray, float, Fraction], tuple[np.ndarray, float]] = discrete_gaussian,
                  choose: Callable[[np.ndarray, float, float], int] = exponential_mechanism) -> StateOracles:
    """Oracles over in-memory data (benchmarks, notebooks), nothing charged: ``noise`` on the
    integer counts (:func:`engine.synthesis._node.local_measure`; default the pipeline's discrete
    Gaussian) and ``choose(scores, sensitivity, ε)`` on the session's scores (default the
    pipeline's exponential mechanism)."""
    measure = local_measure(private, unit, noise)
    targets: dict[tuple[tuple[str, ...], tuple[float, ...]], np.ndarray] = {}

    def select(tag: str, workloads: Sequence[Workload], normalisers: Sequence[float], model_answers: np.ndarray, epsilon: float,
               sensitivity: float) -> int:
        key = (tuple(w.id for w in workloads), tuple(float(n) for n in normalisers))
        if key not in targets:
            targets[key] = np.concatenate(
                [np.asarray(answer(private, w), dtype=np.float64).ravel() / float(n) for w, n in zip(workloads, normalisers)])
        scores = max_abs_error_scores(model_answers, targets[key], [w.n_cells(private.domain) for w in workloads])
        return int(choose(scores, float(sensitivity), float(epsilon)))

    return StateOracles(lambda tag: measure, select)


def outstanding_rho(budget: RoundBudget, initial_ids: Sequence[str], paid: Collection[tuple[str, str]]) -> Fraction:
    """What a run still has to charge, given the ``(tag, name)`` charges already made."""
    each = budget.initial_each(len(initial_ids))
    missing = sum((each for i in initial_ids if (INITIAL_TAG, i) not in paid), Fraction(0))
    for r in range(1, budget.rounds + 1):
        tag = round_tag(r)
        missing += 0 if (tag, "select") in paid else budget.select
        missing += 0 if any(t == tag and name != "select" for t, name in paid) else budget.measure
    return missing


@dataclass(frozen=True)
class Normalisers:
    """Public constants the counts are divided by (module docstring): N_G for group-level
    workloads, N̂_I = N_G × the public mean household size for person-level ones."""

    households: float
    persons: float

    @classmethod
    def of(cls, households: float, public: HierarchicalData) -> Normalisers:
        n_g = float(max(households, 1))
        return cls(n_g, n_g * (public.n_persons / max(public.n_households, 1)))  # this order: stored selections record Δ

    def __call__(self, w: Workload) -> float:
        return self.households if w.level == "group" else self.persons


def state_seeds(base: int, state: int) -> tuple[int, int]:
    """(generator seed, sampling seed): the post-processing randomness of one state."""
    s = np.random.SeedSequence(entropy=int(base), spawn_key=(int(state),)).generate_state(2)
    return int(s[0] >> 1), int(s[1] >> 1)


def pretrained_generator(public: HierarchicalData, candidates: Sequence[Workload], settings: HGEMSettings, seed: int,
                         device: str | torch.device | None = None, log: Callable[[str], None] | None = None) -> HGEMGenerator:
    """A generator of ``settings``' size from ``seed``, fitted to the public answers of
    ``candidates`` (GEM^Pub, no privacy cost; ``settings.pretrain_steps`` = 0: none). A function
    of public data, settings and seed only. ``log``: progress lines (the public fit's loss)."""
    G = make_generator(public.domain, settings, seed, device)
    if settings.pretrain_steps > 0:
        steps = settings.pretrain_steps
        progress = None if log is None else (lambda i, loss: log(f"public pretraining: step {i}/at most {steps}, loss {loss:.4g}"))
        pretrain_public(G, public, candidates, steps=steps, lr=settings.lr, progress=progress)
    return G


@dataclass
class StateFit:
    """One state's trained H-GEM with what it was trained under (no private values: the history
    holds errors against the noisy measurements only)."""

    result: HGEMResult
    candidates: list[Workload]
    initial_workloads: list[Workload]
    budget: RoundBudget
    normalisers: Normalisers
    score_sensitivity: float
    settings: HGEMSettings
    seed: int  # the generator's
    prior_households: float  # n₀ of the trainer's prior to the public fit
    device: str

    def diagnostics(self) -> dict[str, Any]:
        """JSON-ready: settings, budget split, per-round history."""
        return {
            "candidates": len(self.candidates),
            "settings": {"hgem": self.settings.to_dict(), "seed": self.seed, "prior_households": self.prior_households,
                         "device": self.device},
            "initial_workloads": [w.id for w in self.initial_workloads],
            "budget": {**self.budget.to_dict(), "score_sensitivity": self.score_sensitivity,
                       "household_normaliser": "the state's DP household count",
                       "person_normaliser": "N_G x public mean household size"},
            "rounds": [{"round": h.round, "workload": h.workload, "gamma": h.gamma, "steps": h.steps,
                        "max_measured_error": h.max_measured_error, "seconds": h.seconds} for h in self.result.history],
        }


def fit_state(
    public: HierarchicalData,
    settings: HGEMSettings,
    rho_node: Fraction,
    households: float,
    oracles: StateOracles,
    *,
    unit: PrivacyUnit,
    initial_workloads: Sequence[Workload] = (),
    seed: int = 0,
    prior_strength: float = 0.1,
    device: str | torch.device | None = None,
    public_fit: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> StateFit:
    """Train one state's H-GEM (module docstring, steps 1-4).

    public             the public households (pretraining, the person normaliser); their domain is
                       the private data's
    rho_node           the node's exact ρ (its whole H-GEM allocation)
    households         the state's DP household count N_G
    oracles            the private data's only access (:func:`session_oracles`, :func:`local_oracles`)
    unit               the privacy unit (score sensitivity)
    initial_workloads  the public-selected state workloads, measured first (none: all adaptive)
    seed               the generator's seed (post-processing: :func:`state_seeds`)
    public_fit         a ``state_dict`` of :func:`pretrained_generator`'s result for these settings
                       and seed (a cache of public-only work); None: pretrain here
    log                progress lines (no private values)
    """
    say = log or (lambda _msg: None)
    domain: Domain = public.domain
    initial_ws = list(initial_workloads) if settings.initial_share > 0 else []  # share 0: every round adaptive
    norm = Normalisers.of(households, public)
    candidates = candidate_workloads(domain, settings)
    delta_score = score_sensitivity(candidates, domain, unit, norm.households, norm.persons)
    budget = state_budget(Fraction(rho_node), settings.rounds, settings.alpha, settings.initial_share, len(initial_ws))

    if oracles.remaining is not None:  # fail before spending anything when the run cannot finish
        missing = outstanding_rho(budget, [w.id for w in initial_ws], oracles.paid)
        if missing > oracles.remaining:
            raise BudgetExceededError(
                f"{oracles.name}: {len(initial_ws)} initial workloads and {budget.rounds} rounds still need rho={missing} "
                f"(≈{float(missing):.6g}) but the node has {oracles.remaining} left of its allocation {rho_node}")

    def measured(tag: str, w: Workload, rho: Fraction) -> NormalisedMeasurement:
        """``w``'s noisy counts at ``rho`` in the normalised units train_hgem sees (answers and σ
        divided by the workload's normaliser)."""
        counts, sigma = oracles.measure(tag)(w, rho)
        return NormalisedMeasurement(w, np.asarray(counts, dtype=np.float64) / norm(w), float(sigma) / norm(w))

    rho_initial = budget.initial_each(len(initial_ws))
    initial = [measured(INITIAL_TAG, w, rho_initial) for w in initial_ws]
    prior_households = prior_strength * norm.households
    dev = resolve_device(device)
    say(f"{len(initial)} initial workloads (rho {float(rho_initial):.4g} each), {len(candidates)} candidate workloads, "
        f"{budget.rounds} rounds, rho={float(rho_node):.6g} (eps0={budget.epsilon0:.4g}, "
        f"rho_meas/round={float(budget.measure):.4g}), device {dev}")
    if public_fit is not None:
        G = make_generator(domain, settings, seed, dev)
        G.load_state_dict(public_fit)
    else:
        G = pretrained_generator(public, candidates, settings, seed, dev, log=say)
        say(f"public pretraining done (at most {settings.pretrain_steps} steps)")

    normalisers = [norm(w) for w in candidates]
    current = {"round": 0}
    last = {"sigma": float("nan")}

    def select(model_answers: np.ndarray) -> int:
        current["round"] += 1
        return oracles.select(round_tag(current["round"]), candidates, normalisers, model_answers, budget.epsilon0, delta_score)

    def measure(w: Workload) -> np.ndarray:
        m = measured(round_tag(current["round"]), w, budget.measure)
        last["sigma"] = m.sigma
        return m.answers

    def progress(rec: RoundRecord, _G: HGEMGenerator) -> None:
        say(f"round {rec.round}/{budget.rounds} measured {rec.workload} ({rec.steps} update steps, {rec.seconds:.1f}s)")

    # the σ of the measurement just taken (train_hgem asks right after measuring the workload)
    res = train_hgem(domain, candidates, select, measure, settings, prior_households=prior_households, generator=G,
                     callback=progress, measurement_sigma=lambda w: last["sigma"], initial=initial)
    return StateFit(res, candidates, initial_ws, budget, norm, delta_score, settings, int(seed), prior_households, str(dev))


def run_state(
    public: HierarchicalData,
    settings: HGEMSettings,
    rho_node: Fraction,
    households: float,
    oracles: StateOracles,
    n_samples: int,
    *,
    unit: PrivacyUnit,
    state: int,
    initial_workloads: Sequence[Workload] = (),
    seed: int = 0,
    prior_strength: float = 0.1,
    device: str | torch.device | None = None,
    public_fit: dict[str, Any] | None = None,
    structure: HouseholdStructure | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[HierarchicalData, StateFit]:
    """One state's H-GEM end to end (module docstring): :func:`fit_state` with the generator seed
    of :func:`state_seeds` (``seed``, ``state``), then ``n_samples`` households drawn with its
    sampling seed, geography (state, 0, ...). ``public_fit``: as :func:`fit_state`, for the
    generator seed ``state_seeds(seed, state)[0]``; ``structure``:
    the household rules the sampling keeps (:class:`engine.hgem.sampling.HouseholdStructure`)."""
    gen_seed, sample_seed = state_seeds(seed, state)
    fit = fit_state(public, settings, rho_node, households, oracles, unit=unit, initial_workloads=initial_workloads,
                    seed=gen_seed, prior_strength=prior_strength, device=device, public_fit=public_fit, log=log)
    synth = sample_households(fit.result.mixture(), int(n_samples), seed=sample_seed,
                              geo=(int(state),) + (0,) * (len(public.domain.geography) - 1), structure=structure)
    return synth, fit
