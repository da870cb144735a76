"""The privacy engine: ρ-zCDP accounting, budget plans, an idempotent ledger, noise mechanisms,
a crash-safe store of noisy measurements and the private session that is the only holder of the
confidential data.

``engine.privacy`` is pure math plus explicit file paths handed in by the caller; it never
reaches for the confidential data on its own. It is the boundary the guarantee rests on, so it
depends on nothing above it: besides ``engine.errors`` (the refusals it raises) it imports only
``engine.data`` (the encoded households a session holds and the geography nodes a charge is
booked to) and ``engine.queries`` (the workloads whose sensitivity and exact answers the session
computes). No synthesis, selection or tuning module can change what is measured or charged.
"""


from engine.privacy._accountant import eps_delta_to_rho, epsilon_for_exponential_rho, exponential_mechanism_rho, rho_to_eps, sigma_for_rho
from engine.privacy._budget import BudgetPlan
from engine.privacy._file_lock import exclusive_lock, write_atomic
from engine.privacy._ledger import BudgetExceededError, PrivacyLedger
from engine.privacy._measurements import MeasurementRecord, MeasurementStore
from engine.privacy._mechanisms import discrete_gaussian, exponential_mechanism
from engine.privacy._session import PrivateSession, max_abs_error_scores

__all__ = [
    "BudgetExceededError",
    "BudgetPlan",
    "MeasurementRecord",
    "MeasurementStore",
    "PrivacyLedger",
    "PrivateSession",
    "discrete_gaussian",
    "eps_delta_to_rho",
    "epsilon_for_exponential_rho",
    "exclusive_lock",
    "exponential_mechanism",
    "exponential_mechanism_rho",
    "max_abs_error_scores",
    "rho_to_eps",
    "sigma_for_rho",
    "write_atomic",
]
