"""Differentially private hierarchical count-of-counts histograms.

Implements Kuo, Chiang, Kifer et al., "Differentially Private Hierarchical Count-of-Counts
Histograms", VLDB 2018 (see /work/shared/design/count_of_counts.md): per-node naive / Hg /
Hc estimators, optimal run-based top-down matching with inverse-variance merging, and
private group counts.  Pure math: measurements (exact vectors + sensitivities) and
post-processing of noisy vectors; noise is added by ``engine.privacy``. Depends on
``engine.data`` (the geography's node keys) and ``engine.queries`` (the privacy unit) only.
"""


from engine.count_of_counts._api import fit_histograms, fit_household_counts, hierarchy_queries, run_hierarchy
from engine.count_of_counts._consistency import consistent_histograms, top_down
from engine.count_of_counts._estimators import estimate_hc, k_from_noisy_max, largest_remainder_round
from engine.count_of_counts._forms import RunsTable, emd_batch
from engine.count_of_counts._geography import geography_hierarchy, size_histograms
from engine.count_of_counts._hierarchy import Hierarchy

__all__ = [
    "Hierarchy",
    "RunsTable",
    "consistent_histograms",
    "emd_batch",
    "estimate_hc",
    "fit_histograms",
    "fit_household_counts",
    "geography_hierarchy",
    "hierarchy_queries",
    "k_from_noisy_max",
    "largest_remainder_round",
    "run_hierarchy",
    "size_histograms",
    "top_down",
]
