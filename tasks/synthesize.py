"""Synthesis tasks: the Prefect wrappers of the one composition of a state's release
(``engine.synthesis``), one geography node or one state each; every result is persisted so
a resumed run reuses it.

- ``select_workload_task``: workloads from mutual information on the PUBLIC data (no privacy cost).
- ``state_update_task``: per state, ``engine.synthesis.fit_state`` on the worker's cached
  public support; the posterior, the σ of everything it measured and its error estimates persisted.
- ``puma_batch_task``: per state, ``engine.synthesis.release_pumas`` (every PUMA's posterior,
  held to the state, its households drawn), each PUMA's households and error estimates persisted;
  or the public-only baseline.

When the count-of-counts stage ran, its size histogram of the node enters both updates as one more
noisy measurement of the size marginal (``engine.synthesis._node.size_measurement``), weighed against
the node's own measurements by its precision: information, not a constraint imposed whatever its
noise (the public-only baseline is updated with it alone).

No task here reads the private data: only ``RunContext.session()`` measurements.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from prefect import task

from engine.data import HierarchicalData, node_key, read_npz, unique_rows
from engine.queries import IncidenceCache, Measurement, Support, Workload
from engine.synthesis import (
    BalanceTargets,
    Flip,
    NodeCount,
    NodeResult,
    Recording,
    SharedPrior,
    SizeEstimate,
    SynthesisSettings,
    WidenedSupport,
    WorkloadSelection,
    choose_puma_workloads,
    choose_state_fraction,
    choose_workloads,
    fit_answer_sd,
    fit_state,
    floor_rho,
    named_flips,
    node_rng,
    play_state,
    release_pumas,
    select_workloads,
    widen,
)
from engine.synthesis import strength_floor as floor_of
from tasks.context import FileKey, RunContext, built_once, file_key
from tasks.intervals import write_state_intervals
from tasks.run_context import save_npz_atomic, write_json_atomic

__all__ = ["PumaJob", "node_key", "node_rng", "public_only_baseline", "puma_batch_task", "select_workload_task",
           "state_update_task"]


def place(data: HierarchicalData, node: tuple[int, ...]) -> HierarchicalData:
    return data.with_geo(np.tile(np.asarray(node, dtype=np.int32), (data.n_households, 1)))


_incidence_caches: weakref.WeakSet[IncidenceCache] = weakref.WeakSet()  # those of the supports below, for forget_joint_incidences


@lru_cache(maxsize=16)
def _cached_support(key: FileKey) -> Support:
    support = Support.from_data(HierarchicalData.from_npz(key[0]))
    _incidence_caches.add(support.cache)
    return support


def cached_support(public_npz: str) -> Support:
    """The public support, built once per worker process and file (incidences are cached on it;
    :func:`tasks.context.file_key`)."""
    return built_once(_cached_support, file_key(public_npz))


# a support widened by a state's flips (their codes, and the share of the households copied, follow its
# own measurements) seldom serves another state: a worker keeps those of the states its two threads
# have in hand, not a history of them
WIDENED_KEPT = 2


@lru_cache(maxsize=WIDENED_KEPT)
def _cached_widened(key: FileKey, flips: tuple[Flip, ...]) -> WidenedSupport:
    public = _cached_support(key)
    widened = widen(public.data, flips, public_cache=public.cache)
    _incidence_caches.add(widened.support.cache)
    return widened


def cached_widened(public_npz: str, flips: tuple[Flip, ...]) -> WidenedSupport:
    """The public support widened by its flipped copies (``SynthesisSettings.prior_flips``,
    ``engine.synthesis``), built once per worker process, file and flips."""
    return built_once(_cached_widened, file_key(public_npz), flips)


@lru_cache(maxsize=4)
def _cached_public_balance(key: FileKey) -> BalanceTargets:
    return BalanceTargets.for_data(_cached_support(key).data)


@lru_cache(maxsize=WIDENED_KEPT)
def _cached_widened_balance(key: FileKey, flips: tuple[Flip, ...]) -> BalanceTargets:
    public = _cached_support(key).data
    # the widened households are the public ones, then their copies: the public targets' block is shared
    widened = _cached_widened(key, flips)
    data = widened.support.data
    return _cached_public_balance(key).with_copies(public, data.take(np.arange(public.n_households, data.n_households)), widened.copies)


def cached_balance(public_npz: str, flips: tuple[Flip, ...] = ()) -> BalanceTargets:
    """The support's balance marginals (``engine.synthesis``; ``flips``: of the widened
    support), built once per worker process and file."""
    if not flips:
        return built_once(_cached_public_balance, file_key(public_npz))
    return built_once(_cached_widened_balance, file_key(public_npz), flips)


def worker_caches() -> tuple:
    """The caches a worker fills for the synthesis (the supports, widened supports and balance
    targets above), for :func:`clear_caches` and the tests that look at them."""
    return (_cached_public_balance, _cached_widened_balance, _cached_widened, _cached_support)


def clear_caches() -> None:
    """Empty :func:`worker_caches` (the next task that needs one rebuilds it from its file)."""
    for cache in worker_caches():
        cache.cache_clear()


def forget_joint_incidences() -> None:
    """Drop the joint incidences kept on every cached support (``IncidenceCache.forget_joints``),
    between the state and the PUMA synthesis: the PUMA fits group their own workload lists, and the
    state fits' lists (a few per support, tens to hundreds of MB each) would stay beside them, and
    beside the balance targets, for the whole PUMA stage. The supports, their per-workload
    incidences and patterns, which the PUMA fits do reuse, are kept."""
    for cache in list(_incidence_caches):
        cache.forget_joints()


@task(name="select-workload")
def select_workload_task(public_npz: str, out_path: str, settings: SynthesisSettings, prior_update: bool, sizes_measured: bool) -> dict:
    """Mutual information on the public data only: no privacy cost. ``prior_update``: the prior
    update's workloads (``engine.synthesis.choose_workloads``: normalised, the state's pairs
    completed); else (H-GEM, whose mixture answers plain counts) the selection's cliques as plain
    counts. ``sizes_measured``: the count-of-counts stage measures every PUMA's size histogram, so
    the size attribute is not measured again as a PUMA one-way marginal."""
    out = Path(out_path)
    if out.exists():
        return json.loads(out.read_text())
    public = HierarchicalData.from_npz(public_npz)
    if prior_update:
        sel = choose_workloads(public, settings, sizes_measured=sizes_measured)
    else:
        sel = select_workloads(public, puma_max_attributes=settings.puma_attributes_max,
                               puma_exclude=(public.domain.size_attribute,) if sizes_measured else ())
    record = sel.to_record()
    write_json_atomic(out, record)
    return record


@task(name="choose-puma-attributes")
def choose_puma_attributes_task(ctx: RunContext, workload: dict, puma_households: list[int]) -> dict:
    """How many of the ranked PUMA one-way
    marginals to measure, from the public data's between-PUMA variation and the PUMA level's ρ at
    the median of the PUMAs' DP household counts (``engine.synthesis``; post-processing, no
    privacy cost). Returns the workload record with that many. Kept in the work directory: a
    resumed run reuses it."""
    out = ctx.paths.puma_attributes_path
    sel = WorkloadSelection.from_record(workload)
    if out.exists():
        return sel.with_puma_attributes(json.loads(out.read_text())["puma_attributes"]).to_record()
    sel, choice = choose_puma_workloads(ctx.public(), sel, ctx.cfg.privacy_unit, ctx.allocation("puma_synthesis", "puma"), puma_households,
                                        ctx.settings)
    write_json_atomic(out, choice.to_dict())
    return sel.to_record()


@task(name="choose-synthesis-split")
def choose_split_task(ctx: RunContext, workload_ids: list[str]) -> dict:
    """``advanced.allocation.synthesis_split: public_simulation``: the state level's fraction of the
    synthesis ρ from the expected error simulated on the public data (``engine.synthesis``; no
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
    return floor_rho(ctx.allocation("state_synthesis", "state"), ctx.settings)


@task(name="play-strength-floor")
def play_strength_floor_task(ctx: RunContext, state: int, workload_ids: list[str]) -> list[float]:
    """The strength floor's simulation: one public state played as the
    private one with the state's workloads at the run's ρ (``engine.synthesis.play_state``;
    public data only, no privacy cost), on the worker's cached public support, which the state
    fits then reuse."""
    return list(play_state(cached_support(ctx.public_npz), state, [Workload.from_id(w) for w in workload_ids], ctx.cfg.privacy_unit,
                           _floor_rho(ctx), ctx.settings.strength_candidates))


def record_strength_floor(ctx: RunContext, table: list[tuple[int, list[float]]]) -> dict:
    """The floor from the played states' errors (``engine.synthesis.strength_floor``), kept
    in the work directory."""
    choice = floor_of(ctx.settings.strength_candidates, _floor_rho(ctx), table).to_dict()
    write_json_atomic(ctx.paths.strength_floor_path, choice)
    return choice


def strength_floor(ctx: RunContext) -> float:
    """The run's floor of the state prior strength (0 when none was simulated)."""
    path = ctx.paths.strength_floor_path
    return float(json.loads(path.read_text())["floor"]) if path.exists() else 0.0


def answer_sd(support: Support, res: NodeResult, prior: np.ndarray, workloads: list[Workload], record: Recording, prior_strength: float,
              count: NodeCount, queries: list[Workload] | None = None, extra: list[Measurement] | None = None,
              shared: SharedPrior | None = None) -> dict:
    """``answer_sd`` (the sd of every fitted cell count of the node's measured workloads — the
    given ``workloads`` and those its adaptive rounds chose, every measurement the fit used — at a
    fixed total, the error of the fit's ``prior`` estimated from the noisy answers), ``total_var``
    (the variance of the fitted total) and ``response_sd`` (how much the fit's noise moves the
    ``queries``: a PUMA's on its state's workloads), by
    ``engine.synthesis.fit_answer_sd``; kept beside the node's diagnostics for the release's
    ``intervals.parquet``. ``extra``: further measurements the fit took in (a state's PUMA sums);
    ``shared``: the response's products of the fits that share ``prior`` (a state's PUMAs)."""
    workloads = [*workloads, *(Workload.from_id(w) for w in res.diagnostics.get("adaptive", []))]
    strength = (res.diagnostics.get("prior_strength_choice") or {}).get("strength", prior_strength)  # the fit's own
    e = fit_answer_sd(support, res.weights, res.total, workloads, record, rule="map", prior_strength=strength,
                      total_sd=count.sd, size=None if count.sizes is None else (np.asarray(count.sizes[0]), count.sizes[1]),
                      queries=queries or [], prior=prior, extra=extra or [], shared=shared)
    return {"answer_sd": e.answer_sd, "total_var": e.total_var, "response_sd": e.response_sd}


@task(name="synthesize-state")
def state_update_task(ctx: RunContext, state: int, households: int, workload_ids: list[str],
                      size_estimate: SizeEstimate | None = None, households_sd: float = 0.0,
                      pumas: list[tuple[int, int]] | None = None, puma_workload_ids: list[str] | None = None,
                      completed_ids: list[str] | None = None) -> str:
    """One state's posterior (``engine.synthesis.fit_state``) on the worker's cached public
    support, persisted with its diagnostics, the σ of everything it measured and its error
    estimates. ``households``: the state's DP household count with its noise sd
    ``households_sd``; ``size_estimate``: its count-of-counts size histogram, when that stage ran;
    ``pumas`` (every PUMA of the state) and ``puma_workload_ids``: the PUMA level's measurements,
    whose sums the state's fit takes in; ``completed_ids``: the workloads the pair completion added."""
    node = (int(state),)
    out = ctx.paths.node_path("state_posterior", node_key(node))
    if out.exists():
        return str(out)
    s = ctx.settings
    selection = WorkloadSelection([Workload.from_id(w) for w in workload_ids], [Workload.from_id(w) for w in puma_workload_ids or []], {},
                                  completed=[Workload.from_id(w) for w in completed_ids or []])
    count = NodeCount(households, households_sd, size_estimate)
    fit = fit_state(ctx.session(), state, cached_support(ctx.public_npz), lambda flips: cached_widened(ctx.public_npz, flips), selection, count,
                    s, pumas=[tuple(n) for n in pumas or []], strength_floor=strength_floor(ctx))
    res = fit.result
    # the flips whose copies the posterior's support holds: its PUMAs live on the same support
    save_npz_atomic(out, lambda f: np.savez(f, weights=res.weights, flips=np.array([fl.name for fl in fit.flips], dtype=str)))
    write_json_atomic(out.with_suffix(".json"), {"node": node_key(node), "diagnostics": res.diagnostics, "sigmas": fit.record.sigmas,
                                                 **answer_sd(fit.support, res, fit.prior, selection.state, fit.record, s.prior_strength,
                                                             count, extra=fit.sums)})
    if fit.widened:
        # a support widened by this state's flips (their codes and shares follow its own measurements)
        # seldom serves another state: its grouped workload lists would stay beside the next states' own
        fit.support.cache.forget_joints()
    return str(out)


@dataclass(frozen=True)
class PumaJob:
    """One PUMA of a batch: its node, DP household count (exact only under the declared
    invariant) with the count's noise sd, and its count-of-counts size histogram when that stage ran."""

    node: tuple[int, int]
    n_households: int
    size_estimate: SizeEstimate | None = None
    households_sd: float = 0.0

    @property
    def count(self) -> NodeCount:
        return NodeCount(self.n_households, self.households_sd, self.size_estimate)


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
    """Every PUMA of one state (``engine.synthesis.release_pumas``: the PUMA posteriors, their
    totals held to the state's count, raked to the state posterior, the households drawn), each
    PUMA's diagnostics and error estimates (``state_workload_ids``: the state's workloads, on which
    the fit's response to its noise is kept for the state's error estimates, ``tasks.intervals``)
    and households persisted. Everything after the measurements is a deterministic function of the
    stored measurements and the sampling seed, so a resumed task refits the state's PUMAs and writes
    exactly the files it had not written. One task per state keeps the orchestration's cost per
    task off the per-PUMA path. ``state_posterior`` None: the public-only baseline;
    ``support_npz``: the state's own support (H-GEM's), instead of the public one."""
    outs: dict[tuple[int, ...], Path] = {job.node: ctx.paths.node_path("synthesis", node_key(job.node)) for job in jobs}
    files = [str(outs[job.node]) for job in jobs]
    if all(o.exists() for o in outs.values()):
        write_intervals(ctx, jobs, state_posterior, files)
        return files
    s = ctx.settings
    prior: np.ndarray | None = None
    flips: tuple[Flip, ...] = ()
    if state_posterior is not None:
        z = read_npz(state_posterior)
        prior = z["weights"]
        # the state's prior took these copies in: its PUMAs live on the same support
        flips = named_flips(z["flips"].tolist(), s.prior_flips) if "flips" in z else ()
    support = cached_widened(ctx.public_npz, flips).support if flips else cached_support(support_npz or ctx.public_npz)
    baseline = prior is None
    released = release_pumas(None if baseline else ctx.session(), support, prior, [Workload.from_id(w) for w in workload_ids],
                             [(job.node, job.count) for job in jobs], s, seed,
                             targets=[] if state_posterior is None else state_targets(state_posterior),
                             balance=cached_balance(support_npz or ctx.public_npz, flips))
    queries = [Workload.from_id(w) for w in state_workload_ids or []]
    shared = None if prior is None or not queries else SharedPrior(support, prior, queries)  # every PUMA fit starts from the state posterior
    count: dict[tuple[int, ...], NodeCount] = {job.node: job.count for job in jobs}
    for fit, draw in zip(released.fits, released.draws):
        out = outs[fit.node]
        if out.exists():
            continue
        workloads = [] if baseline else [Workload.from_id(w) for w in workload_ids]
        write_json_atomic(out.with_suffix(".json"), {"node": node_key(fit.node), "diagnostics": fit.result.diagnostics,
                                                     **answer_sd(support, fit.result, fit.prior, workloads, fit.record, s.prior_strength,
                                                                 count[fit.node], queries, shared=shared)})
        save_npz_atomic(out, draw.to_npz)
    write_intervals(ctx, jobs, state_posterior, files)
    return files


def write_intervals(ctx: RunContext, jobs: list[PumaJob], state_posterior: str | None, files: list[str]) -> None:
    """The state's rows of the release's intervals for its measured marginals, from its persisted
    PUMA ``files`` and state fit (``tasks.intervals.write_state_intervals``: on the worker that drew
    them, beside the other states', rather than in publish); kept when written already."""
    out = ctx.paths.state_intervals_path(node_key((jobs[0].node[0],))) if jobs else None
    if out is not None and not out.exists():
        write_state_intervals(out, None if state_posterior is None else Path(state_posterior).with_suffix(".json"), files)


def public_only_baseline(public: HierarchicalData, private: HierarchicalData, seed: int) -> HierarchicalData:
    """The ε = 0 baseline for every PUMA of ``private`` at once (internal QA and benchmarks only:
    it uses the exact PUMA household counts)."""
    nodes, counts = unique_rows(private.geo, return_counts=True)
    parts = [place(public.take(node_rng(seed + 1, tuple(n)).integers(0, public.n_households, g)), tuple(n)) for n, g in zip(nodes, counts)]
    return HierarchicalData.concat(parts)
