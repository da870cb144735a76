"""Per-node synthesis by prior update (Tao et al., Algorithm 2), shared by the pipeline and the
benchmarks.

PRIOR_UPDATE(W, h, p): measure the node's workloads W on its private households h, normalise by the
node's household total (a DP estimate from the count-of-counts or household-counts stage, or exact
only under the ``puma_household_counts`` invariant), and update the prior p (a distribution on the
support of public households) into the node's posterior. Per state the prior is the public empirical
distribution; per PUMA it is the state's posterior. The measurement is an injected callable bound to
the node's private households: the pipeline's comes from the private session (charged to the ledger,
persisted in the store), so this module never sees the private data; benchmarks bind a local
sampler. Every measured workload becomes an :class:`engine.queries._measurement.Measurement` (noisy counts,
σ, ρ_w); the update rules divide the counts by the node's household total themselves.

Two update rules:
- ``"map"`` (default): the noise-aware MAP update of :mod:`engine.synthesis._map_update` — relative entropy
  to the prior plus the Gaussian likelihood of every measurement, fitted jointly;
- ``"ide"``: Tao et al.'s iterative distribution estimation (:func:`engine.synthesis._prior_update.prior_update`),
  which matches the (feasible) noisy answers exactly.

Budget inside a node: the node's ρ is split evenly over its workloads; workload w gets
σ_w = Δ₂(w) / √(2 ρ_w) (Gaussian mechanism, ρ = Δ²/(2σ²)).

The node's household total. Every measured workload is a noisy count vector whose size carries
information about the node's household count G as well: a partition sums to G, a person-level
workload to G times the persons per household it counts, and so on. When the given total is
itself noisy (``total_sd`` > 0: a DP count from the count-of-counts or household-counts stage),
the posterior is fitted at a posterior-free estimate of G — the given total and the sums of the
measured partitions merged by inverse variance (:func:`start_total`), unbiased — and the node's
total is then G given that posterior in closed form (:func:`fit_total`: the weighted least
squares of the noisy answers on the posterior's, the given total one more measurement of G),
kept within three of the count's standard deviations of it (where only "contains" and person
counts are measured, other household sizes can meet them and G is pinned only weakly). At small
budgets the synthesis workloads hold several times the count's information, so the node's totals
(the sample sizes) are far less noisy than the count alone. That estimate leans upward, though
(the answers are regressed on those of a posterior drawn toward its prior), so a parent's children
are drawn at their totals scaled to the parent's count
(:func:`engine.synthesis._level_consistency.totals_to_parent`), and no posterior is refitted at it:
iterating the two steps to their joint fixed point carried the lean into the posteriors' shape and
cost further solves, for no better released marginals
(``benchmarks/results/HISTORY.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from engine.data import Domain, HierarchicalData
from engine.queries import CandidateAnswers, Measurement, PrivacyUnit, Support, Workload, answer
from engine.synthesis._adaptive import (
    AdaptiveRounds,
    SelectFn,
    candidate_workloads,
    expected_measurement_l1,
    initial_rho,
    measured_form,
    round_budget,
    selection_first,
)
from engine.synthesis._map_update import FIT_TOL, map_fit
from engine.synthesis._prior_strength import choose_prior_strength
from engine.synthesis._prior_update import prior_update

# measure(workload, rho) -> (noisy counts of the node's households, noise sigma per cell): the one
# measure callable (the pipeline's charges the private session, engine.synthesis._state_release.session_measure)
MeasureFn = Callable[[Workload, Fraction], tuple[np.ndarray, float]]
UpdateRule = Literal["map", "ide"]


@dataclass
class NodeResult:
    """``total``: the node's household total — the given one, or where its noise was given its
    estimate from the posterior (module docstring); the posterior is fitted at the posterior-free
    estimate (``diagnostics["total"]["normaliser"]``)."""

    weights: np.ndarray
    diagnostics: dict[str, Any]
    total: float = 0.0
    dual: np.ndarray | None = None  # the MAP rule's dual solution (a warm start at a nearby total)


def measure_node(workloads: Sequence[Workload], rho: Fraction, measure: MeasureFn) -> list[Measurement]:
    """Measure every workload of a node, ρ split evenly: ρ_w = ρ / |W| (exact)."""
    rho_w = Fraction(rho) / len(workloads)
    out = []
    for w in workloads:
        noisy, sigma = measure(w, rho_w)
        out.append(Measurement(w, np.asarray(noisy, dtype=np.float64), float(sigma), rho_w))
    return out


def initial_measurements(workloads: Sequence[Workload], rho: Fraction, measure: MeasureFn | None,
                         adaptive: AdaptiveRounds | None = None) -> list[Measurement]:
    """The measurements :func:`synthesize_node` makes of a node's given ``workloads`` before any
    adaptive round: ρ less the rounds' share (:func:`engine.synthesis._adaptive.initial_rho`), split evenly
    (:func:`measure_node`). A node's parent takes them in too (:func:`engine.synthesis._level_consistency.children_sum`)
    by calling this with the node's own arguments: the same workloads at the same ρ, so the
    session's measurements are the ones the node's fit reads back (charged once)."""
    if not (rho > 0 and workloads and measure is not None):
        return []
    return measure_node(workloads, initial_rho(rho, adaptive), measure)


def fit_total(support: Support, q: np.ndarray, measured: Sequence[Measurement], total: float, total_sd: float) -> float:
    """The household total G that maximises the Gaussian likelihood of the noisy counts given the
    per-household answers a_w = A_w q of the posterior q, with the given ``total`` ~ N(G, total_sd²)
    as one more measurement:

        G = (Σ_w a_w·ỹ_w / σ_w² + total / total_sd²) / (Σ_w ‖a_w‖² / σ_w² + 1 / total_sd²),

    floored at 0 (weighted least squares in one unknown)."""
    num, den = float(total) / total_sd**2, 1.0 / total_sd**2
    for m in measured:
        a = support.answer(m.workload, q)
        num += float(a @ m.noisy_answer) / m.variance
        den += float(a @ a) / m.variance
    return max(num / den, 0.0)


def scaled_dual(dual: np.ndarray | None, fitted_at: float, total: float) -> np.ndarray | None:
    """A starting dual for the fit at household total ``total`` from a fit at ``fitted_at``: its
    dual scaled by the ratio of totals, as the dual scales with G
    (:func:`engine.synthesis._map_update.map_fit`); the problem is strictly convex, so the start
    changes only the iterations. ``None`` without a dual."""
    if dual is None:
        return None
    scaled: np.ndarray = dual * (max(float(total), 1.0) / max(float(fitted_at), 1.0))
    return scaled


def start_total(measured: Sequence[Measurement], total: float, total_sd: float) -> float:
    """A posterior-free first estimate of G: the given total and the sum of every measured
    partition workload (each an unbiased count of G with variance cells·σ²), merged by inverse
    variance: the total :func:`synthesize_node` fits the posterior at."""
    num, den = float(total) / total_sd**2, 1.0 / total_sd**2
    for m in measured:
        if m.workload.is_partition():
            var = m.noisy_answer.size * m.variance
            num, den = num + float(m.noisy_answer.sum()) / var, den + 1.0 / var
    return max(num / den, 0.0)


def local_measure(private: HierarchicalData, unit: PrivacyUnit, noise: Callable[[np.ndarray, float, Fraction], tuple[np.ndarray, float]]) -> MeasureFn:
    """A :data:`MeasureFn` over in-memory data (benchmarks, notebooks): ``noise(counts, l2, rho)``
    adds the noise (e.g. ``engine.privacy._mechanisms.discrete_gaussian``). Nothing is charged: the
    pipeline measures through ``engine.privacy._session.PrivateSession`` instead."""

    def measure(w: Workload, rho: Fraction) -> tuple[np.ndarray, float]:
        return noise(np.rint(answer(private, w)).astype(np.int64), w.sensitivity(private.domain, unit)[1], rho)

    return measure


def update_node(support: Support, prior: np.ndarray, measurements: Sequence[Measurement], total: float, rule: UpdateRule = "map",
                prior_strength: float = 0.1, sweeps: int = 3, dual0: np.ndarray | None = None, tol: float = FIT_TOL) -> NodeResult:
    """Update ``prior`` with the node's measurements (noisy counts, divided by the household
    ``total``). ``prior_strength`` is relative to the node's household total (α = prior_strength ·
    total pseudo-households) for the MAP rule; ``dual0`` and ``tol``: its solver's starting point
    and tolerance (:func:`engine.synthesis._map_update.map_fit`)."""
    if rule == "map":
        fit = map_fit(support, prior, measurements, total, prior_strength=max(prior_strength * float(total), 1e-6), dual0=dual0, tol=tol)
        return NodeResult(fit.weights, fit.diagnostics, dual=fit.dual)
    res = prior_update(support, measurements, total=total, prior=prior, T=sweeps)
    return NodeResult(res.weights, res.diagnostics())


def size_measurement(domain: Domain, histogram: Sequence[float], sd: float) -> Measurement:
    """The count-of-counts estimate of a node's households of size 1..K as a noisy measurement of
    the size marginal (group workload on the size attribute, code k−1 = size k). ``sd``: noise
    standard deviation of one entry, in households. Post-processing of the count-of-counts stage's
    measurements: it costs nothing here (ρ 0)."""
    w = Workload("group", (domain.size_attribute,), ())
    h = np.asarray(histogram, dtype=np.float64)
    if h.size != w.n_cells(domain):
        raise ValueError(f"{h.size} size counts for the {w.n_cells(domain)} codes of {domain.size_attribute}")
    return Measurement(w, h, float(sd))


# The rounds' fits only rank the candidates for the exponential mechanism, whose noise has scale
# 2Δ/ε₀ (hundreds of households at the default budgets): a solver tolerance looser than the final
# fit's (engine.synthesis._map_update.FIT_TOL) moves a candidate's model count by far less than that
# noise and needs fewer solver iterations (benchmarks/results/HISTORY.md).
ROUND_FIT_TOL = 1e-7
# The rounds' candidates are picked this many at a time on one fit, a later pick scored on the same
# model without the cells of those picked before it. The rounds' fits are a large part of a state's
# fit, and refitting after every pick chose no better in the peer benchmark than after every second
# (benchmarks/results/HISTORY.md): half the fits for the same measurements and charges.
PICKS_PER_FIT = 2


def adaptive_measure(
    support: Support,
    prior: np.ndarray,
    measured: Sequence[Measurement],
    extra: Sequence[Measurement],
    total: float,
    plan: AdaptiveRounds,
    rho: Fraction,
    measure: MeasureFn,
    select: SelectFn,
    unit: PrivacyUnit,
    rule: UpdateRule = "map",
    prior_strength: float = 0.1,
    completion: Sequence[Workload] = (),
) -> tuple[list[Measurement], list[str], NodeResult]:
    """The adaptive rounds of one node (:mod:`engine.synthesis._adaptive`): ``plan.rounds`` times, choose
    the candidate workload the posterior fitted to everything measured before answers worst
    (``select``: the private session's exponential mechanism) and measure it (``measure``; in the
    form of the node's workloads, :func:`engine.synthesis._adaptive.measured_form`); the posterior is
    fitted at the household total ``total`` (a DP value) after every :data:`PICKS_PER_FIT` rounds,
    the picks between two fits scored on the same one. ``rho``: the node's whole ρ (split by
    :func:`engine.synthesis._adaptive.round_budget`). ``completion``: workloads of ``measured`` the rounds'
    fits leave out (:func:`synthesize_node`). Returns the new measurements, the chosen ids and the
    last fit (at ``total``), its dual laid out for the final fit's ``[*extra, *measured, *new]``
    (zero on the completion's cells)."""
    budget = round_budget(Fraction(rho), plan)
    domain = support.data.domain
    given = [m.workload for m in measured]
    candidates = candidate_workloads(domain, first=selection_first(given, plan.select_first), max_cells=plan.max_cells, max_attributes=plan.max_attributes,
                                     exclude=[m.workload for m in measured] + [m.workload for m in extra])
    if not candidates:
        raise ValueError("adaptive rounds: no candidate workload is left to measure")
    G = max(float(total), 1.0)
    penalty = expected_measurement_l1(candidates, domain, unit, budget.measure)
    model_answers = CandidateAnswers(support.data, candidates)
    # the order of synthesize_node's final fit (extra, then measured), each round's measurement
    # appended: a round's joint patterns extend the previous round's (cached with the support), and
    # the final fit starts from the last round's dual
    left_out = set(completion)
    fitted = [m for m in measured if m.workload not in left_out]
    # the rounds' first list and the final fit's prefix are every node's on this support (the given
    # workloads are chosen on public data): grouped once for all of them
    support.cache.keep([m.workload for m in [*extra, *fitted]])
    support.cache.keep([m.workload for m in [*extra, *measured]])
    res = update_node(support, prior, [*extra, *fitted], G, rule, prior_strength, tol=ROUND_FIT_TOL)
    new: list[Measurement] = []
    chosen: list[str] = []
    for r in range(plan.rounds):
        if r % PICKS_PER_FIT == 0:
            # the model's expected counts of every candidate (answers of the weighted support, no incidences)
            model = G * model_answers.answers(candidates, res.weights)
        i = select(candidates, model, penalty, budget.epsilon0, f"round-{r}")
        lo = sum(c.n_cells(domain) for c in candidates[:i])  # the chosen candidate's cells leave the model
        model = np.delete(model, slice(lo, lo + candidates[i].n_cells(domain)))
        w = measured_form(candidates.pop(i), given)
        penalty = np.delete(penalty, i)
        noisy, sigma = measure(w, budget.measure)
        m = Measurement(w, np.asarray(noisy, dtype=np.float64), float(sigma), budget.measure)
        new.append(m)
        chosen.append(w.id)
        if (r + 1) % PICKS_PER_FIT and r + 1 < plan.rounds:
            continue  # the next pick is scored on the same fit
        listed = [*extra, *fitted, *new]
        # the last fit's dual, zero on the cells measured since (the dual has one entry per fitted cell)
        dual0 = None if res.dual is None else np.concatenate([res.dual, np.zeros(sum(x.noisy_answer.size for x in listed) - res.dual.size)])
        res = update_node(support, prior, listed, G, rule, prior_strength, dual0=dual0, tol=ROUND_FIT_TOL)
    if len(fitted) < len(measured):
        # the final fit's list extends [*extra, *measured] by the rounds' workloads: grouped once on a
        # support (the same list for every state of a run), each final fit's grouping adds the rounds' only
        support.cache.joint_patterns([m.workload for m in [*extra, *measured]])
        if res.dual is not None:  # the final fit's layout, the completion's cells at 0
            blocks = np.split(res.dual, np.cumsum([m.noisy_answer.size for m in [*extra, *fitted, *new]])[:-1])
            rows = dict(zip(map(id, [*extra, *fitted, *new]), blocks))
            res.dual = np.concatenate([rows.get(id(m), np.zeros(m.noisy_answer.size)) for m in [*extra, *measured, *new]])
    return new, chosen, res


def synthesize_node(
    support: Support,
    prior: np.ndarray,
    workloads: Sequence[Workload],
    rho: Fraction,
    measure: MeasureFn | None,
    total: float,
    rule: UpdateRule = "map",
    prior_strength: float = 0.1,
    sweeps: int = 3,
    extra: Sequence[Measurement] = (),
    total_sd: float = 0.0,
    adaptive: AdaptiveRounds | None = None,
    select: SelectFn | None = None,
    unit: PrivacyUnit = "household",
    strengths: Sequence[float] = (),
    strength_floor: float = 0.0,
    completion: Sequence[Workload] = (),
) -> NodeResult:
    """PRIOR_UPDATE of one node: measure, normalise, update. ``extra``: measurements made
    elsewhere (the count-of-counts size marginal, :func:`size_measurement`) fitted jointly with
    the node's own, each by its precision. ``total_sd`` > 0: ``total`` is a noisy count of that
    standard deviation: the posterior is fitted at its posterior-free estimate and the node's
    total estimated from the posterior (module docstring); 0: ``total`` is taken as given. ``adaptive`` (with ``select``; ``unit`` the
    privacy unit of the selection's sensitivity): part of ρ goes to adaptive rounds after the
    given workloads (:func:`adaptive_measure`). ``strengths`` (two or more, MAP rule): the prior
    strength is chosen among them from the given workloads' measurements by empirical Bayes
    (:func:`engine.synthesis._prior_strength.choose_prior_strength`) instead of ``prior_strength``, at least
    ``strength_floor`` (:mod:`engine.synthesis._strength_floor`); the choice is in the diagnostics.
    ``completion``: workloads among ``workloads`` (a state's pair completion,
    :func:`engine.synthesis._workload_selection.pair_completion`) measured with the others and fitted by the
    final fit, but left out of the adaptive rounds' fits, which then rank the candidates on a model
    of the selection's workloads alone — far cheaper than with the completion's cells, and the
    rounds' choices no worse (``benchmarks/results/HISTORY.md``).
    With nothing to fit the prior is returned unchanged."""
    p = np.asarray(prior, dtype=np.float64)
    if rho > 0 and workloads and measure is None:
        raise ValueError("workloads to measure at rho > 0 need a measure callable")
    if total_sd < 0:
        raise ValueError("total_sd must be >= 0")
    rounds = adaptive is not None and adaptive.active and rho > 0 and measure is not None
    if rounds and select is None:
        raise ValueError("adaptive rounds need a select callable")
    measured = initial_measurements(workloads, Fraction(rho), measure, adaptive)
    joint = total_sd > 0 and bool(measured)
    # a trust region of three of the count's sd: where the workloads pin G only weakly ("contains"
    # and person counts can be met by other household sizes) the estimate may not run off
    bounds = (max(float(total) - 3 * total_sd, 0.0), float(total) + 3 * total_sd)
    chosen: list[str] = []
    last: NodeResult | None = None  # the adaptive rounds' last fit, at G0
    G0 = float(np.clip(start_total(measured, total, total_sd), *bounds)) if joint else float(total)
    strength_choice = None
    if len(strengths) > 1 and rule == "map" and measured:
        strength_choice = choose_prior_strength(support, p, [*extra, *measured], G0, strengths, floor=strength_floor)
        prior_strength = strength_choice.strength
    if rounds and adaptive is not None and measure is not None and select is not None:
        more, chosen, last = adaptive_measure(support, p, measured, extra, G0, adaptive, Fraction(rho), measure, select, unit, rule,
                                              prior_strength, completion)
        measured += more
    if not measured and not extra:
        return NodeResult(p / p.sum(), {"measured": 0}, float(total))
    G = float(np.clip(start_total(measured, total, total_sd), *bounds)) if joint else float(total)
    # the rounds' last fit at G0 (the completion's cells at 0) starts the fit, scaled to G
    res = update_node(support, p, [*extra, *measured], G, rule, prior_strength, sweeps, scaled_dual(None if last is None else last.dual, G0, G))
    res.total = float(np.clip(fit_total(support, res.weights, measured, total, total_sd), *bounds)) if joint else G
    res.diagnostics["total"] = {"given": float(total), "given_sd": float(total_sd), "normaliser": G, "fitted": res.total}
    if chosen:
        res.diagnostics["adaptive"] = chosen
    if strength_choice is not None:
        res.diagnostics["prior_strength_choice"] = strength_choice.to_dict()
    return NodeResult(res.weights, res.diagnostics, res.total)
