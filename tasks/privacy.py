"""The run's privacy objects: budget plan from the config, the ledger and the measurement store."""

from __future__ import annotations

from engine.privacy.budget import BudgetPlan
from engine.privacy.ledger import PrivacyLedger
from engine.privacy.measurements import MeasurementStore
from schemas.release_config import ReleaseConfig
from tasks.run_context import RunPaths


def budget_plan(cfg: ReleaseConfig) -> BudgetPlan:
    """The exact ρ plan of a config (no data access). (ε, δ) budgets are converted to ρ with the
    config's conversion (CKS by default)."""
    b, a = cfg.budget, cfg.allocation
    if b.rho is not None:
        return BudgetPlan(b.rho, a.stages, a.levels, delta=b.delta)
    return BudgetPlan.from_eps_delta(b.epsilon, b.delta, a.stages, a.levels, method=b.conversion)


def open_ledger(cfg: ReleaseConfig, paths: RunPaths) -> PrivacyLedger:
    return PrivacyLedger(paths.ledger_path, budget_plan(cfg))


def measurement_store(paths: RunPaths) -> MeasurementStore:
    return MeasurementStore(paths.measurements_dir)
