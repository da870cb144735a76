"""Synthesis: from public households, noisy measurements and a budget to released households.

One node's prior update (:func:`synthesize_node`: the projections and MAP fit of
``engine.queries`` driven by the adaptive rounds), one state's composition of the steps
(:func:`synthesize_state`, :func:`state_plan`, :class:`SynthesisSettings`), the workload
selection from public data, the consistency between geography levels, the balanced sampling of
households, the raking of weights and the error estimates from the published noise.

The tuning heuristics live here as private modules because they serve only this package: the
prior strength (``_prior_strength``) and its public-simulation floor (``_strength_floor``), the
state/PUMA budget split (``_budget_split``), the PUMA-level attributes kept
(``_puma_attributes``) and the flipped-household prior mixture (``_prior_mixture``).

The top of the engine's own layers: it uses ``engine.data``, ``engine.queries``,
``engine.privacy`` (the session it measures through and the accountant's conversions) and
``engine.count_of_counts`` (integer rounding and the hierarchy of the size histograms); none of
those imports it.
"""


from engine.synthesis._adaptive import AdaptiveRounds, RoundBudget, split_rounds
from engine.synthesis._balanced_sampling import BalanceTargets
from engine.synthesis._budget_split import choose_state_fraction
from engine.synthesis._calibration import Margin, rake
from engine.synthesis._household_sampling import sample_households
from engine.synthesis._level_consistency import totals_to_parent
from engine.synthesis._node import MeasureFn, NodeResult, local_measure, synthesize_node
from engine.synthesis._prior_mixture import Flip, WidenedSupport, named_flips, widen
from engine.synthesis._settings import DEFAULT_ADAPTIVE, SynthesisSettings
from engine.synthesis._state_release import (
    NodeCount,
    SizeEstimate,
    StateRelease,
    choose_puma_workloads,
    choose_workloads,
    fit_state,
    floor_rho,
    measured_counts,
    node_rng,
    release_pumas,
    state_plan,
    synthesize_state,
)
from engine.synthesis._strength_floor import play_state, played_states, simulate_strength_floor, strength_floor
from engine.synthesis._uncertainty import (
    BOOTSTRAP_REPLICATES,
    CountNoise,
    Intervals,
    Recording,
    SharedPrior,
    SizeNoise,
    combine_total,
    count_of_counts_bootstrap,
    fit_answer_sd,
    intervals,
)
from engine.synthesis._workload_selection import WorkloadSelection, select_workloads

__all__ = [
    "AdaptiveRounds",
    "BOOTSTRAP_REPLICATES",
    "BalanceTargets",
    "CountNoise",
    "DEFAULT_ADAPTIVE",
    "Flip",
    "Intervals",
    "Margin",
    "MeasureFn",
    "NodeCount",
    "NodeResult",
    "Recording",
    "RoundBudget",
    "SharedPrior",
    "SizeEstimate",
    "SizeNoise",
    "StateRelease",
    "SynthesisSettings",
    "WidenedSupport",
    "WorkloadSelection",
    "choose_puma_workloads",
    "choose_state_fraction",
    "choose_workloads",
    "combine_total",
    "count_of_counts_bootstrap",
    "fit_answer_sd",
    "fit_state",
    "floor_rho",
    "intervals",
    "local_measure",
    "measured_counts",
    "named_flips",
    "node_rng",
    "play_state",
    "played_states",
    "rake",
    "release_pumas",
    "sample_households",
    "select_workloads",
    "simulate_strength_floor",
    "split_rounds",
    "state_plan",
    "strength_floor",
    "synthesize_node",
    "synthesize_state",
    "totals_to_parent",
    "widen",
]
