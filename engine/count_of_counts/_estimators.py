"""Per-node count-of-counts estimators (Kuo et al., VLDB 2018, Section 4 and 5.1).

Measurement and estimation are separate:

- ``*_query`` functions say WHAT to measure: they return the exact vector and its L1
  sensitivity under the given privacy unit (``"person"``: one person added or removed, the
  paper's neighbours, group count public; ``"household"``: one group added or removed with all
  its members).  The pipeline measures household sizes through ``engine.privacy._session``
  (discrete Gaussian by default, its sensitivities from ``size_counts_sensitivity``).
- ``estimate_*`` functions are pure post-processing of the NOISY vectors; they never see
  the data.  Each returns a :class:`~engine.count_of_counts._forms.RunsTable` of
  (node, size, count, variance) runs, the input of the top-down consistency.

The estimators take ``variance``, the noise variance v of one entry of the measured vector
(whatever the mechanism: 2 b² for a Laplace of scale b, σ² for a Gaussian), and give every run
the per-group variance of the paper, Section 5.1, written in v (the paper's Laplace of scale
Δ/ε has v = 2Δ²/ε²):

- Hg: a group in an isotonic block of length s gets v / s (the paper's 2 / (ε² s));
- Hc: a group of estimated size i gets 2v / max(H_hat[i], 1) (the paper's (4 / ε²) / max(H_hat[i], 1):
  a size count is the difference of two Hc entries);
- naive (not in the paper, used only as a baseline): each cell of H has variance v, spread the
  same way: v / max(H_hat[i], 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
from numpy.typing import ArrayLike

from engine.queries import PrivacyUnit

from ._forms import RunsTable, clip_histogram, h_to_hc
from ._isotonic import equal_value_blocks, isotonic_segments

__all__ = [
    "Query",
    "naive_query",
    "hc_query",
    "hg_query",
    "max_size_query",
    "k_from_noisy_max",
    "estimate_naive",
    "estimate_hc",
    "estimate_hg",
    "project_simplex",
    "largest_remainder_round",
    "runs_from_histograms",
]


@dataclass(frozen=True)
class Query:
    """An exact query answer and its L1 sensitivity (to be noised by the privacy engine)."""

    values: np.ndarray | list[np.ndarray]  # one array; for a whole level of Hg, one vector per node (ragged)
    l1_sensitivity: int


def _check_unit(unit: PrivacyUnit) -> None:
    if unit not in ("household", "person"):
        raise ValueError(f"unknown privacy unit {unit!r}; expected 'household' or 'person'")


def naive_query(H: ArrayLike, K: int, unit: PrivacyUnit) -> Query:
    """H clipped to K (length K+1; batch: last axis).  Sensitivity 2 under the person unit
    (paper, Lemma 3: one person moves one group from size i to i+/-1); 1 under the household
    unit (one group enters or leaves one cell)."""
    _check_unit(unit)
    return Query(clip_histogram(H, K), 2 if unit == "person" else 1)


def hc_query(H: ArrayLike, K: int, unit: PrivacyUnit) -> Query:
    """Hc[0..K-1] of the clipped histogram (Hc[K] = G is public under the person unit).
    Sensitivity 1 under the person unit (paper, Lemma 4: adding a person to a group of size
    i < K lowers Hc[i] by one, nothing else); K-1 under the household unit (a group of size s
    counts in Hc[s..K-1])."""
    _check_unit(unit)
    return Query(h_to_hc(clip_histogram(H, K))[..., : int(K)], 1 if unit == "person" else max(int(K) - 1, 0))


def hg_query(H: ArrayLike, K: int, unit: PrivacyUnit) -> Query:
    """Hg: the G clipped group sizes sorted ascending, ONE ENTRY PER GROUP (inherent to
    this measurement, which adds noise per group).  Sensitivity 1 under the person unit (Hay
    et al. 2010), where G is public; undefined under the household unit (adding a group changes
    the vector's length), which raises."""
    _check_unit(unit)
    if unit == "household":
        raise ValueError("Hg needs a public group count: it is not defined under the household unit (use hc or naive)")
    Hk = clip_histogram(H, K)
    return Query(np.repeat(np.arange(int(K) + 1, dtype=np.int64), Hk), 1)


def max_size_query(H: ArrayLike, unit: PrivacyUnit, max_size: int | None = None) -> Query:
    """Largest group size (0 if no groups).  Sensitivity 1 under the person unit (adding or
    removing one person changes it by at most one); ``max_size`` (the largest size a group may
    have, required) under the household unit.  Used to choose K privately."""
    _check_unit(unit)
    if unit == "person":
        sensitivity = 1
    elif max_size is None or max_size < 1:
        raise ValueError("the household unit needs max_size (the largest possible group) for this sensitivity")
    else:
        sensitivity = int(max_size)
    H = np.asarray(H, dtype=np.int64)
    nz = np.flatnonzero(H)
    return Query(np.array([int(nz[-1]) if nz.size else 0], dtype=np.int64), sensitivity)


def k_from_noisy_max(noisy_max: float, noise_sd: float) -> int:
    """K = noisy max size + 5 standard deviations of its noise (paper, Section 4.3, with the
    Laplace(1/eps_K) of sensitivity 1: ``noise_sd`` = sqrt(2)/eps_K).  Always >= 1."""
    if not noise_sd > 0:
        raise ValueError("noise_sd must be positive")
    return max(1, int(math.ceil(float(np.asarray(noisy_max).ravel()[0]) + 5.0 * float(noise_sd))))


# ----------------------------------------------------------------------------------
# helpers


def project_simplex(y: ArrayLike, total: ArrayLike) -> np.ndarray:
    """Row-wise Euclidean projection onto {x >= 0, sum x = total} (the naive estimator's
    nonnegative least squares with the sum constraint), by the sort-based threshold rule
    x = max(y - tau, 0).  ``y``: (n, m) or (m,); ``total``: scalar or (n,)."""
    y = np.asarray(y, dtype=np.float64)
    one = y.ndim == 1
    Y = np.atleast_2d(y)
    n, m = Y.shape
    tot = np.broadcast_to(np.asarray(total, dtype=np.float64), (n,))
    if np.any(tot < 0):
        raise ValueError("total must be >= 0")
    u = -np.sort(-Y, axis=1)
    css = np.cumsum(u, axis=1) - tot[:, None]
    j = np.arange(1, m + 1)
    cond = u - css / j > 0
    rho = np.where(cond.any(axis=1), m - np.argmax(cond[:, ::-1], axis=1), 1)
    tau = css[np.arange(n), rho - 1] / rho
    x = np.maximum(Y - tau[:, None], 0.0)
    return np.asarray(x[0] if one else x)


def largest_remainder_round(x: ArrayLike, total: ArrayLike) -> np.ndarray:
    """Row-wise integers that sum to ``total``: floors, plus one for the cells with the
    largest fractional parts (ties: lower index first).  ``x`` must be >= 0 with row sums
    equal to ``total`` up to rounding."""
    x = np.asarray(x, dtype=np.float64)
    one = x.ndim == 1
    X = np.atleast_2d(x)
    n, m = X.shape
    tot = np.broadcast_to(np.asarray(total, dtype=np.int64), (n,))
    fl = np.floor(X + 1e-9).astype(np.int64)
    frac = X - fl
    deficit = tot - fl.sum(axis=1)
    if np.any(deficit < 0) or np.any(deficit > m):
        raise ValueError("rows do not sum to total")
    order = np.argsort(-frac, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(m)[None, :].repeat(n, axis=0), axis=1)
    out = fl + (rank < deficit[:, None])
    return np.asarray(out[0] if one else out)


def runs_from_histograms(H: ArrayLike, var_numerator: float, node_ids: ArrayLike | None = None) -> RunsTable:
    """Runs (node, size, count, var_numerator / count) of the nonzero cells of (n, K+1)
    estimated histograms (the Hc / naive per-size variance rule)."""
    H = np.atleast_2d(np.asarray(H, dtype=np.int64))
    rows, sizes = np.nonzero(H)
    counts = H[rows, sizes]
    ids = np.arange(H.shape[0]) if node_ids is None else np.asarray(node_ids, dtype=np.int64)
    return RunsTable(ids[rows], sizes, counts, var_numerator / np.maximum(counts, 1)).sorted()


def _groups(G: ArrayLike, n: int) -> np.ndarray:
    G = np.broadcast_to(np.asarray(G, dtype=np.int64), (n,)).copy()
    if np.any(G < 0):
        raise ValueError("group counts must be >= 0")
    return G


# ----------------------------------------------------------------------------------
# estimators (post-processing only)


def _check_variance(variance: float) -> float:
    v = float(variance)
    if not v > 0 or not math.isfinite(v):
        raise ValueError(f"the noise variance of one entry must be positive and finite, got {variance!r}")
    return v


@overload
def estimate_naive(noisy_h: ArrayLike, G: ArrayLike, variance: float, node_ids: ArrayLike | None = None,
                   return_histograms: Literal[False] = False) -> RunsTable: ...
@overload
def estimate_naive(noisy_h: ArrayLike, G: ArrayLike, variance: float, node_ids: ArrayLike | None = None, *,
                   return_histograms: Literal[True]) -> tuple[RunsTable, np.ndarray]: ...
def estimate_naive(noisy_h: ArrayLike, G: ArrayLike, variance: float, node_ids: ArrayLike | None = None,
                   return_histograms: bool = False) -> RunsTable | tuple[RunsTable, np.ndarray]:
    """Naive estimator (paper, Section 4.1): noisy H -> projection onto {x >= 0, sum x = G} ->
    largest-remainder rounding.  ``noisy_h``: (n, K+1) or (K+1,); ``variance``: the noise
    variance of one entry."""
    Y = np.atleast_2d(np.asarray(noisy_h, dtype=np.float64))
    G = _groups(G, Y.shape[0])
    H = largest_remainder_round(project_simplex(Y, G), G)
    runs = runs_from_histograms(H, _check_variance(variance), node_ids)
    return (runs, H) if return_histograms else runs


@overload
def estimate_hc(noisy_hc: ArrayLike, G: ArrayLike, variance: float, norm: str = "l1", node_ids: ArrayLike | None = None,
                return_histograms: Literal[False] = False) -> RunsTable: ...
@overload
def estimate_hc(noisy_hc: ArrayLike, G: ArrayLike, variance: float, norm: str = "l1", node_ids: ArrayLike | None = None, *,
                return_histograms: Literal[True]) -> tuple[RunsTable, np.ndarray]: ...
def estimate_hc(noisy_hc: ArrayLike, G: ArrayLike, variance: float, norm: str = "l1", node_ids: ArrayLike | None = None,
                return_histograms: bool = False) -> RunsTable | tuple[RunsTable, np.ndarray]:
    """Cumulative-histogram estimator (paper, Section 4.3; the default).

    ``noisy_hc``: (n, K) or (K,) noisy Hc[0..K-1], each entry of noise variance ``variance``.
    Isotonic regression with 0 <= Hc[0] <= ... <= Hc[K-1] <= G (``norm`` "l1" = median version,
    the paper's better one and our default, or "l2"), rounded, Hc[K] = G appended, differenced
    back to H.  Per-group variance 2 variance / max(H_hat[i], 1) (Section 5.1.2)."""
    v = _check_variance(variance)
    Y = np.atleast_2d(np.asarray(noisy_hc, dtype=np.float64))
    n, K = Y.shape
    G = _groups(G, n)
    fit = isotonic_segments(Y.ravel(), np.arange(n + 1, dtype=np.int64) * K, norm=norm, lower=0.0, upper=G)
    hc = np.empty((n, K + 1), dtype=np.int64)
    hc[:, :K] = np.rint(fit).reshape(n, K)
    del fit
    hc[:, K] = G
    H = np.diff(hc, axis=1, prepend=0)
    del hc
    runs = runs_from_histograms(H, 2.0 * v, node_ids)
    return (runs, H) if return_histograms else runs


def estimate_hg(noisy_hg: Sequence[ArrayLike] | np.ndarray, K: int, variance: float, norm: str = "l2",
                node_ids: ArrayLike | None = None, offsets: ArrayLike | None = None) -> RunsTable:
    """Unattributed-histogram estimator (paper, Section 4.2).

    ``noisy_hg``: one noisy vector per node (a list), or one concatenated vector with
    ``offsets`` (length n+1), each entry of noise variance ``variance``.  Each node's length is
    its (public) G.  Isotonic regression (``norm`` "l2" = PAVA, default, or "l1"), nondecreasing,
    within [0, K], rounded to the nearest integer (monotonicity is kept).  Every maximal block of
    equal fitted values of length s is one run with per-group variance variance / s
    (Section 5.1.1)."""
    v = _check_variance(variance)
    if offsets is None:
        parts = [np.asarray(x, dtype=np.float64).ravel() for x in noisy_hg]
        offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
        y = np.concatenate(parts) if parts else np.zeros(0)
    else:
        y = np.asarray(noisy_hg, dtype=np.float64)
        offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size - 1
    fit = isotonic_segments(y, offsets, norm=norm, lower=0.0, upper=float(K))
    starts, lens = equal_value_blocks(fit, offsets)
    seg = np.searchsorted(offsets, starts, side="right") - 1
    ids = np.arange(n) if node_ids is None else np.asarray(node_ids, dtype=np.int64)
    sizes = np.clip(np.rint(fit[starts]), 0, K).astype(np.int64)
    return RunsTable(ids[seg], sizes, lens, v / lens).coalesced()
