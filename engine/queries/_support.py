"""A weighted support of whole households: the domain on which priors live and get updated.

Both papers that use public data restrict the estimated distribution to the rows of a public
dataset instead of the full attribute universe:
- Tao et al. (prior-aware distribution estimation, §3.2): "we can narrow down the domain of q to
  the support from the prior p", and q(v) = 0 wherever p(v) = 0;
- Liu et al. (PMW-Pub, §3.2): "the approximating distribution A_t is maintained over the public
  data domain X̂ rather than X".

Here a support point is a whole public household with its persons (so household–person structure,
e.g. who lives with whom, is never invented), and a distribution is a weight vector over the
households. Repeated identical households are allowed; they behave as one point with the summed
weight under every update in ``engine.synthesis._prior_update`` (the updates are multiplicative and depend on
a household only through its incidence column).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from engine.data import HierarchicalData
from engine.queries._queries import IncidenceCache, Patterns, Workload


@dataclass(frozen=True, eq=False)
class Support:
    """Public households (``data``) with non-negative weights (``weights``, one per household).

    ``weights`` need not sum to one: they may be a distribution (the prior-update engine keeps them
    normalised) or expected counts. All supports derived with :meth:`with_weights` share one
    :class:`~engine.queries._queries.IncidenceCache`, so incidences are built once per set of households.
    """

    data: HierarchicalData
    weights: np.ndarray
    cache: IncidenceCache = field(repr=False, default=None)  # type: ignore[assignment]  # None: __post_init__ builds one, so it is never None after

    def __post_init__(self) -> None:
        w = np.ascontiguousarray(self.weights, dtype=np.float64)
        if w.shape != (self.data.n_households,):
            raise ValueError(f"weights must have shape ({self.data.n_households},), got {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be finite and non-negative")
        object.__setattr__(self, "weights", w)
        if self.cache is None:
            object.__setattr__(self, "cache", IncidenceCache(self.data))
        elif self.cache.data is not self.data:
            raise ValueError("the incidence cache belongs to other households")

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def from_data(cls, data: HierarchicalData, weights: np.ndarray | None = None) -> Support:
        """The empirical distribution of ``data`` (uniform 1/N_G per household) unless weights given."""
        if weights is None:
            n = max(data.n_households, 1)
            weights = np.full(data.n_households, 1.0 / n)
        return cls(data, weights)

    def with_weights(self, weights: np.ndarray) -> Support:
        """Same households (and incidence cache), new weights."""
        return Support(self.data, weights, self.cache)

    def uniform(self) -> Support:
        """Uniform weights over the households (MWEM's start in PMW-Pub's ablation, Fig. 8)."""
        return self.with_weights(np.full(self.data.n_households, 1.0 / max(self.data.n_households, 1)))

    # -- totals -----------------------------------------------------------------------------
    @property
    def n_support(self) -> int:
        return self.data.n_households

    @property
    def total_weight(self) -> float:
        return float(self.weights.sum())

    @property
    def n_households(self) -> float:
        """Weighted number of households Σ_h w_h."""
        return self.total_weight

    @property
    def n_persons(self) -> float:
        """Weighted number of persons Σ_h w_h · size_h."""
        return float(self.weights @ self.data.sizes)

    def normalised(self) -> Support:
        t = self.total_weight
        if t <= 0:
            raise ValueError("cannot normalise a support of zero total weight")
        return self.with_weights(self.weights / t)

    # -- queries ----------------------------------------------------------------------------
    def incidence(self, w: Workload) -> sp.csr_matrix:
        return self.cache.matrix(w)

    def patterns(self, w: Workload) -> Patterns:
        return self.cache.patterns(w)

    def prepare(self, workloads: Iterable[Workload]) -> Support:
        """Precompute incidences (and patterns) of the workloads; returns self."""
        self.cache.prepare(workloads)
        return self

    def answer(self, w: Workload, weights: np.ndarray | None = None) -> np.ndarray:
        """Weighted counts Σ_h w_h · A[:, h] (a sparse mat-vec)."""
        return self.cache.answer(w, self.weights if weights is None else weights)

    def normalised_answer(self, w: Workload, weights: np.ndarray | None = None) -> np.ndarray:
        """Counts divided by the weighted N_G (group level) or N_I (person level), as in H-GEM Table 1."""
        wt = self.weights if weights is None else np.asarray(weights, dtype=np.float64)
        counts = self.cache.answer(w, wt)
        total = wt.sum() if w.level == "group" else float(wt @ self.data.sizes)
        return counts / total if total > 0 else counts
