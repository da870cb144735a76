"""Synthesis tasks, one geography node each; every result is persisted so a resumed run reuses it.

- ``select_workload_task``: workloads from mutual information on the PUBLIC data (no privacy cost).
- ``state_update_task``: per state, measure the state workload through the private session
  (discrete Gaussian, charged and persisted) and update the public prior into the state posterior,
  its PUMAs' measurements (made there, read back by the PUMA task) taken in as their sums;
  answers are normalised by the state's DP household count; the σ of everything it measured is
  kept beside the posterior.
- ``puma_batch_task``: per state, every PUMA (``fit_puma`` each) measures the PUMA workload and
  updates the state posterior into the PUMA posterior (prior update), or keeps the public prior
  (public-only baseline); the PUMA posteriors are held together to the state posterior on the
  state's measured workloads (``synthesis.level_consistency``, ``engine.level_consistency``); then
  each PUMA's household total is drawn from its posterior (``synthesis.sampling``: balanced on the
  domain's one- and two-attribute and the persons' three-attribute marginals by default, a state's
  PUMAs with error diffusion, ``engine.balanced_sampling``).

When the count-of-counts stage ran, its size histogram of the node enters both updates as one more
noisy measurement of the size marginal (``engine.synthesis.size_measurement``), weighed against
the node's own measurements by its precision: information, not a constraint imposed whatever its
noise (the public-only baseline is updated with it alone).

No task here reads the private data: only ``RunContext.session()`` measurements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import numpy as np
from prefect import task

from engine.adaptive import initial_rho
from engine.balanced_sampling import BalanceTargets
from engine.budget_split import choose_state_fraction
from engine.geography import node_key
from engine.hierarchical_data import HierarchicalData
from engine.household_sampling import household_order, sample_sibling_households
from engine.level_consistency import rake_to_parent, totals_to_parent
from engine.measurement import Measurement
from engine.prior_mixture import Flip, WidenedSupport, node_prior, widen
from engine.puma_attributes import keep_puma_attributes
from engine.queries import Workload
from engine.state_release import node_rng, session_measure, session_puma_sums, session_select
from engine.strength_floor import play_state
from engine.strength_floor import strength_floor as floor_of
from engine.support import Support
from engine.synthesis import NodeResult, initial_measurements, size_measurement, synthesize_node
from engine.uncertainty import Recording, fit_answer_sd, recording_measure
from engine.workload_selection import PUMA_ATTRIBUTES, WorkloadSelection, select_workloads
from tasks.context import FileKey, RunContext, file_key
from tasks.run_context import save_npz_atomic, write_json_atomic

__all__ = ["PumaJob", "fit_puma", "node_key", "node_rng", "public_only_baseline", "puma_batch_task", "select_workload_task",
           "state_update_task"]


def place(data: HierarchicalData, node: tuple[int, ...]) -> HierarchicalData:
    return data.with_geo(np.tile(np.asarray(node, dtype=np.int32), (data.n_households, 1)))


@lru_cache(maxsize=16)
def _cached_support(key: FileKey) -> Support:
    return Support.from_data(HierarchicalData.from_npz(key[0]))


def cached_support(public_npz: str) -> Support:
    """The public support, built once per worker process and file (incidences are cached on it;
    :func:`tasks.context.file_key`)."""
    return _cached_support(file_key(public_npz))


@lru_cache(maxsize=4)
def _cached_widened(key: FileKey, flips: tuple[Flip, ...]) -> WidenedSupport:
    public = _cached_support(key)
    return widen(public.data, flips, public_cache=public.cache)


def cached_widened(public_npz: str, flips: tuple[Flip, ...]) -> WidenedSupport:
    """The public support widened by its flipped copies (``synthesis.prior_flips``,
    ``engine.prior_mixture``), built once per worker process, file and flips."""
    return _cached_widened(file_key(public_npz), flips)


@lru_cache(maxsize=4)
def _cached_balance(key: FileKey, flips: tuple[Flip, ...]) -> BalanceTargets:
    return BalanceTargets.for_data((_cached_widened(key, flips).support if flips else _cached_support(key)).data)


def cached_balance(public_npz: str, flips: tuple[Flip, ...] = ()) -> BalanceTargets:
    """The support's balance marginals (``engine.balanced_sampling``; ``flips``: of the widened
    support), built once per worker process and file."""
    return _cached_balance(file_key(public_npz), flips)


def prior_flips(ctx: RunContext) -> tuple[Flip, ...]:
    """``synthesis.prior_flips`` of the run, checked against the public data's domain
    (:meth:`schemas.domain_spec.DomainSpec.prior_flips`)."""
    return ctx.settings.prior_flips


@task(name="select-workload")
def select_workload_task(public_npz: str, out_path: str, person_first: int = 0, normalise: bool = False, puma_attributes: int = PUMA_ATTRIBUTES,
                         sizes_measured: bool = False, complete_pairs: bool = False) -> dict:
    """Mutual information on the public data only: no privacy cost. ``sizes_measured``: the
    count-of-counts stage measures every PUMA's size histogram, so the size attribute is not
    measured again as a PUMA one-way marginal; ``complete_pairs``: the state level also measures
    the persons' two-way marginals the selection leaves out (``synthesis.complete_pairs``)."""
    out = Path(out_path)
    if out.exists():
        return json.loads(out.read_text())
    public = HierarchicalData.from_npz(public_npz)
    sel = select_workloads(public, person_first=person_first, normalise=normalise, puma_max_attributes=puma_attributes,
                           puma_exclude=(public.domain.size_attribute,) if sizes_measured else (), complete_pairs=complete_pairs)
    record = sel.to_record()
    write_json_atomic(out, record)
    return record


@task(name="choose-puma-attributes")
def choose_puma_attributes_task(ctx: RunContext, workload: dict, puma_households: list[int]) -> dict:
    """``synthesis.puma_attributes_rule: signal_to_noise``: how many of the ranked PUMA one-way
    marginals to measure, from the public data's between-PUMA variation and the PUMA level's ρ at
    the median of the PUMAs' DP household counts (``engine.puma_attributes``; post-processing, no
    privacy cost). Returns the workload record with that many. Kept in the work directory: a
    resumed run reuses it."""
    out = ctx.paths.puma_attributes_path
    sel = WorkloadSelection.from_record(workload)
    if out.exists():
        return sel.with_puma_attributes(json.loads(out.read_text())["puma_attributes"]).to_record()
    s = ctx.settings
    rho = initial_rho(ctx.allocation("puma_synthesis", "puma"), s.adaptive_at("puma"))
    sel, choice = keep_puma_attributes(ctx.public(), sel, ctx.cfg.privacy_unit, float(rho),
                                       float(np.median(puma_households)) if puma_households else 0.0,
                                       minimum=s.puma_attributes, maximum=s.puma_attributes_max)
    write_json_atomic(out, choice.to_dict())
    return sel.to_record()


@task(name="choose-synthesis-split")
def choose_split_task(ctx: RunContext, workload_ids: list[str]) -> dict:
    """``allocation.synthesis_split: public_simulation``: the state level's fraction of the
    synthesis ρ from the expected error simulated on the public data (``engine.budget_split``; no
    privacy cost). Kept in the work directory: a resumed run reuses it, so its ledger's plan holds."""
    out = ctx.paths.synthesis_split_path
    if out.exists():
        return json.loads(out.read_text())
    rho = float(ctx.plan.stage_rho("state_synthesis") + ctx.plan.stage_rho("puma_synthesis"))
    adaptive = ctx.settings.adaptive_at("state")
    measured = 1.0 if adaptive is None else 1.0 - float(adaptive.share)
    choice = choose_state_fraction(ctx.public(), [Workload.from_id(w) for w in workload_ids], ctx.cfg.privacy_unit, rho,
                                   state_measured=measured).to_dict()
    write_json_atomic(out, choice)
    return choice


def saved_strength_floor(ctx: RunContext) -> dict | None:
    """The run's strength floor record when it was chosen already (a resumed run reuses it)."""
    out = ctx.paths.strength_floor_path
    return json.loads(out.read_text()) if out.exists() else None


def _floor_rho(ctx: RunContext) -> float:
    return float(initial_rho(ctx.allocation("state_synthesis", "state"), ctx.settings.adaptive_at("state")))


@task(name="play-strength-floor")
def play_strength_floor_task(ctx: RunContext, state: int, workload_ids: list[str]) -> list[float]:
    """``synthesis.prior_strength_floor: public_simulation``: one public state played as the
    private one with the state's workloads at the run's ρ (``engine.strength_floor.play_state``;
    public data only, no privacy cost), on the worker's cached public support, which the state
    fits then reuse."""
    return list(play_state(cached_support(ctx.public_npz), state, [Workload.from_id(w) for w in workload_ids], ctx.cfg.privacy_unit,
                           _floor_rho(ctx), ctx.settings.strength_candidates))


def record_strength_floor(ctx: RunContext, table: list[tuple[int, list[float]]]) -> dict:
    """The floor from the played states' errors (``engine.strength_floor.strength_floor``), kept
    in the work directory."""
    choice = floor_of(ctx.settings.strength_candidates, _floor_rho(ctx), table).to_dict()
    write_json_atomic(ctx.paths.strength_floor_path, choice)
    return choice


def strength_floor(ctx: RunContext) -> float:
    """The run's floor of the state prior strength (0 when none was simulated)."""
    path = ctx.paths.strength_floor_path
    return float(json.loads(path.read_text())["floor"]) if path.exists() else 0.0


SizeEstimate = tuple[list[float], float]  # (noisy households of size 1..K, noise sd of one entry)


def size_extra(support: Support, size_estimate: SizeEstimate | None) -> list[Measurement]:
    return [] if size_estimate is None else [size_measurement(support.data.domain, size_estimate[0], size_estimate[1])]


def answer_sd(support: Support, res, prior: np.ndarray, workloads: list[Workload], record: Recording, s, total_sd: float,
              size_estimate: SizeEstimate | None, queries: list[Workload] | None = None, extra: list[Measurement] | None = None) -> dict:
    """``answer_sd`` (the sd of every fitted cell count of the node's measured workloads — the
    given ``workloads`` and those its adaptive rounds chose, every measurement the fit used — at a
    fixed total, the error of the fit's ``prior`` estimated from the noisy answers), ``total_var``
    (the variance of the fitted total) and ``response_sd`` (how much the fit's noise moves the
    ``queries``: a PUMA's on its state's workloads), by
    ``engine.uncertainty.fit_answer_sd``; kept beside the node's diagnostics for the release's
    ``intervals.parquet``. ``extra``: further measurements the fit took in (a state's PUMA sums)."""
    workloads = [*workloads, *(Workload.from_id(w) for w in res.diagnostics.get("adaptive", []))]
    strength = (res.diagnostics.get("prior_strength_choice") or {}).get("strength", s.prior_strength)  # the fit's own
    e = fit_answer_sd(support, res.weights, res.total, workloads, record, rule="map", prior_strength=strength,
                      total_sd=total_sd, size=None if size_estimate is None else (np.asarray(size_estimate[0]), size_estimate[1]),
                      queries=queries or [], prior=prior, extra=extra or [])
    return {"answer_sd": e.answer_sd, "total_var": e.total_var, "response_sd": e.response_sd}


def puma_sums(ctx: RunContext, pumas: list[tuple[int, int]], workload_ids: list[str]) -> list[Measurement]:
    """``synthesis.pumas_inform_state``: the state's measurements implied by its PUMAs'
    (``engine.state_release.session_puma_sums``, with the arguments :func:`fit_puma` measures with);
    the PUMA task reads the same stored answers back."""
    if not pumas or not workload_ids:
        return []
    return session_puma_sums(ctx.session(), pumas, [Workload.from_id(w) for w in workload_ids], ctx.allocation("puma_synthesis", "puma"),
                             ctx.settings.adaptive_at("puma"))


@task(name="synthesize-state")
def state_update_task(ctx: RunContext, state: int, households: int, workload_ids: list[str],
                      size_estimate: SizeEstimate | None = None, households_sd: float = 0.0,
                      pumas: list[tuple[int, int]] | None = None, puma_workload_ids: list[str] | None = None,
                      completed_ids: list[str] | None = None) -> str:
    """``households``: the state's DP household count (the normaliser of its answers), with its
    noise sd ``households_sd`` (> 0: the state total is estimated jointly with the posterior,
    ``engine.synthesis``); ``size_estimate``: the count-of-counts size histogram of the state,
    when that stage ran; ``pumas`` (every PUMA of the state) and ``puma_workload_ids``: the PUMA
    level's measurements, whose sums the state's fit takes in (:func:`puma_sums`);
    ``completed_ids``: the workloads the pair completion added, which the adaptive rounds' fits
    leave out (``engine.synthesis.synthesize_node``'s ``completion``)."""
    node = (int(state),)
    out = ctx.paths.node_path("state_posterior", node_key(node))
    if out.exists():
        return str(out)
    support = cached_support(ctx.public_npz)
    s = ctx.settings
    workloads = [Workload.from_id(w) for w in workload_ids]
    sums = puma_sums(ctx, pumas or [], puma_workload_ids or [])
    measure, record = recording_measure(session_measure(ctx.session(), "state_synthesis", "state", node))
    extra = [*size_extra(support, size_estimate), *sums]
    flips = s.prior_flips
    # the prior's mixture with the flipped copies, from the state's initial measurements (charged
    # once: synthesize_node below reads the stored answers back)
    initial = initial_measurements(workloads, ctx.allocation("state_synthesis", "state"), measure, s.adaptive_at("state")) if flips else []
    support, prior, mixture = node_prior(support, cached_widened(ctx.public_npz, flips) if flips else None, [*extra, *initial], households)
    res = synthesize_node(
        support, prior, workloads, ctx.allocation("state_synthesis", "state"), measure, total=households,
        prior_strength=s.prior_strength, extra=extra, total_sd=households_sd,
        adaptive=s.adaptive_at("state"), select=session_select(ctx.session(), "state_synthesis", "state", node), unit=ctx.cfg.privacy_unit,
        strengths=s.strength_candidates, strength_floor=strength_floor(ctx),
        completion=[Workload.from_id(w) for w in completed_ids or []],
    )
    if sums:
        res.diagnostics["puma_sums"] = {"pumas": len(pumas or []), "workloads": [m.workload.id for m in sums]}
    if mixture is not None:
        res.diagnostics["prior_mixture"] = mixture.to_dict()
    widened = mixture is not None and mixture.widened
    save_npz_atomic(out, lambda f: np.savez(f, weights=res.weights, widened=np.array(widened)))
    write_json_atomic(out.with_suffix(".json"), {"node": node_key(node), "diagnostics": res.diagnostics, "sigmas": record.sigmas,
                                                 **answer_sd(support, res, prior, workloads, record, s,
                                                             households_sd, size_estimate, extra=sums)})
    return str(out)


@dataclass(frozen=True)
class PumaJob:
    """One PUMA of a batch: its node, DP household count (exact only under the declared
    invariant) with the count's noise sd, and its count-of-counts size histogram when that stage ran."""

    node: tuple[int, int]
    n_households: int
    size_estimate: SizeEstimate | None = None
    households_sd: float = 0.0


def fit_puma(ctx: RunContext, job: PumaJob, prior: np.ndarray | None, workload_ids: list[str], support: Support,
             state_workload_ids: list[str] | None = None) -> NodeResult:
    """One PUMA's posterior (or the public prior for the baseline, ``prior`` None), updated with
    the count-of-counts size estimate when given, and its household total: the DP count estimated
    jointly with the posterior from the PUMA's own measurements when its noise sd is given
    (``engine.synthesis``), else the count itself. Its diagnostics and error estimates go beside the
    PUMA's file (``state_workload_ids``: the state's workloads, on which the fit's response to its
    noise is kept for the state's error estimates, ``tasks.intervals``). A rerun refits from the
    stored measurements (nothing is charged again)."""
    node, key = job.node, node_key(job.node)
    s = ctx.settings
    baseline = prior is None  # public-only baseline (ε = 0 for synthesis): the public empirical distribution
    workloads = [] if baseline else [Workload.from_id(w) for w in workload_ids]
    measure, record = (None, Recording()) if baseline else recording_measure(session_measure(ctx.session(), "puma_synthesis", "puma", node))
    res = synthesize_node(
        support, support.weights if prior is None else prior, workloads, Fraction(0) if baseline else ctx.allocation("puma_synthesis", "puma"),
        measure, total=job.n_households, prior_strength=s.prior_strength,
        extra=size_extra(support, job.size_estimate), total_sd=job.households_sd,
        adaptive=None if baseline else s.adaptive_at("puma"),
        select=None if baseline else session_select(ctx.session(), "puma_synthesis", "puma", node), unit=ctx.cfg.privacy_unit,
    )
    out = ctx.paths.node_path("synthesis", key)
    if not out.exists():
        write_json_atomic(out.with_suffix(".json"), {"node": key, "diagnostics": res.diagnostics,
                                                     **answer_sd(support, res, support.weights if prior is None else prior, workloads,
                                                                 record, s, job.households_sd, job.size_estimate,
                                                                 [Workload.from_id(w) for w in state_workload_ids or []])})
    return res


def state_targets(state_posterior: str) -> list[tuple[Workload, float]]:
    """The state's measured workloads (the given ones and its adaptive rounds') with their noise σ,
    as the state task recorded them beside its posterior; empty when it recorded none."""
    meta = Path(state_posterior).with_suffix(".json")
    if not meta.exists():
        return []
    sigmas = json.loads(meta.read_text()).get("sigmas") or {}
    return [(Workload.from_id(w), float(sigma)) for w, sigma in sigmas.items()]


@task(name="synthesize-pumas")
def puma_batch_task(ctx: RunContext, jobs: list[PumaJob], state_posterior: str | None, workload_ids: list[str], seed: int,
                    support_npz: str | None = None, state_workload_ids: list[str] | None = None) -> list[str]:
    """Every PUMA of one state: each one's posterior (:func:`fit_puma`); the PUMAs' fitted totals
    scaled to the sum of their consistent household counts, the state's
    (``engine.level_consistency.totals_to_parent``: the fits lean upward, the counts do not); then, with
    ``synthesis.level_consistency: rake``, the PUMA posteriors tilted together so that their sum
    holds to the state posterior on the state's measured workloads
    (``engine.level_consistency.rake_to_parent``); then each PUMA's households drawn
    (``synthesis.sampling``) and persisted one by one. Everything after the measurements is a
    deterministic function of the stored measurements and the sampling seed, so a resumed task
    refits the state's PUMAs and writes exactly the files it had not written. One task per state
    keeps the orchestration's cost per task off the per-PUMA path. ``state_posterior`` None: the
    public-only baseline."""
    outs = [ctx.paths.node_path("synthesis", node_key(job.node)) for job in jobs]
    if all(o.exists() for o in outs):
        return [str(o) for o in outs]
    s = ctx.settings
    prior, widened = None, False
    if state_posterior is not None:
        with np.load(state_posterior) as z:
            prior = z["weights"]
            widened = bool(z["widened"]) if "widened" in z.files else False
    flips = prior_flips(ctx) if widened else ()  # the state's prior took the flipped households in: its PUMAs live there too
    support = cached_widened(ctx.public_npz, flips).support if widened else cached_support(support_npz or ctx.public_npz)
    balance = cached_balance(support_npz or ctx.public_npz, flips)
    fits = [fit_puma(ctx, job, prior, workload_ids, support, state_workload_ids) for job in jobs]
    weights = [f.weights for f in fits]
    totals = totals_to_parent([f.total for f in fits], [job.n_households for job in jobs]).tolist()
    targets = state_targets(state_posterior) if state_posterior is not None else []
    if targets and prior is not None:
        weights, _ = rake_to_parent(support, weights, totals, prior, targets, prior_strength=s.prior_strength)
    order = household_order(support.data)
    # a state's PUMAs drawn in node order, each carrying the earlier ones' balance residual: every
    # PUMA is drawn again on a resume (its draw depends on the ones before it), only missing files are written
    ranked = sorted(range(len(jobs)), key=lambda i: jobs[i].node)
    draws = sample_sibling_households(support, [weights[i] for i in ranked], [totals[i] for i in ranked],
                                      [node_rng(seed, jobs[i].node) for i in ranked], [jobs[i].node for i in ranked],
                                      order=order, balance=balance)
    synths = dict(zip(ranked, draws))
    for i, out in enumerate(outs):
        if not out.exists():
            save_npz_atomic(out, synths[i].to_npz)
    return [str(o) for o in outs]


def public_only_baseline(public: HierarchicalData, private: HierarchicalData, seed: int) -> HierarchicalData:
    """The ε = 0 baseline for every PUMA of ``private`` at once (internal QA and benchmarks only:
    it uses the exact PUMA household counts)."""
    nodes, counts = np.unique(private.geo, axis=0, return_counts=True)
    parts = [place(public.take(node_rng(seed + 1, tuple(n)).integers(0, public.n_households, g)), tuple(n)) for n, g in zip(nodes, counts)]
    return HierarchicalData.concat(parts)
