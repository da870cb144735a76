"""The privacy engine: ρ-zCDP accounting, budget plans, an idempotent ledger, noise mechanisms
and a crash-safe store of noisy measurements.

``engine.privacy`` is pure math plus explicit file paths handed in by the caller; it never
reaches for the confidential data on its own.
"""

from engine.privacy.accountant import (
    eps_delta_to_rho,
    exponential_mechanism_rho,
    gaussian_rho,
    parallel,
    permute_and_flip_rho,
    pure_dp_rho,
    rho_to_eps,
    sequential,
    sigma_for_rho,
)
from engine.privacy.budget import BudgetPlan
from engine.privacy.ledger import BudgetExceededError, Charge, PrivacyLedger

__all__ = [
    "BudgetExceededError",
    "BudgetPlan",
    "Charge",
    "PrivacyLedger",
    "eps_delta_to_rho",
    "exponential_mechanism_rho",
    "gaussian_rho",
    "parallel",
    "permute_and_flip_rho",
    "pure_dp_rho",
    "rho_to_eps",
    "sequential",
    "sigma_for_rho",
]
