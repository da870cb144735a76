"""Queries: the workloads asked of the data, their exact answers and the noisy answers fitted to.

:class:`Workload` (a hierarchical marginal at household or person level, with its sensitivity per
:data:`PrivacyUnit`) and its answers; :class:`Support` (the weighted public households a prior
lives on, with the workloads' incidence on them); the projections the prior update is built from;
:class:`Measurement` (one workload's noisy answer at one node, with its σ and ρ); and the accuracy
metrics of the papers. Depends only on ``engine.data``: the privacy package answers these
workloads on the confidential data, so queries sit below it, and synthesis fits to them above it.
"""


from engine.queries._measurement import Measurement, normalise_counts
from engine.queries._metrics import counts_by_node, k_way_workloads, node_index, query_errors, query_errors_by_level, two_way_l1, two_way_l1_by_candidate
from engine.queries._projection import SimplexMethod, entropy_projection, kl_divergence, least_relative_entropy_update, project_simplex_l1, project_to_hull_l1
from engine.queries._queries import (
    CandidateAnswers,
    IncidenceCache,
    Level,
    PrivacyUnit,
    Workload,
    answer,
    centred_gram,
    counted_person_cells,
    exact_answers,
    household_cell_pairs,
    node_answers,
    outer_in_place,
)
from engine.queries._support import Support

__all__ = [
    "CandidateAnswers",
    "IncidenceCache",
    "Level",
    "Measurement",
    "PrivacyUnit",
    "SimplexMethod",
    "Support",
    "Workload",
    "answer",
    "centred_gram",
    "counted_person_cells",
    "counts_by_node",
    "entropy_projection",
    "exact_answers",
    "household_cell_pairs",
    "k_way_workloads",
    "kl_divergence",
    "least_relative_entropy_update",
    "node_answers",
    "node_index",
    "normalise_counts",
    "project_simplex_l1",
    "outer_in_place",
    "project_to_hull_l1",
    "query_errors",
    "query_errors_by_level",
    "two_way_l1",
    "two_way_l1_by_candidate",
]
