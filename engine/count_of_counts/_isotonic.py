"""Isotonic (nondecreasing) regression, L2 and L1, on many independent segments at once.

Used by the Hg and Hc estimators of Kuo et al. (VLDB 2018, Sections 4.2-4.3):

- **L2**: pool-adjacent-violators (PAVA), linear time.  We call SciPy's compiled PAVA
  (:func:`scipy.optimize.isotonic_regression`, an O(n) C++ implementation) per segment;
  a segment of 10^8 entries takes about a second.
- **L1**: the "median" version.  The classic algorithm is PAV with a weighted median per
  pooled block; we use the equivalent *threshold-partitioning* algorithm, which vectorises
  over all segments at once and is O(n log V) (V = number of distinct values):

  For a threshold t, write |x - y| as the sum over thresholds of |[x >= t] - [y >= t]|
  (threshold decomposition; exact when x and y lie in the set of data values, and an
  L1 isotonic fit can always be chosen there).  For a nondecreasing x the set
  {i : x_i >= t} is a suffix [j_t, n), so every threshold is an independent 1-d problem:
  choose j minimising ``f_t(j) = sum_{i<j} w_i [y_i >= t] + sum_{i>=j} w_i [y_i < t]``.
  For j < j', ``f_t(j) - f_t(j')`` is nondecreasing in t, so the *smallest* minimiser j_t is
  nondecreasing in t (Topkis): the per-threshold suffixes are nested and together form an
  optimal isotonic fit.  We find them by bisection on the (ranked) values: every element
  carries an interval [lo, hi] of candidate ranks; elements with the same interval form a
  contiguous block (the fit is monotone); each round splits every block at the middle
  threshold with one segmented prefix-sum / argmax pass.  Because the blocks' outer
  elements are fixed on one side of the threshold, the block-local smallest minimiser is
  the global smallest minimiser, so the result is exact (checked against an LP / DP brute
  force in the tests).

Both accept box constraints ``lower <= x <= upper`` (scalar or one per segment).  For any
separable convex loss the box-constrained isotonic fit is the clipped unconstrained fit,
and for L1 clipping the *data* first is equivalent (medians commute with monotone maps).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import isotonic_regression as _scipy_pava

__all__ = [
    "isotonic_l2",
    "isotonic_l1",
    "isotonic_segments",
    "equal_value_blocks",
]


def _segments(offsets: ArrayLike, n: int) -> np.ndarray:
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must be nondecreasing, from 0 to len(y)")
    return offsets


def _per_segment(v: ArrayLike | None, nseg: int, default: float) -> np.ndarray:
    if v is None:
        return np.full(nseg, default)
    v = np.asarray(v, dtype=np.float64)
    return np.broadcast_to(v, (nseg,)).astype(np.float64)


_L1_CHUNK = 1 << 18


def _chunk_bounds(offs: np.ndarray, target: int) -> np.ndarray:
    """Segment indices cutting ``offs`` into consecutive groups of about ``target`` elements."""
    nseg = offs.size - 1
    cuts = np.searchsorted(offs, np.arange(target, offs[-1], target), side="right") - 1
    b = np.unique(np.concatenate(([0], cuts, [nseg])))
    return b[(b >= 0) & (b <= nseg)]


def equal_value_blocks(x: ArrayLike, offsets: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start indices and lengths of maximal runs of equal values of ``x`` (never crossing a
    segment boundary).  These are the isotonic "partitions" of the paper, Section 5.1.1."""
    x = np.asarray(x)
    n = x.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = x[1:] != x[:-1]
    if offsets is not None:
        offs = _segments(offsets, n)
        new[offs[:-1][offs[:-1] < n]] = True
    starts = np.flatnonzero(new)
    return starts, np.diff(np.append(starts, n))


def isotonic_l2(y: ArrayLike, weights: ArrayLike | None = None, lower: float | None = None, upper: float | None = None) -> np.ndarray:
    """Weighted least-squares nondecreasing fit of one vector, clipped into [lower, upper]."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return y.copy()
    x: np.ndarray = _scipy_pava(y, weights=weights).x
    lo = -np.inf if lower is None else lower
    hi = np.inf if upper is None else upper
    fit: np.ndarray = np.clip(x, lo, hi)
    return fit


def _l1_core(y: np.ndarray, seg: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """Threshold-partitioning L1 isotonic fit on contiguous segments (see module doc)."""
    n = y.size
    if n == 0:
        return y.astype(np.float64)
    # (1) Pool adjacent equal values into one weighted element: some optimal fit gives
    #     equal data neighbours equal values, and the smallest-minimiser rule never splits
    #     them (their c_i have the same sign at every threshold).
    newp = np.ones(n, dtype=bool)
    newp[1:] = (y[1:] != y[:-1]) | (seg[1:] != seg[:-1])
    pstart = np.flatnonzero(newp)
    del newp
    plen = np.diff(np.append(pstart, n))
    yp, sp = y[pstart], seg[pstart]
    if w is None:
        wp = plen.astype(np.int64)
    else:
        wp = np.add.reduceat(w, pstart)
    m_all = yp.size
    # (2) Rank the values inside every segment: one global table of distinct values in
    #     which each segment owns a contiguous id range.
    order = np.lexsort((yp, sp))
    ys, ss = yp[order], sp[order]
    new = np.ones(m_all, dtype=bool)
    new[1:] = (ys[1:] != ys[:-1]) | (ss[1:] != ss[:-1])
    vals = ys[new]
    rank = np.empty(m_all, dtype=np.int64)
    rank[order] = np.cumsum(new) - 1
    del order, ys, ss, new
    # (3) Every element starts with the rank range of its segment; elements sharing an
    #     interval form contiguous blocks (the fit is monotone).
    first = np.flatnonzero(np.concatenate(([True], sp[1:] != sp[:-1])))
    flen = np.diff(np.append(first, m_all))
    lo = np.repeat(np.minimum.reduceat(rank, first), flen)
    hi = np.repeat(np.maximum.reduceat(rank, first), flen)
    idx = np.flatnonzero(lo < hi)
    while idx.size:
        l = lo[idx]
        h = hi[idx]
        r = rank[idx]
        m = idx.size
        bnew = np.ones(m, dtype=bool)
        bnew[1:] = (idx[1:] != idx[:-1] + 1) | (l[1:] != l[:-1]) | (h[1:] != h[:-1])
        bstart = np.flatnonzero(bnew)
        blen = np.diff(np.append(bstart, m))
        mid = (l + h) // 2
        up = r > mid
        wi = wp[idx]
        c = np.where(up, -wi, wi)
        # T[i] = sum of c over the block up to and including i  (= prefix T_{j=i+1})
        T = np.cumsum(c)
        T -= np.repeat(T[bstart] - c[bstart], blen)
        bmax = np.maximum.reduceat(T, bstart)
        local = np.arange(m, dtype=np.int64) - np.repeat(bstart, blen)
        firsthit = np.minimum.reduceat(np.where(T == np.repeat(bmax, blen), local, m), bstart)
        # smallest j maximising T_j over j in [0, len] (T_0 = 0): elements >= j go up.
        j = np.where(bmax <= 0, 0, firsthit + 1)
        go_up = local >= np.repeat(j, blen)
        nl = np.where(go_up, mid + 1, l)
        nh = np.where(go_up, h, mid)
        # (4) Tighten every new block's interval to the ranks present in it: the fit of a
        #     block constrained to [nl, nh] is the clipped unconstrained fit, which lies
        #     within the block's data range (and the smallest-minimiser rule agrees).
        nb = bnew.copy()
        nb[1:] |= go_up[1:] & ~go_up[:-1]
        nbs = np.flatnonzero(nb)
        nbl = np.diff(np.append(nbs, m))
        rmin = np.repeat(np.minimum.reduceat(r, nbs), nbl)
        rmax = np.repeat(np.maximum.reduceat(r, nbs), nbl)
        nl2 = np.clip(rmin, nl, nh)
        nh2 = np.clip(rmax, nl, nh)
        lo[idx] = nl2
        hi[idx] = nh2
        idx = idx[nl2 < nh2]
    return np.repeat(vals[lo], plen).astype(np.float64)


def isotonic_l1(y: ArrayLike, weights: ArrayLike | None = None, lower: float | None = None, upper: float | None = None) -> np.ndarray:
    """Weighted least-absolute-deviations nondecreasing fit of one vector in [lower, upper].

    The result takes values among the (clipped) data values, hence is integral for
    integral data (the paper's remark that the L1 fit is "mostly integral")."""
    y = np.asarray(y, dtype=np.float64)
    return isotonic_segments(y, [0, y.size], norm="l1", weights=weights, lower=lower, upper=upper)


def isotonic_segments(y: ArrayLike, offsets: ArrayLike, *, norm: str = "l2", weights: ArrayLike | None = None,
                      lower: ArrayLike | None = None, upper: ArrayLike | None = None) -> np.ndarray:
    """Nondecreasing fit of every segment ``y[offsets[k]:offsets[k+1]]`` independently.

    ``norm``: ``"l2"`` (PAVA) or ``"l1"`` (threshold partitioning, all segments vectorised).
    ``lower`` / ``upper``: scalar or one bound per segment.  ``weights``: positive case
    weights (None = all ones).
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    offs = _segments(offsets, n)
    nseg = offs.size - 1
    lo = _per_segment(lower, nseg, -np.inf)
    hi = _per_segment(upper, nseg, np.inf)
    if np.any(lo > hi):
        raise ValueError("lower bound above upper bound")
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if w is not None and (w.shape != y.shape or np.any(w <= 0)):
        raise ValueError("weights must be positive and match y")
    if n == 0:
        return y.copy()
    lens = np.diff(offs)
    if norm == "l2":
        out = np.empty(n)
        for k in np.flatnonzero(lens):
            a, b = offs[k], offs[k + 1]
            out[a:b] = _scipy_pava(y[a:b], weights=None if w is None else w[a:b]).x
        return np.clip(out, np.repeat(lo, lens), np.repeat(hi, lens))
    if norm == "l1":
        out = np.empty(n)
        # Work in chunks of whole segments of about _L1_CHUNK elements: the rounds make
        # ~30 passes over their arrays, which is much faster while they stay in cache.
        bounds = _chunk_bounds(offs, _L1_CHUNK)
        for k0, k1 in zip(bounds[:-1], bounds[1:]):
            a, b = offs[k0], offs[k1]
            if a == b:
                continue
            cl = lens[k0:k1]
            seg = np.repeat(np.arange(k1 - k0, dtype=np.int64), cl)
            yc = np.clip(y[a:b], np.repeat(lo[k0:k1], cl), np.repeat(hi[k0:k1], cl))
            out[a:b] = _l1_core(yc, seg, None if w is None else w[a:b])
        return out
    raise ValueError(f"norm must be 'l1' or 'l2', got {norm!r}")
