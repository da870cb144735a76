"""dprelease's engine: the mathematics of the release, usable without Prefect or a run directory.

The handful of things a user calls (a notebook runs one state's release with them;
docs/library.md shows it):

- data and domain: :class:`HierarchicalData` (households with their persons, geography codes),
  :class:`Domain`, :class:`Attribute`, :class:`Geography` (a release's declared nodes);
- workloads: :class:`Workload` (marginals at household or person level, their sensitivity per
  privacy unit), :func:`select_workloads` (from public data), :class:`Support`;
- budget and accounting: :class:`BudgetPlan` (exact ρ split), :class:`PrivacyLedger` (in memory
  with ``path=None``, or an append-only file), :class:`MeasurementStore`, :class:`PrivateSession`
  (the confidential data behind charged measurements), :func:`rho_to_eps`, :func:`eps_delta_to_rho`;
- synthesis: :func:`synthesize_node` (one node's prior update), :func:`synthesize_state` with
  :func:`state_plan` and :class:`SynthesisSettings` (one state: counts, state and PUMA updates,
  samples; the composition the pipeline's tasks run, with the settings a release config builds), :class:`AdaptiveRounds`
  (where the model is wrong, measure more), :class:`Flip` (a prior that can be wrong: public
  households with a binary attribute flipped, weighed in by the measurements), :func:`sample_households`;
- count-of-counts: :class:`Hierarchy`, :func:`run_hierarchy` (consistent household-size histograms).

H-GEM (``engine.hgem``) needs torch and is imported on its own.
"""

from engine import _thread_safe_ast
from engine.count_of_counts import Hierarchy, run_hierarchy
from engine.data import Attribute, Domain, Geography, HierarchicalData
from engine.privacy import BudgetExceededError, BudgetPlan, MeasurementStore, PrivacyLedger, PrivateSession, eps_delta_to_rho, rho_to_eps
from engine.queries import Support, Workload
from engine.synthesis import (
    AdaptiveRounds,
    Flip,
    StateRelease,
    SynthesisSettings,
    sample_households,
    select_workloads,
    state_plan,
    synthesize_node,
    synthesize_state,
)

_thread_safe_ast.install()  # every process that runs the pipeline imports engine: its threads parse one at a time

__all__ = [
    "AdaptiveRounds",
    "Attribute",
    "BudgetExceededError",
    "BudgetPlan",
    "Domain",
    "Flip",
    "Geography",
    "HierarchicalData",
    "Hierarchy",
    "MeasurementStore",
    "PrivacyLedger",
    "PrivateSession",
    "StateRelease",
    "Support",
    "SynthesisSettings",
    "Workload",
    "eps_delta_to_rho",
    "rho_to_eps",
    "run_hierarchy",
    "sample_households",
    "select_workloads",
    "state_plan",
    "synthesize_node",
    "synthesize_state",
]
