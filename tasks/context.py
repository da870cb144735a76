"""The run's context, built once by the flow and passed to every task: the config, the paths, the
exact budget plan, the merged inputs; the ledger, the measurement store and the private session
are opened lazily, once per worker process (they hold locks and file handles, so they are never
pickled: a Dask worker reopens them on first use).

Tasks read the private input only through :meth:`RunContext.session` (a
:class:`~engine.privacy.PrivateSession`); ingestion and the internal QA are the only code
that loads the private :class:`HierarchicalData` itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import TypeVar

from engine.data import Geography, HierarchicalData
from engine.privacy import BudgetPlan, MeasurementStore, PrivacyLedger, PrivateSession
from engine.queries import PrivacyUnit
from engine.synthesis import SynthesisSettings
from schemas.release_config import ReleaseConfig
from tasks.run_context import RunPaths


def budget_plan(cfg: ReleaseConfig) -> BudgetPlan:
    """The exact ρ plan of a config (no data access). (ε, δ) budgets are converted to ρ with the
    config's conversion (CKS by default)."""
    b, a = cfg.budget, cfg.allocation
    if b.rho is not None:
        return BudgetPlan(b.rho, a.stages, a.levels, delta=b.delta)
    if b.epsilon is not None:
        return BudgetPlan.from_eps_delta(b.epsilon, b.delta, a.stages, a.levels, method=b.conversion)
    raise ValueError("the budget needs budget.rho or budget.epsilon")  # the config validator already requires one


T = TypeVar("T")
_BUILDING = threading.RLock()


def built_once(cache: Callable[..., T], *key: object) -> T:
    """``cache(*key)`` (a per-process ``lru_cache``) under one lock: a worker's threads that ask
    for the same object at once get one object, built once, instead of each building its own copy
    (a public support with its incidences is hundreds of MB)."""
    with _BUILDING:
        return cache(*key)


@lru_cache(maxsize=8)
def _ledger(path: str, cfg_json: str) -> PrivacyLedger:
    return PrivacyLedger(path, budget_plan(ReleaseConfig.model_validate_json(cfg_json)))


@lru_cache(maxsize=8)
def _store(path: str) -> MeasurementStore:
    return MeasurementStore(path)


FileKey = tuple[str, int, int, int]


def file_key(path: str) -> FileKey:
    """A file's path with its identity (inode, modification time, size): the key of a per-process
    cache of what the file holds. A worker of a long-lived Dask cluster outlives the runs it serves;
    when a run's work directory is deleted and the release rerun under the same name, its encoded
    inputs are new files at the same paths, which a cache keyed by the path alone would not see."""
    st = os.stat(path)
    return (str(path), st.st_ino, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _cached_data(key: FileKey) -> HierarchicalData:
    return HierarchicalData.from_npz(key[0])


def cached_data(npz: str) -> HierarchicalData:
    """An encoded input, loaded once per worker process (and again when the file is replaced)."""
    return built_once(_cached_data, file_key(npz))


@dataclass(frozen=True)
class RunContext:
    cfg: ReleaseConfig
    paths: RunPaths
    private_npz: str = ""
    public_npz: str = ""
    geography: Geography | None = None  # the release's declared nodes (tasks.ingest.release_geography)

    def with_inputs(self, private_npz: str, public_npz: str, geography: Geography) -> RunContext:
        return replace(self, private_npz=str(private_npz), public_npz=str(public_npz), geography=geography)

    @cached_property
    def plan(self) -> BudgetPlan:
        return budget_plan(self.cfg)

    @cached_property
    def settings(self) -> SynthesisSettings:
        """The run's synthesis settings, built once from the config (``ReleaseConfig.synthesis_settings``)."""
        return self.cfg.synthesis_settings(self.public().domain)

    def allocation(self, stage: str, level: str) -> Fraction:
        return self.plan.allocation(stage, level)

    @property
    def ledger(self) -> PrivacyLedger:
        return built_once(_ledger, str(self.paths.ledger_path), self.cfg.model_dump_json())

    @property
    def store(self) -> MeasurementStore:
        return built_once(_store, str(self.paths.measurements_dir))

    def public(self) -> HierarchicalData:
        return cached_data(self.public_npz)

    def session(self) -> PrivateSession:
        """The private input behind charged measurements (one per worker process and input)."""
        if not self.private_npz or self.geography is None:
            raise RuntimeError("the run context has no private input yet (ingest first)")
        return built_once(_session, file_key(self.private_npz), self.cfg.privacy_unit, str(self.paths.ledger_path), str(self.paths.measurements_dir),
                        tuple(self.cfg.invariants), self.cfg.model_dump_json(), self.geography)


@lru_cache(maxsize=4)
def _session(private: FileKey, unit: PrivacyUnit, ledger_path: str, store_dir: str, invariants: tuple[str, ...], cfg_json: str,
             geography: Geography) -> PrivateSession:
    return PrivateSession(HierarchicalData.from_npz(private[0]), unit, _ledger(ledger_path, cfg_json), _store(store_dir), invariants,
                          geography=geography)


def worker_caches() -> tuple:
    """The caches a worker fills for a run (its encoded inputs, its private session)."""
    return (_session, _cached_data)


def clear_caches() -> None:
    """Empty :func:`worker_caches` (the next task that needs one rebuilds it from its file)."""
    for cache in worker_caches():
        cache.cache_clear()
