"""H-GEM synthesis of one state: the Prefect adapter of ``engine.hgem.state``.

``hgem_state_task`` runs :func:`engine.hgem.state.run_state` (the whole per-state procedure:
candidates, exact budget split, normalisers, initial measurements, adaptive rounds, sampling; see
that module) with the release's settings (``cfg.advanced.hgem``, :class:`engine.hgem.settings.HGEMSettings`)
and the private session's oracles (:func:`engine.hgem.state.session_oracles`: stage ``"hgem"``,
level ``"state"``, node ``node_key((state,))``; ρ_node = the plan's ``allocation("hgem", "state")``;
every selection and measurement charged to the ledger and persisted in the measurement store
before it is used, keys ``hgem/<node>/initial/<workload id>``, ``hgem/<node>/round-<r>/select``,
``hgem/<node>/round-<r>/<workload id>``). This module only adapts: context, paths, atomic save,
resume, logging, torch threads and Dask GPU resources.

The households are sampled with the domain's household structure (:func:`household_structure`:
exactly one householder per household, householder attributes and any-person indicators derived
from the persons; ``engine.hgem.sampling``), so that the release gate's householder check holds.

Output: ``nodes/hgem_support/ST<xx>.npz`` (the sampled households, geo (state, 0, ...)) and a
``.json`` sidecar with the settings, the budget split and the per-round diagnostics (no true
errors, only DP-derived values).

Resume: if the output exists the task returns it at once. Otherwise every selection and
measurement already on disk is reused, so a rerun after a crash charges exactly what one clean
run charges. The settings must match the first run's (same ``hgem.rounds``/``alpha``/
``initial_share``, same initial workloads, same allocation), or the ledger refuses the
differently-parameterised charges.

Device: ``engine.hgem.mixture.default_device()`` (cuda when visible). On a Dask cluster with GPU
workers, submit with ``dask.annotate(resources=gpu_resources(address))`` (see
:func:`gpu_resources`).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from prefect import task

from engine.data import Domain, node_key, read_npz
from engine.hgem.mixture import default_device
from engine.hgem.sampling import HouseholdStructure
from engine.hgem.state import run_state, session_oracles
from engine.queries import Workload
from schemas.domain_spec import load_domain_spec
from schemas.household_structure import household_structure as structure_of
from schemas.release_config import ReleaseConfig
from tasks.context import RunContext
from tasks.run_context import RunPaths, save_npz_atomic, write_json_atomic

STAGE = "hgem"
LEVEL = "state"


def _logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # no flow/task run context (e.g. ``.fn`` called directly)
        return logging.getLogger(__name__)


def household_structure(cfg: ReleaseConfig, domain: Domain) -> HouseholdStructure:
    """The release's household structure (:func:`schemas.household_structure.household_structure`
    of the config's domain spec and ``household_rules.group_quarters``) on ``domain``."""
    return structure_of(load_domain_spec(cfg.domain_path()), domain,
                        group_quarters_households=cfg.household_rules.group_quarters == "single_person_households")


@task(name="hgem-state")
def hgem_state_task(
    ctx: RunContext,
    state: int,
    households: int,
    n_samples: int,
    seed: int | None = None,
    initial_workload_ids: list[str] | None = None,
) -> str:
    """Train H-GEM on one state and sample ``n_samples`` households; returns the .npz path.

    ``households``: the state's DP household count (the group-level normaliser N_G; the private
    data are reached only through ``ctx.session()``). ``seed``: post-processing seed (generator
    initialisation and sampling); default ``cfg.sampling_seed`` or 0. Noise never uses seeds
    (OpenDP samplers, OS entropy). ``initial_workload_ids``: the state workloads chosen from public
    data (the select-workload stage's ``state`` list), measured first with ``hgem.initial_share``
    of the node's ρ; None or empty: every round adaptive.
    """
    node = node_key((int(state),))
    out = ctx.paths.node_path("hgem_support", node)
    if out.exists():
        return str(out)
    settings = ctx.cfg.advanced.hgem.settings()
    threads = torch.get_num_threads()
    if settings.torch_threads is not None and default_device().type == "cpu":
        torch.set_num_threads(int(settings.torch_threads))
    try:
        t_start = time.perf_counter()
        log = _logger()
        public, session = ctx.public(), ctx.session()
        if public.domain != session.domain:
            raise ValueError("public and private data have different domains")
        base = seed if seed is not None else (ctx.cfg.sampling_seed or 0)
        synth, fit = run_state(
            public, settings, ctx.allocation(STAGE, LEVEL), int(households),
            session_oracles(session, STAGE, LEVEL, (int(state),)), int(n_samples),
            unit=ctx.cfg.privacy_unit, state=int(state), seed=base, prior_strength=ctx.settings.prior_strength,
            initial_workloads=[Workload.from_id(i) for i in (initial_workload_ids or [])],
            structure=household_structure(ctx.cfg, public.domain),
            log=lambda msg: log.info(f"hgem {node}: {msg}"),
        )
        save_npz_atomic(out, synth.to_npz)
        write_json_atomic(out.with_suffix(".json"), {"node": node, "n_samples": int(n_samples), **fit.diagnostics(),
                                                     "seconds": time.perf_counter() - t_start})
        log.info(f"hgem {node}: {synth.n_households} households sampled in {time.perf_counter() - t_start:.1f}s")
        return str(out)
    finally:
        torch.set_num_threads(threads)


def uniform_prior(paths: RunPaths, state: int, support_npz: str) -> str:
    """A ``weights`` npz (uniform 1/n over the H-GEM samples of ``state``) in the format of the
    prior-update state posteriors, so that ``tasks.synthesize.fit_puma`` can reweight the H-GEM support per PUMA
    (post-processing only; written once, reused on resume)."""
    out = paths.node_path("hgem_prior", node_key((int(state),)))
    if not out.exists():
        n = int(read_npz(support_npz, ("group",))["group"].shape[0])
        save_npz_atomic(out, lambda f: np.savez(f, weights=np.full(n, 1.0 / max(n, 1))))
    return str(out)


# -- Dask GPU resources -------------------------------------------------------------------------
def cluster_has_gpu(address: str) -> bool:
    """Whether any worker of the Dask cluster at ``address`` declares a ``GPU`` resource."""
    from distributed import Client

    with Client(address, set_as_default=False) as client:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return any(float((w.get("resources") or {}).get("GPU", 0)) > 0 for w in workers.values())


def gpu_resources(address: str) -> dict:
    """``{"GPU": 1}`` when the cluster has GPU workers (one H-GEM task per GPU at a time), else ``{}``.

    Use with ``dask.annotate(resources=...)`` around ``hgem_state_task.submit(...)``: Prefect's
    DaskTaskRunner submits through ``distributed.Client.submit``, which merges the active
    ``dask.annotate`` annotations into the task's scheduling constraints.
    """
    return {"GPU": 1} if cluster_has_gpu(address) else {}
