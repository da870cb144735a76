"""Differentially private hierarchical count-of-counts histograms.

Implements Kuo, Chiang, Kifer et al., "Differentially Private Hierarchical Count-of-Counts
Histograms", VLDB 2018 (see /work/shared/design/count_of_counts.md): per-node naive / Hg /
Hc estimators, optimal run-based top-down matching with inverse-variance merging, and
private group counts.  Pure math: measurements (exact vectors + sensitivities) and
post-processing of noisy vectors; noise is added by ``engine.privacy``.
"""

from .api import CountOfCountsResult, estimate_level, hierarchy_queries, run_hierarchy
from .consistency import Matching, consistent_histograms, leaves_only, match_runs, merge_matching, top_down
from .estimators import (
    Query,
    estimate_hc,
    estimate_hg,
    estimate_naive,
    hc_query,
    hg_query,
    k_from_noisy_max,
    largest_remainder_round,
    max_size_query,
    naive_query,
    project_simplex,
)
from .forms import (
    RunsTable,
    clip_histogram,
    emd,
    emd_batch,
    emd_runs,
    expand_runs,
    h_to_hc,
    h_to_runs,
    hc_to_h,
    hg_to_runs,
    runs_to_h,
)
from .group_counts import consistent_group_counts
from .hierarchy import Hierarchy
from .isotonic import isotonic_l1, isotonic_l2, isotonic_segments

__all__ = [
    "CountOfCountsResult",
    "Hierarchy",
    "Matching",
    "Query",
    "RunsTable",
    "clip_histogram",
    "consistent_group_counts",
    "consistent_histograms",
    "emd",
    "emd_batch",
    "emd_runs",
    "estimate_hc",
    "estimate_hg",
    "estimate_level",
    "estimate_naive",
    "expand_runs",
    "h_to_hc",
    "h_to_runs",
    "hc_query",
    "hc_to_h",
    "hg_query",
    "hg_to_runs",
    "hierarchy_queries",
    "isotonic_l1",
    "isotonic_l2",
    "isotonic_segments",
    "k_from_noisy_max",
    "largest_remainder_round",
    "leaves_only",
    "match_runs",
    "max_size_query",
    "merge_matching",
    "naive_query",
    "project_simplex",
    "run_hierarchy",
    "runs_to_h",
    "top_down",
]
