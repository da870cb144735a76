"""Top-level entry points the pipeline calls.

Privacy flow (Kuo et al., VLDB 2018, Algorithm 1 and Theorem 1):

1. :func:`hierarchy_queries` -- WHAT to measure: per level, the exact per-node vectors
   and their L1 sensitivity under the privacy unit (person unit, the paper's: Hc 1, Hg 1,
   naive H 2; household unit: Hc K-1, naive H 1, Hg undefined).  The budget is split over the
   levels (sequential composition); nodes of one level are disjoint (parallel
   composition), so one level's vectors are noised together at that level's ρ (or ε).
   The pipeline measures household sizes through its privacy session (discrete Gaussian by
   default, the paper's discrete Laplace as an option), charged to its ledger.
2. :func:`run_hierarchy` -- post-processing of the NOISY vectors only, given the noise
   variance of one entry per level (whatever the mechanism): per-node estimates, then top-down
   consistency, giving consistent integer histograms for every node.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from engine.queries import PrivacyUnit

from ._consistency import consistent_histograms, leaves_only, top_down
from ._estimators import Query, estimate_hc, estimate_hg, estimate_naive, hc_query, hg_query, naive_query
from ._forms import RunsTable
from ._group_counts import consistent_group_counts, inverse_variance_merge
from ._hierarchy import Hierarchy

__all__ = ["CountOfCountsResult", "estimate_level", "fit_histograms", "fit_household_counts", "hierarchy_queries", "run_hierarchy"]

METHODS = ("hc", "hg", "naive")
CONSISTENCY = ("weighted", "average", "leaves", "none")
# the noise variance of one entry per level: one for all levels, one per level in order, or by level
Variances = float | Sequence[float] | Mapping[int, float]


@dataclass
class CountOfCountsResult:
    hierarchy: Hierarchy
    K: int
    histograms: np.ndarray  # (N, K+1) int64, row = node id
    estimates: RunsTable  # independent per-node estimates (before consistency)
    final_runs: RunsTable  # runs of the leaves after consistency (all nodes for "none")

    def level(self, lv: int) -> tuple[np.ndarray, np.ndarray]:
        """(node ids, (n, K+1) histograms) of one level."""
        ids = self.hierarchy.level_range(lv)
        return ids, self.histograms[ids]

    def as_dict(self) -> dict[int, dict[Hashable, np.ndarray]]:
        """``{level: {node_key: H}}``."""
        h = self.hierarchy
        return {lv: {h.keys[i]: self.histograms[i] for i in h.level_range(lv)} for lv in range(h.n_levels)}


def _per_level(variances: Variances, n_levels: int) -> list[float]:
    if isinstance(variances, Mapping):
        var = [float(variances[lv]) for lv in range(n_levels)]
    else:
        each = np.asarray(variances, dtype=np.float64)
        var = [float(each)] * n_levels if each.ndim == 0 else [float(v) for v in each]
    if len(var) != n_levels or not all(0 < v < np.inf for v in var):
        raise ValueError(f"need one positive, finite noise variance per level ({n_levels})")
    return var


def hierarchy_queries(hierarchy: Hierarchy, histograms: ArrayLike, K: int, method: str = "hc", *, unit: PrivacyUnit) -> dict[int, Query]:
    """Exact measurements per level: ``{level: Query}``.  ``histograms``: (N, >=1) exact
    per-node H (row = node id; sizes above K are clipped).  For "hc"/"naive" the values are
    (n_level, K) / (n_level, K+1) arrays; for "hg" a list of per-node sorted size vectors
    (ONE ENTRY PER GROUP -- inherent to the Hg measurement).  Sensitivities under ``unit``."""
    out: dict[int, Query] = {}
    H = np.asarray(histograms)
    for lv in range(hierarchy.n_levels):
        ids = hierarchy.level_range(lv)
        if method == "hc":
            out[lv] = hc_query(H[ids], K, unit)
        elif method == "naive":
            out[lv] = naive_query(H[ids], K, unit)
        elif method == "hg":
            qs = [hg_query(H[i], K, unit) for i in ids]
            out[lv] = Query([np.asarray(q.values) for q in qs], max((q.l1_sensitivity for q in qs), default=0))
        else:
            raise ValueError(f"method must be one of {METHODS}")
    return out


def estimate_level(method: str, noisy: np.ndarray | Sequence[np.ndarray], G: ArrayLike, K: int, variance: float,
                   node_ids: ArrayLike | None, norm: str | None = None) -> RunsTable:
    """Independent per-node estimates of one level (post-processing of noisy vectors whose entries
    have noise variance ``variance``)."""
    if method == "hc":
        return estimate_hc(noisy, G, variance, norm=norm or "l1", node_ids=node_ids)
    if method == "naive":
        return estimate_naive(noisy, G, variance, node_ids=node_ids)
    if method == "hg":
        return estimate_hg(noisy, K, variance, norm=norm or "l2", node_ids=node_ids)
    raise ValueError(f"method must be one of {METHODS}")


def run_hierarchy(
    hierarchy: Hierarchy,
    noisy: Mapping[int, np.ndarray | Sequence[np.ndarray]],
    variances: Variances,
    *,
    K: int,
    group_counts: ArrayLike | None = None,
    method: str = "hc",
    norm: str | None = None,
    consistency: str = "weighted",
    noisy_group_counts: ArrayLike | None = None,
    group_count_variances: ArrayLike | None = None,
) -> CountOfCountsResult:
    """Consistent integer count-of-counts histograms for every node from noisy measurements.

    - ``noisy``: ``{level: measurement}`` for the nodes ``hierarchy.level_range(level)`` in
      order -- (n, K) noisy Hc for "hc", (n, K+1) noisy H for "naive", a list of noisy Hg
      vectors for "hg".
    - ``variances``: the noise variance of one entry of each level's vectors (sequence,
      mapping or scalar): 2b² for the paper's Laplace of scale b = Δ/ε, σ² for a Gaussian.
    - ``group_counts``: public G_v, (N,) per node or (n_leaves,) per leaf (summed up).  For
      "hg" it defaults to the vectors' lengths.
    - ``noisy_group_counts`` (+ ``group_count_variances``): private-G option, (N,) with NaN
      for unmeasured nodes; made consistent by exact integer least squares
      (:func:`~engine.count_of_counts._group_counts.consistent_group_counts`).  With "hg" the
      vectors' lengths must then already be those counts.
    - ``consistency``: "weighted" (top-down, inverse-variance merge; default), "average"
      (top-down, plain mean), "leaves" (leaves' estimates summed up), or "none" (the
      independent per-node estimates, NOT consistent; for evaluation).

    Returns a :class:`CountOfCountsResult` whose ``histograms[v]`` is integral, >= 0, sums to
    G_v and (except "none") equals the sum of its children's rows.
    """
    h = hierarchy
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency must be one of {CONSISTENCY}")
    K = int(K)
    var = _per_level(variances, h.n_levels)
    if noisy_group_counts is not None:
        G = consistent_group_counts(h, noisy_group_counts, group_count_variances)
    elif group_counts is not None:
        G = np.asarray(group_counts, dtype=np.int64)
        if G.shape == (h.leaves().size,):
            full = np.zeros(h.n_nodes, dtype=np.int64)
            full[h.leaves()] = G
            G = h.aggregate_up(full)
        elif G.shape != (h.n_nodes,):
            raise ValueError("group_counts must have one entry per node or per leaf")
    elif method == "hg":
        G = np.zeros(h.n_nodes, dtype=np.int64)
        for lv in range(h.n_levels):
            G[h.level_range(lv)] = [len(v) for v in noisy[lv]]
    else:
        raise ValueError("group_counts (public G_v) or noisy_group_counts is required")
    leaf = h.is_leaf()
    internal = ~leaf
    if np.any(G[internal] != h.aggregate_up(np.where(leaf, G, 0))[internal]):
        raise ValueError("group counts are not consistent (children must sum to parent)")
    parts = []
    for lv in range(h.n_levels):
        ids = h.level_range(lv)
        if method == "hg" and any(len(v) != g for v, g in zip(noisy[lv], G[ids])):
            raise ValueError(f"level {lv}: Hg vector lengths differ from the group counts")
        parts.append(estimate_level(method, noisy[lv], G[ids], K, var[lv], ids, norm))
    est = RunsTable.concat(parts)
    if consistency == "none":
        H = est.histograms(np.arange(h.n_nodes), K)
        return CountOfCountsResult(h, K, H, est, est)
    if consistency == "leaves":
        final = leaves_only(h, est)
    else:
        final = top_down(h, est, K, merge=consistency)
    return CountOfCountsResult(h, K, consistent_histograms(h, final, K), est, final)


def fit_household_counts(h: Hierarchy, measured: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(G, sd) per node from noisy counts alone (``measured``: (values, variances) pairs, NaN
    off their level): merged by inverse variance, then the nonnegative integer, consistent
    least-squares fit. Post-processing only (also rerun by the count-of-counts bootstrap)."""
    noisy, var = inverse_variance_merge([v for v, _ in measured], [s for _, s in measured])
    G = consistent_group_counts(h, noisy, np.where(np.isnan(var), 1.0, var))
    return G, np.sqrt(np.where(np.isnan(var), np.inf, var))


def fit_histograms(h: Hierarchy, at_least: dict[int, np.ndarray], G: np.ndarray, variances: list[float], K: int,
                   consistency: str) -> np.ndarray:
    """The consistent (N, K+1) count-of-counts histograms from the noisy households of size ≥ k
    per level (``at_least``), their noise variance per level (``variances``: that of G's entry, which
    bounds every at-least entry's) and the consistent household counts ``G``: Hc estimated per node
    and made consistent top-down (post-processing only; also rerun by the bootstrap)."""
    # Hc[i] = households of size ≤ i = G − households of size ≥ i+1, i = 0..K−1
    hc = {lv: G[h.level_range(lv), None] - at_least[lv] for lv in at_least}
    return run_hierarchy(h, hc, variances, K=K, method="hc", consistency=consistency, group_counts=G).histograms
