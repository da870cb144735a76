"""The release flow: ingest → select workload → count-of-counts → state synthesis (prior update
or H-GEM) → PUMA synthesis → publish → internal QA.

Stages that touch confidential data fan out geography nodes on Dask through prefect-dask
(a ``LocalCluster`` sized to the machine by default, or an existing cluster via ``dask_address`` or
Dask's ``DASK_SCHEDULER_ADDRESS``).
A stage runs only when the config asks for it (synthesizer, a positive budget share); the
manifest lists the stages that ran.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import dask
import numpy as np
import pyarrow as pa
from prefect import flow, get_run_logger, task
from prefect.context import FlowRunContext
from prefect_dask import DaskTaskRunner

from engine.data import Domain, Geography, HierarchicalData, node_key
from engine.synthesis import NodeCount, SynthesisSettings, played_states
from flows.plan import invariants_statement
from flows.preflight import preflight, uses_strength_floor, weight_totals
from schemas.data_dictionary import data_dictionary
from schemas.domain_spec import load_domain_spec
from schemas.gx_suites import expectations
from schemas.pums_reader import InputError
from schemas.release_config import ReleaseConfig, load_config
from tasks.audit import AuditLog
from tasks.context import RunContext
from tasks.count_of_counts import (
    COUNTS_STAGE,
    NodeCounts,
    count_of_counts_task,
    has_histograms,
    hierarchy_of,
    household_counts_task,
    measure_nodes_task,
    node_household_sd,
    node_households,
    node_parts,
    release_histograms,
    size_measurements,
)
from tasks.count_of_counts import STAGE as COC_STAGE
from tasks.count_of_counts import as_table as coc_as_table
from tasks.gx_gates import input_gate, release_gate
from tasks.ingest import ingest_input, read_report, release_geography, validation_record, write_validation
from tasks.intervals import count_of_counts_intervals, intervals_table, read_state_intervals
from tasks.measurements_table import measurements_table
from tasks.publish import code_version, library_versions, manifest_inputs, sha256_file, write_release
from tasks.qa import coc_emd_by_level, write_qa_report
from tasks.release_parts import ReleaseParts
from tasks.reporting import publish_artifacts, release_markdown, sync_charges
from tasks.run_binding import check_binding, run_binding, write_binding
from tasks.run_context import RunLock, RunPaths, prepare, save_npz_atomic, state_of_node_file, write_json_atomic
from tasks.synthesize import (
    PumaJob,
    choose_puma_attributes_task,
    choose_split_task,
    play_strength_floor_task,
    public_only_baseline,
    puma_batch_task,
    record_strength_floor,
    saved_strength_floor,
    select_workload_task,
    state_update_task,
)


class Progress:
    """Periodic progress line with counts and ETA for fan-out stages."""

    def __init__(self, logger, label: str, total: int, every_s: float = 2.0):
        self.logger, self.label, self.total, self.every = logger, label, total, every_s
        self.start = self.last = time.monotonic()
        self.done = 0

    def step(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every or self.done == self.total:
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("nan")
            self.logger.info(f"{self.label}: {self.done}/{self.total} done, {now - self.start:.1f}s elapsed, ETA {eta:.1f}s")
            self.last = now


def wait_all(futures: list, logger, label: str) -> list:
    from prefect.futures import as_completed

    progress = Progress(logger, label, len(futures))
    for _ in as_completed(futures):
        progress.step()
    return [f.result() for f in futures]


def share_ephemeral_prefect_api() -> None:
    """Point Dask worker processes at this process's Prefect API.

    Without a configured server, Prefect runs a temporary (ephemeral) server in this process;
    worker processes spawned later inherit ``PREFECT_API_URL`` and report to it instead of each
    starting a server of their own.
    """
    from prefect.settings import get_current_settings

    if os.environ.get("PREFECT_API_URL") or get_current_settings().api.url:
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    if server.running:
        os.environ["PREFECT_API_URL"] = server.api_url


# The environment every Dask worker process of a release runs with: the LocalCluster's through
# distributed's nanny, a remote cluster's in the ``dask worker`` commands that flows.deployment
# prints. The nanny sets MALLOC_TRIM_THRESHOLD_, which also turns off glibc's adaptive mmap
# threshold: every array above 128 KiB (a MAP fit's vectors over the patterns, a few per solver
# step) was then mapped fresh and faulted in page by page, and the kernel's time rivalled the
# arithmetic. Arrays below 4 MiB come from the heap again; larger ones (incidences, supports) are
# still mapped, and returned to the system when freed.
WORKER_ENVIRON = {"MALLOC_MMAP_THRESHOLD_": str(4 << 20)}


@contextlib.contextmanager
def dask_scheduler(address: str | None, threads_per_worker: int = 2):
    """Yield a Dask scheduler address: the given one, else Dask's own configured
    ``scheduler-address`` (the ``DASK_SCHEDULER_ADDRESS`` environment variable), else a
    LocalCluster sized to the machine (:func:`cluster_shape`)."""
    if not address:
        address = dask.config.get("scheduler-address", None)
    if address:
        yield address
        return
    import logging

    from distributed import LocalCluster

    share_ephemeral_prefect_api()
    logging.getLogger("distributed").setLevel(logging.WARNING)
    workers, threads = cluster_shape(os.cpu_count() or 1, threads_per_worker)
    # no dashboard, so no use for the workers' statistical profiler (it samples every task's thread)
    spawn_env = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in WORKER_ENVIRON.items()}
    with dask.config.set({"distributed.worker.profile.enabled": False, **spawn_env}), \
            LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, dashboard_address=None,
                         silence_logs=logging.WARNING) as cluster:
        yield cluster.scheduler_address


def cluster_shape(cpus: int, threads_per_worker: int = 2) -> tuple[int, int]:
    """(worker processes, threads per worker) of the LocalCluster on ``cpus`` cores (up to 8):
    ``threads_per_worker`` threads per process (:func:`worker_threads`), as many processes as that
    leaves of the cores."""
    cores = max(1, min(cpus, 8))
    threads = max(1, min(threads_per_worker, cores))
    return cores // threads, threads


# A worker process holds the public supports with their incidences and balance targets (the largest
# objects of a run), which its threads share. Two threads of one process still take turns at
# the interpreter lock in the fits' and draws' Python steps, a loss that grows with the states and
# PUMAs synthesized, while a second process's copy of the supports is a fixed cost in memory and in
# building them. One process per core pays where each process has this many states to synthesize
# or more (benchmarks/results/HISTORY.md: the cluster's shape measured on the scale inputs).
STATES_PER_PROCESS = 12


def release_states(cfg: ReleaseConfig) -> int:
    """The number of states a release covers, as its config tells before any file is read: the
    declared ``geography.states``, else one per private input (the Census publishes PUMS one file
    per state; a file of several states counts once)."""
    return len(cfg.geography.states) if cfg.geography.states else len(cfg.private)


def worker_threads(cfg: ReleaseConfig, cpus: int | None = None) -> int:
    """Threads per worker process of the run's own LocalCluster on ``cpus`` cores (default the
    machine's): one under H-GEM, whose state tasks set torch's process-wide thread count and may
    replay CUDA graphs (a capture fails while another thread of the process uses the GPU:
    ``docs/deployment.md``); one where every core's process would have at least
    :data:`STATES_PER_PROCESS` states (a large release); else two, sharing their process's supports."""
    if cfg.synthesizer == "hgem":
        return 1
    processes, _ = cluster_shape(cpus or os.cpu_count() or 1, 1)
    return 1 if release_states(cfg) >= STATES_PER_PROCESS * processes else 2


def drop_worker_caches(address: str) -> None:
    """Empty the per-process caches of every worker of the Dask cluster at ``address`` (run once
    the synthesis is done: publish and the internal QA read only files and the private input, none
    of the cached objects). A worker keeps the public supports with their incidences and balance
    targets (gigabytes at the default settings), the encoded inputs and the private session until
    the cluster closes, beside the stages that follow, and a long-lived cluster keeps them
    beside the runs it serves next."""
    on_workers(address, _drop_caches)


def forget_worker_joints(address: str) -> None:
    """Drop the state fits' joint incidences in every worker of the Dask cluster at ``address``
    (``tasks.synthesize.forget_joint_incidences``), once the state synthesis is done."""
    from tasks.synthesize import forget_joint_incidences

    on_workers(address, forget_joint_incidences)


def on_workers(address: str, fn: Callable[[], object]) -> None:
    """Run ``fn()`` in every worker process of the Dask cluster at ``address``."""
    from distributed import Client

    with Client(address, set_as_default=False) as client:  # the task runner's own client stays the default
        client.run(fn)


def _drop_caches() -> None:
    """In one worker process: clear the caches of :func:`drop_worker_caches` (the next task that
    needs one rebuilds it from its file) and collect the cycles that held their arrays."""
    import gc

    from tasks import context, synthesize

    synthesize.clear_caches()
    context.clear_caches()
    gc.collect()


def sampling_seed(cfg: ReleaseConfig, paths: RunPaths) -> int:
    """The post-processing sampling seed: from the config, or drawn once and kept with the run."""
    if cfg.sampling_seed is not None:
        return cfg.sampling_seed
    p = paths.run_dir / "sampling_seed.json"
    if p.exists():
        return int(json.loads(p.read_text())["seed"])
    seed = secrets.randbits(63)
    write_json_atomic(p, {"seed": seed})
    return seed


# -- stages --------------------------------------------------------------------------------
@flow(name="ingest")
def ingest_stage(cfg: ReleaseConfig, paths: RunPaths) -> list[dict]:
    logger = get_run_logger()
    jobs = [("private", i) for i in range(len(cfg.private))] + [("public", i) for i in range(len(cfg.public))]
    futures = [ingest_input.submit(cfg, paths, role, i) for role, i in jobs]
    expectations()  # the input gate's Great Expectations import (slow) while the workers read the inputs
    reports, errors = [], []
    progress = Progress(logger, "ingest", len(futures))
    for f in futures:
        f.wait()
        progress.step()
        try:
            reports.append(f.result())
        except InputError as e:
            errors.append(e)
    write_validation(paths, validation_record(reports, errors))
    if errors:
        raise InputError([i for e in errors for i in e.issues])
    gx_result = input_gate(cfg, paths, reports)
    logger.info(f"ingest: {len(reports)} inputs validated and encoded (gate results: {paths.validation_path.name}, {gx_result.name})")
    return reports


def merged(reports: list[dict], role: str) -> HierarchicalData:
    return HierarchicalData.concat([HierarchicalData.from_npz(r["encoded"]) for r in reports if r["role"] == role])


def merged_inputs(paths: RunPaths, reports: list[dict]) -> tuple[str, str]:
    """Paths of the merged private and public inputs (written once per run)."""
    out = []
    for role in ("private", "public"):
        p = paths.inputs_dir / f"{role}-merged.npz"
        if not p.exists():
            save_npz_atomic(p, merged(reports, role).to_npz)
        out.append(str(p))
    return out[0], out[1]


@flow(name="select-workload")
def select_workload_stage(paths: RunPaths, public_npz: str, settings: SynthesisSettings, prior_update: bool, sizes_measured: bool) -> dict:
    """``prior_update``: normalised workloads with the state's pairs completed (else plain counts of the selection's cliques)."""
    sel = select_workload_task(public_npz, str(paths.run_dir / "workload.json"), settings, prior_update, sizes_measured)
    get_run_logger().info(f"workload: {len(sel['state'])} state-level and {len(sel['puma'])} PUMA-level marginal workloads (from public data)")
    return sel


@flow(name="choose-synthesis-split")
def choose_split_stage(ctx: RunContext, workload: dict) -> dict:
    """The state/PUMA split of the synthesis ρ from public data only (before any measurement)."""
    choice = choose_split_task(ctx, workload["state"])
    get_run_logger().info(f"synthesis budget: state level {float(Fraction(choice['state_fraction'])):.0%} of the synthesis rho, "
                          "the PUMAs the rest (expected error simulated on the public data)")
    return choice


@flow(name="choose-prior-strength-floor")
def choose_strength_floor_stage(ctx: RunContext, workload: dict) -> dict:
    """The floor of the state prior strength from public data only (before any measurement)."""
    choice = saved_strength_floor(ctx)
    if choice is None:  # each played state on a worker (its cached public support then serves the state fits)
        states = [int(s) for s in played_states(ctx.public())]
        futures = [play_strength_floor_task.submit(ctx, s, workload["state"]) for s in states]
        choice = record_strength_floor(ctx, list(zip(states, wait_all(futures, get_run_logger(), "strength floor: played states"))))
    get_run_logger().info(f"state prior strength: at least {choice['floor']:g} of the households "
                          "(held-out error simulated on the public data)")
    return choice


@flow(name="choose-puma-attributes")
def choose_puma_attributes_stage(ctx: RunContext, workload: dict, counts_path: str) -> dict:
    """How many PUMA attributes the PUMA level's ρ carries (public data and the DP PUMA counts only)."""
    out = choose_puma_attributes_task(ctx, workload, sorted(nodes_at(counts_path, "puma").values()))
    get_run_logger().info(f"PUMA level: {len(out['explanation']['puma_attributes'])} one-way marginals "
                          f"({', '.join(out['explanation']['puma_attributes'])}; signal to noise on the public data)")
    return out


# The count stages measure every node of every level, one measurement after another (a nation's
# thousands of nodes): in up to this many groups of whole states, one task each, the workers of a
# LocalCluster (up to 8 cores) share them; a group holds at least COUNT_PART_NODES nodes, whose
# measurements take far longer than a task's overhead.
COUNT_PARTS = 8
COUNT_PART_NODES = 256


def measured_counts(ctx: RunContext, sizes: bool) -> list[NodeCounts]:
    """Every node's count measurements (with ``sizes``, the count-of-counts stage's too), one task
    per group of :func:`tasks.count_of_counts.node_parts`."""
    if ctx.geography is None:
        raise RuntimeError("the count stages need the release's geography (set after ingest: RunContext.with_inputs)")
    h = hierarchy_of(ctx.geography)
    parts = node_parts(h, min(COUNT_PARTS, h.n_nodes // COUNT_PART_NODES))
    return wait_all([measure_nodes_task.submit(ctx, ids, sizes) for ids in parts], get_run_logger(), "count measurements")


def fitted_counts(ctx: RunContext, stage: str, fit, sizes: bool) -> str:
    """The count stage's result file: the one a resumed run fitted before, else ``fit`` (a task)
    over every node's measurements (:func:`measured_counts`)."""
    out = ctx.paths.node_path(stage, "hierarchy")
    if out.exists():
        return str(out)
    return fit.submit(ctx, measured_counts(ctx, sizes)).result()


@flow(name="count-of-counts")
def count_of_counts_stage(ctx: RunContext) -> str:
    return fitted_counts(ctx, COC_STAGE, count_of_counts_task, sizes=True)


@flow(name="household-counts")
def household_counts_stage(ctx: RunContext) -> str:
    return fitted_counts(ctx, COUNTS_STAGE, household_counts_task, sizes=False)


def nodes_at(counts_path: str, level: str) -> dict[tuple[int, ...], int]:
    """{node: household count} of one level from the counts result (DP, or exact under the
    declared invariant); the geography itself is public."""
    from engine.data import node_level, parse_node_key

    out = {}
    for key, g in node_households(counts_path).items():
        node = parse_node_key(key)
        if node_level(node) == level:
            out[node] = g
    return out


def pumas_by_state(counts_path: str) -> dict[int, dict[tuple[int, int], int]]:
    """{state: {PUMA node (ST, PUMA): household count}} from the counts result (:func:`nodes_at`)."""
    out: dict[int, dict[tuple[int, int], int]] = {}
    for node, g in nodes_at(counts_path, "puma").items():
        out.setdefault(node[0], {})[(node[0], node[1])] = g
    return out


def count_sd_at(counts_path: str, level: str) -> dict[tuple[int, ...], float]:
    """{node: noise sd of its household count} of one level; 0 (the count taken as given) under
    the invariant or where no measurement of the node's own level exists."""
    from engine.data import node_level, parse_node_key

    sds = {parse_node_key(k): s for k, s in node_household_sd(counts_path).items()}
    return {n: (s if math.isfinite(s) else 0.0) for n, s in sds.items() if node_level(n) == level}


def node_counts(counts_path: str, level: str) -> dict[tuple[int, ...], NodeCount]:
    """{node: its household count as the synthesis takes it} of one level
    (:class:`engine.synthesis.NodeCount`): the DP count (exact only under the declared
    invariant), its noise sd and, when the count-of-counts stage ran, its size histogram."""
    sizes = size_measurements(counts_path, level) if has_histograms(counts_path) else {}
    sd = count_sd_at(counts_path, level)
    return {n: NodeCount(g, sd[n], sizes.get(n)) for n, g in nodes_at(counts_path, level).items()}


@flow(name="synthesize-states")
def state_stage(ctx: RunContext, counts_path: str, workload: dict) -> dict[int, str]:
    """Per state in parallel, its posterior from its own measurements, its count-of-counts size
    histogram when that stage ran and its PUMAs' measurements."""
    pumas = pumas_by_state(counts_path)
    # the largest states first: the workers finish together (longest-processing-time order)
    order = sorted(node_counts(counts_path, "state").items(), key=lambda kv: -kv[1].households)
    futures = [state_update_task.submit(ctx, st[0], c.households, workload["state"], c.sizes, c.sd, list(pumas.get(st[0], {})), workload["puma"],
                                        workload.get("completed", []))
               for st, c in order]
    return dict(zip((st[0] for st, _ in order), wait_all(futures, get_run_logger(), "state posteriors")))


@flow(name="hgem-states")
def hgem_stage(ctx: RunContext, counts_path: str, address: str, seed: int, workload: dict) -> dict[int, str]:
    """H-GEM per state (the public-selected state workloads measured first); on a cluster with GPU
    workers the tasks ask for a GPU resource."""
    from tasks.hgem import gpu_resources, hgem_state_task

    states = nodes_at(counts_path, "state")
    per_household = ctx.cfg.advanced.hgem.support_per_household
    with dask.annotate(resources=gpu_resources(address)):
        futures = [hgem_state_task.submit(ctx, st[0], g, per_household * g, seed, workload["state"]) for st, g in states.items()]
    return dict(zip((st[0] for st in states), wait_all(futures, get_run_logger(), "H-GEM states")))


@flow(name="synthesize-pumas")
def puma_stage(ctx: RunContext, counts_path: str, workload: dict | None, posteriors: dict[int, str] | None, seed: int, supports: dict[int, str] | None = None) -> list[str]:
    """Per state in parallel, its PUMAs: each one's DP household count (exact only under the declared
    invariant), its posterior updated with the count-of-counts size histogram when that stage ran,
    the state's PUMA posteriors held to the state posterior, and the sampled households (the PUMAs'
    fitted totals summing to the state's count)."""
    by_state: dict[int, list[PumaJob]] = {}
    for node, c in node_counts(counts_path, "puma").items():
        by_state.setdefault(node[0], []).append(PumaJob((node[0], node[1]), c.households, c.sizes, c.sd))
    # one task per state (its PUMAs are held together to the state posterior), the largest first
    futures = [
        puma_batch_task.submit(
            ctx, jobs, None if posteriors is None else posteriors[st], [] if workload is None else workload["puma"], seed,
            supports[st] if supports else None, None if workload is None else workload["state"],
        )
        for st, jobs in sorted(by_state.items(), key=lambda kv: -len(kv[1]))
    ]
    label = "states' PUMAs (public-only baseline)" if posteriors is None else "states' PUMA posteriors and samples"
    return [path for batch in wait_all(futures, get_run_logger(), label) for path in batch]


@flow(name="publish")
def publish_stage(ctx: RunContext, reports: list[dict], node_files: list[str], stages: list[str], workload: dict | None, coc_path: str | None, counts_path: str, seed: int) -> str:
    logger = get_run_logger()
    cfg, paths = ctx.cfg, ctx.paths
    synth = ReleaseParts.from_node_files(node_files)  # read one state at a time: the release never is in memory whole
    domain = synth.domain
    audit = AuditLog(paths.audit_path)
    sync_charges(audit, ctx.ledger)
    summary = ctx.ledger.summary()
    coc_released = release_histograms(coc_path, synth) if coc_path else None
    # the measurements table and the count-of-counts bootstrap read only the store and the released sizes: a worker
    # (the other runs the internal QA) builds them while the microdata are checked here
    tables = release_tables.submit(ctx, domain, coc_released, seed)
    marginal = read_state_intervals(sorted({paths.state_intervals_path(state_of_node_file(f)) for f in node_files}))
    manifest = {
        "release": cfg.name,
        "description": cfg.description,
        "config": cfg.model_dump(mode="json"),
        "inputs": manifest_inputs(cfg, [read_report(r) for r in reports], paths.run_dir),
        "code": code_version(),
        "libraries": library_versions(),
        "privacy_unit": cfg.privacy_unit,
        "invariants": invariants_statement(cfg),
        "geography": geography_entry(cfg, ctx.geography),
        "privacy": {
            "accounting": "rho-zCDP; sequential composition over stages and levels, parallel over disjoint nodes of one level",
            "plan": ctx.plan.to_dict(),
            "synthesis_split": synthesis_split_entry(paths),
            "ledger": summary,
            "rho": summary["total"]["spent"],
            "epsilon_delta": {"epsilon": summary["total"]["epsilon_spent_cks"], "delta": summary["total"]["delta"], "conversion": "Canonne-Kamath-Steinke 2020"},
            "samplers": "OpenDP contrib samplers (dp.enable_features('contrib')): discrete Gaussian / discrete Laplace on counts, drawing from OS entropy",
        },
        "synthesizer": {**SYNTHESIZER_DESCRIPTIONS[cfg.synthesizer], "settings": synthesizer_settings(cfg, ctx.settings),
                        **({"prior_strength_floor": strength_floor_entry(paths), "prior_mixture": prior_mixture_entry(paths)}
                           if cfg.synthesizer == "prior_update" else {}),
                        **({"puma_attributes": puma_attributes_entry(paths)} if workload is not None else {})},
        "workload": workload,
        "count_of_counts": None if coc_path is None else {
            "method": "Hc (isotonic L1), consistent top-down; its state and PUMA size histograms are fitted by the synthesis as noisy measurements",
            **cfg.advanced.count_of_counts.model_dump(), "table": "count_of_counts.parquet",
            "table_semantics": "household-size histograms of the released microdata per node (equal to it exactly; children sum to parents)"},
        "stages": stages + ["publish"],
        "validation": RELEASE_VALIDATION,
        "public_inputs_summary": [read_report(r) for r in reports if r["role"] == "public"],
        "seeds_policy": {
            "noise": "OpenDP samplers drawing from OS entropy; no seeds, never reproducible",
            "post_processing_sampling": "numpy PCG64 seeded from the run's sampling seed (kept in the internal work directory)",
        },
    }
    coc_table = coc_as_table(*coc_released) if coc_released else None
    gate = release_gate(cfg, paths, counts_path, domain)
    rules = cfg.household_rules
    dictionary = data_dictionary(load_domain_spec(cfg.domain_path()), domain, rules.oversize, rules.group_quarters)
    try:
        written = write_release(paths.release_dir, synth, manifest, count_of_counts=coc_table, measurements=lambda: tables.result()[0],
                                intervals=lambda: intervals_table(*tables.result()[1:], marginal), audit=audit, gate=gate,
                                dictionary=dictionary, weight_totals=weight_totals(cfg))
    finally:
        tables.wait()  # a refused publish leaves no task behind
    publish_artifacts(cfg.name, summary, release_markdown(written))
    logger.info(f"published {written['release_counts']['households']} synthetic households to {paths.release_dir} "
                f"({'DP household counts' if not cfg.invariants else 'invariants: ' + ', '.join(cfg.invariants)})")
    return str(paths.release_dir)


def geography_entry(cfg: ReleaseConfig, geography: Geography | None) -> dict:
    """The release's declared nodes and where they come from (public information only)."""
    if geography is None:
        raise RuntimeError("the run context has no geography yet (ingest first)")
    return {
        "states": [f"{s:02d}" for s in geography.states],
        "states_declared_by": "geography.states" if cfg.geography.states is not None else
        "the private input files (which states a release covers is its design, public by declaration)",
        "puma_list": cfg.geography.pumas,
        "pumas": [node_key(p) for p in geography.pumas],
        "nodes": "every PUMA the list gives the declared states, with or without private households; none is taken from the private records",
    }


def strength_floor_entry(paths: RunPaths) -> dict:
    """The floor of the state prior strength: the public simulation's choice with its table, or none."""
    chosen = paths.strength_floor_path
    return json.loads(chosen.read_text()) if chosen.exists() else {"method": "none (synthesis.prior_strength_floor or a fixed rule)"}


def prior_mixture_entry(paths: RunPaths) -> dict:
    """Each state's prior mixture with the flipped public households (``synthesis.prior_flips``,
    ``engine.synthesis``): the weights, their fit to the noisy answers and whether the copies
    entered the prior; empty when no flip was configured."""
    out = {}
    for f in sorted((paths.nodes_dir / "state_posterior").glob("*.json")):
        meta = json.loads(f.read_text())
        choice = meta.get("diagnostics", {}).get("prior_mixture")
        if choice is not None:
            out[meta["node"]] = choice
    return out


def puma_attributes_entry(paths: RunPaths) -> dict:
    """How many PUMA attributes were measured: the signal-to-noise rule's choice with its table."""
    return json.loads(paths.puma_attributes_path.read_text())


def synthesis_split_entry(paths: RunPaths) -> dict:
    """How the synthesis ρ was divided between the state and the PUMA level: the config's shares,
    or the public simulation's choice with its table of expected errors."""
    chosen = paths.synthesis_split_path
    return json.loads(chosen.read_text()) if chosen.exists() else {"method": "fixed by the config (allocation.stages)"}


def synthesizer_settings(cfg: ReleaseConfig, settings: SynthesisSettings) -> dict:
    """The manifest's record of the synthesizer's settings: the run's ``settings`` (the prior
    update; also the PUMA step and H-GEM's prior strength) with every default resolved, plus
    ``hgem`` under ``synthesizer: hgem``."""
    if cfg.synthesizer == "public_baseline":
        return {}
    out = settings.to_dict()
    return {**out, "hgem": cfg.advanced.hgem.settings().to_dict()} if cfg.synthesizer == "hgem" else out


RELEASE_VALIDATION = {
    "gate": "Great Expectations checkpoints over the households, persons and count_of_counts tables before publishing (schemas/release_expectations.py); a failed expectation refuses to publish",
    "result": "validation/gx_release.json",
}

SYNTHESIZER_DESCRIPTIONS = {
    "public_baseline": {
        "name": "public_baseline",
        "description": "public-only baseline (epsilon = 0): public households resampled uniformly to each PUMA's household count",
    },
    "prior_update": {
        "name": "prior_update",
        "description": "prior update (Tao et al.): public prior -> per-state posterior -> per-PUMA posterior from DP-measured marginal workloads (a state's fit also takes in its PUMAs' measurements, summed); households sampled from each PUMA posterior",
    },
    "hgem": {
        "name": "hgem",
        "description": "H-GEM at the state level (neural mixture of product distributions trained on DP measurements), its samples reweighted per PUMA by the prior update",
    },
}


# -- the release flow ------------------------------------------------------------------------
def run_identity() -> tuple[str, str]:
    """This flow run's scheduled date (UTC, YYYY-MM-DD) and short id, for a templated release name."""
    from prefect.runtime import flow_run

    start = flow_run.scheduled_start_time
    return start.strftime("%Y-%m-%d"), str(flow_run.id or "local")[:8]


@flow(name="dprelease-release")
def release_flow(config_path: str, dask_address: str | None = None, name: str | None = None) -> str:
    cfg = load_config(config_path, name=name, run=run_identity())
    binding = run_binding(cfg, preflight(cfg))  # before anything is written: every refusal that needs no record
    paths = prepare(cfg.run_dir(), cfg.release_dir())
    ctx = RunContext(cfg, paths)
    with RunLock(paths), dask_scheduler(dask_address, worker_threads(cfg)) as address:
        check_binding(paths.run_dir, binding)
        audit = AuditLog(paths.audit_path)
        resumed = bool(audit.events())
        audit.append(
            "run_resume" if resumed else "run_start",
            release=cfg.name,
            config_sha256=sha256_file(Path(config_path)),
            code=code_version().get("git_commit"),
            synthesizer=cfg.synthesizer,
            privacy_unit=cfg.privacy_unit,
            invariants=list(cfg.invariants),
            planned_rho=str(ctx.plan.total_rho),
        )
        runner = DaskTaskRunner(address=address)
        stages = []

        def stage(name, fn, *args, charges: bool = True):
            """Run a stage; a stage that can charge the ledger has its charges copied to the audit
            log. The public-only stages before the budget split is chosen do not open the ledger,
            whose file is created with the run's (resolved) plan."""
            audit.append("stage_start", stage=name)
            out = fn.with_options(task_runner=runner)(*args)
            if charges:
                sync_charges(audit, ctx.ledger)
            audit.append("stage_end", stage=name)
            stages.append(name)
            return out

        reports = stage("ingest", ingest_stage, cfg, paths, charges=False)
        write_binding(paths.run_dir, binding)
        write_json_atomic(paths.summary_path, {"inputs": [read_report(r) for r in reports]})
        seed = sampling_seed(cfg, paths)
        private_npz, public_npz = merged_inputs(paths, reports)
        ctx = ctx.with_inputs(private_npz, public_npz, release_geography(cfg, private_npz))
        workload = posteriors = coc_path = supports = None
        if cfg.synthesizer != "public_baseline":
            # the prior update's workloads are normalised, with the pairs the selection leaves out completed at the
            # state; H-GEM's mixture answers (engine.hgem.answers) are plain counts of the selection's cliques
            prior_update = cfg.synthesizer == "prior_update"
            workload = stage("select_workload", select_workload_stage, paths, ctx.public_npz, ctx.settings, prior_update,
                             cfg.allocation.stages.get("count_of_counts", 0) > 0, charges=False)
        if cfg.synthesizer == "prior_update" and cfg.allocation.synthesis_split == "public_simulation":
            split = stage("choose_synthesis_split", choose_split_stage, ctx, workload, charges=False)
            cfg = cfg.with_allocation(cfg.allocation.with_state_fraction(Fraction(split["state_fraction"])))
            ctx = replace(ctx, cfg=cfg)
        if uses_strength_floor(cfg):
            stage("choose_prior_strength_floor", choose_strength_floor_stage, ctx, workload, charges=False)
        if cfg.allocation.stages.get("count_of_counts", 0) > 0:
            counts_path = coc_path = stage("count_of_counts", count_of_counts_stage, ctx)
        else:
            counts_path = stage("household_counts", household_counts_stage, ctx)
        if workload is not None:
            workload = stage("choose_puma_attributes", choose_puma_attributes_stage, ctx, workload, counts_path, charges=False)
        if cfg.synthesizer == "prior_update":
            posteriors = stage("state_synthesis", state_stage, ctx, counts_path, workload)
            forget_worker_joints(address)
        elif cfg.synthesizer == "hgem":
            from tasks.hgem import uniform_prior

            supports = stage("hgem", hgem_stage, ctx, counts_path, address, seed, workload)
            posteriors = {st: uniform_prior(paths, st, p) for st, p in supports.items()}
        node_files = stage("puma_synthesis", puma_stage, ctx, counts_path, workload, posteriors, seed, supports)
        drop_worker_caches(address)
        # DaskTaskRunner is a TaskRunner[PrefectDaskFuture]; with_options' annotation is invariant in the future type
        release_dir, report = publish_and_qa.with_options(task_runner=runner)(  # type: ignore[arg-type]
            ctx, reports, node_files, stages, workload, coc_path, counts_path, seed)
        get_run_logger().info(f"internal QA report (confidential, not published): {report}")
        return release_dir


@flow(name="publish-and-qa")
def publish_and_qa(ctx: RunContext, reports: list[dict], node_files: list[str], stages: list[str], workload: dict | None,
                   coc_path: str | None, counts_path: str, seed: int) -> tuple[str, str]:
    """Publish on the client while the internal QA report runs on a Dask worker: both only read
    the finished node files (the workers are otherwise idle during publish). Publish runs on this
    flow's Dask task runner too, so that its own task (the release tables) goes to a worker. A
    failed publish still waits for the QA task, then raises."""
    qa = internal_qa.submit(ctx, node_files, seed, coc_path)
    run = FlowRunContext.get()
    if run is None:
        raise RuntimeError("publish_and_qa's task runner is its flow run's: call it as a flow")
    runner = run.task_runner.duplicate()  # unstarted: a flow that holds a started runner's client cannot be sent to a worker
    try:
        release_dir = publish_stage.with_options(task_runner=runner)(ctx, reports, node_files, stages, workload, coc_path, counts_path, seed)
    finally:
        qa.wait()
    return release_dir, qa.result()


@task(name="release-tables")
def release_tables(ctx: RunContext, domain: Domain, coc_released: tuple[list[str], np.ndarray, np.ndarray] | None,
                   seed: int) -> tuple[pa.Table, ...]:
    """The release's ``measurements.parquet`` table (every stored noisy measurement) and, when the
    count-of-counts stage ran, its rows of ``intervals.parquet`` (the parametric bootstrap from the
    released sizes ``coc_released``, ``tasks.count_of_counts.release_histograms``, and the stored noise)."""
    cfg = ctx.cfg
    stored = ctx.store.all()
    return (measurements_table(stored, domain),
            *([] if coc_released is None else [count_of_counts_intervals(
                *coc_released, stored, domain, cfg.advanced.count_of_counts.consistency, "puma_household_counts" in cfg.invariants, seed)]))


@task(name="internal-qa-report")
def internal_qa(ctx: RunContext, node_files: list[str], seed: int, coc_path: str | None) -> str:
    """Accuracy of the release against the confidential data, written to the work directory only
    (QA is, with ingestion, the only reader of the private data outside the private session).
    It links the release gate's Data Docs, which publish renders beside it."""
    from tasks.gx_gates import DATA_DOCS

    cfg, paths = ctx.cfg, ctx.paths
    private = HierarchicalData.from_npz(ctx.private_npz)
    release = HierarchicalData.concat([HierarchicalData.from_npz(p) for p in sorted(node_files)])
    baselines = {}
    if cfg.synthesizer != "public_baseline":
        baselines["public-only baseline"] = public_only_baseline(HierarchicalData.from_npz(ctx.public_npz), private, seed)
    coc_emd = coc_emd_by_level(release_histograms(coc_path, [release]), private) if coc_path else None
    return str(write_qa_report(paths.qa_dir, cfg.name, private, release, baselines, ctx.ledger.summary(), coc_emd,
                               docs_link=f"{DATA_DOCS}/index.html"))
