"""Count-of-counts representations (Kuo et al., "Differentially Private Hierarchical
Count-of-Counts Histograms", VLDB 2018, Section 3).

For one node with ``G`` groups and public size cap ``K``:

- ``H``  (K+1,) int: ``H[i]`` = number of groups with exactly ``i`` entities (sizes above
  ``K`` are clipped to ``K``); ``H.sum() == G``.
- ``Hc`` (K+1,) int: cumulative form ``Hc[i] = sum_{j<=i} H[j]``; ``Hc[K] == G`` (public).
- ``Hg`` the unattributed histogram: the ``G`` group sizes sorted ascending.  It is kept as
  RUNS ``(sizes, counts)`` -- strictly increasing sizes with positive counts -- so that a node
  with 10^8 groups costs O(#distinct sizes) memory.  Only the Hg *measurement* (which adds
  noise per group) ever needs the expanded vector, see :func:`expand_runs`.

:class:`RunsTable` is the multi-node form used by the estimators and the top-down
consistency: one row per (node, size, variance) run, sorted by node then size.

The error metric is the earth mover's distance (paper, Lemma 1):
``EMD(H, H2) = sum_{i<K} |Hc[i] - H2c[i]|`` (equal group counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

__all__ = [
    "clip_sizes",
    "clip_histogram",
    "h_to_hc",
    "hc_to_h",
    "h_to_runs",
    "runs_to_h",
    "hg_to_runs",
    "runs_to_hg",
    "expand_runs",
    "emd",
    "emd_batch",
    "emd_runs",
    "RunsTable",
]


def clip_sizes(sizes: ArrayLike, K: int) -> np.ndarray:
    """Clip group sizes into ``[0, K]`` (paper, Section 4.1)."""
    return np.clip(np.asarray(sizes, dtype=np.int64), 0, int(K))


def clip_histogram(H: ArrayLike, K: int) -> np.ndarray:
    """Return ``H`` of length exactly ``K+1``: padded with zeros, or with every group of size
    ``>= K`` folded into cell ``K``.  Works on (..., n) arrays (last axis = size)."""
    H = np.asarray(H, dtype=np.int64)
    K = int(K)
    n = H.shape[-1]
    if n == K + 1:
        return H.copy()
    if n < K + 1:
        pad = [(0, 0)] * (H.ndim - 1) + [(0, K + 1 - n)]
        return np.pad(H, pad)
    out = H[..., : K + 1].copy()
    out[..., K] += H[..., K + 1 :].sum(axis=-1)
    return out


def h_to_hc(H: ArrayLike) -> np.ndarray:
    """Cumulative form along the last axis."""
    return np.cumsum(np.asarray(H, dtype=np.int64), axis=-1)


def hc_to_h(Hc: ArrayLike) -> np.ndarray:
    """Inverse of :func:`h_to_hc` (first differences, with a leading 0)."""
    Hc = np.asarray(Hc)
    return np.diff(Hc, axis=-1, prepend=np.zeros(Hc.shape[:-1] + (1,), dtype=Hc.dtype))


def h_to_runs(H: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Hg as runs: the sizes with a positive count, and those counts."""
    H = np.asarray(H, dtype=np.int64)
    sizes = np.flatnonzero(H)
    return sizes.astype(np.int64), H[sizes]


def runs_to_h(sizes: ArrayLike, counts: ArrayLike, K: int) -> np.ndarray:
    """Dense ``H`` (length K+1) from runs; sizes are clipped to ``[0, K]`` and repeated
    sizes are added up."""
    H = np.zeros(int(K) + 1, dtype=np.int64)
    np.add.at(H, clip_sizes(sizes, K), np.asarray(counts, dtype=np.int64))
    return H


def hg_to_runs(hg: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Runs of a sorted (nondecreasing) unattributed histogram."""
    hg = np.asarray(hg)
    if hg.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if np.any(hg[1:] < hg[:-1]):
        raise ValueError("Hg must be nondecreasing")
    starts = np.flatnonzero(np.concatenate(([True], hg[1:] != hg[:-1])))
    counts = np.diff(np.append(starts, hg.size))
    return hg[starts].astype(np.int64), counts.astype(np.int64)


def expand_runs(sizes: ArrayLike, counts: ArrayLike, dtype: DTypeLike = np.int64) -> np.ndarray:
    """One entry per group (the Hg vector).  O(G) memory: use only where the per-group
    vector is inherently needed (the Hg measurement, tests, reference implementations)."""
    return np.repeat(np.asarray(sizes, dtype=dtype), np.asarray(counts, dtype=np.int64))


runs_to_hg = expand_runs


def emd(H: ArrayLike, H2: ArrayLike) -> int:
    """Earth mover's distance ``sum_{i<K} |Hc[i] - H2c[i]|`` between two histograms with the
    same number of groups and the same length ``K+1`` (paper, Section 3.1, Lemma 1)."""
    H = np.asarray(H, dtype=np.int64)
    H2 = np.asarray(H2, dtype=np.int64)
    if H.shape != H2.shape:
        raise ValueError(f"shape mismatch {H.shape} vs {H2.shape}")
    if H.sum() != H2.sum():
        raise ValueError("EMD needs equal group counts")
    return int(np.abs(np.cumsum(H - H2))[:-1].sum())


def emd_batch(H: ArrayLike, H2: ArrayLike) -> np.ndarray:
    """Row-wise :func:`emd` of two (n, K+1) arrays."""
    H = np.asarray(H, dtype=np.int64)
    H2 = np.asarray(H2, dtype=np.int64)
    if H.shape != H2.shape:
        raise ValueError(f"shape mismatch {H.shape} vs {H2.shape}")
    d = np.cumsum(H - H2, axis=-1)
    if np.any(d[..., -1] != 0):
        raise ValueError("EMD needs equal group counts")
    out: np.ndarray = np.abs(d[..., :-1]).sum(axis=-1)
    return out


def emd_runs(sizes1: ArrayLike, counts1: ArrayLike, sizes2: ArrayLike, counts2: ArrayLike, K: int) -> int:
    """:func:`emd` computed on runs in O(U log U) (U = number of runs), never dense.

    Both Hc's are step functions of the size; between consecutive breakpoints the
    difference is constant, so the sum over i < K is a sum of (difference x width)."""
    s1 = clip_sizes(sizes1, K)
    s2 = clip_sizes(sizes2, K)
    c1 = np.asarray(counts1, dtype=np.int64)
    c2 = np.asarray(counts2, dtype=np.int64)
    if c1.sum() != c2.sum():
        raise ValueError("EMD needs equal group counts")
    pts = np.concatenate([s1, s2])
    delta = np.concatenate([c1, -c2])
    order = np.argsort(pts, kind="stable")
    pts, delta = pts[order], delta[order]
    cum = np.cumsum(delta)
    # cum[j] = Hc1 - Hc2 on [pts[j], pts[j+1]) (last breakpoint runs to K).
    nxt = np.append(pts[1:], K)
    width = np.minimum(nxt, K) - np.minimum(pts, K)
    return int(np.abs(cum * width).sum())


@dataclass
class RunsTable:
    """Runs of estimated group sizes for many nodes.

    Columns (equal length): ``node`` (int64 node id), ``size`` (int64), ``count`` (int64 > 0),
    ``var`` (float64, the estimated variance of the size of every group in the run, paper
    Section 5.1).  Rows are sorted by (node, size); several rows of one node may share a
    size when their variances differ (e.g. two Hg isotonic blocks that round to the same
    integer).  All groups of a row are interchangeable, which is what lets the top-down
    consistency work on runs instead of groups.
    """

    node: np.ndarray
    size: np.ndarray
    count: np.ndarray
    var: np.ndarray

    def __post_init__(self) -> None:
        self.node = np.asarray(self.node, dtype=np.int64)
        self.size = np.asarray(self.size, dtype=np.int64)
        self.count = np.asarray(self.count, dtype=np.int64)
        self.var = np.asarray(self.var, dtype=np.float64)
        n = self.node.shape[0]
        if not (self.size.shape == self.count.shape == self.var.shape == (n,)):
            raise ValueError("RunsTable columns must have equal length")

    def __len__(self) -> int:
        return int(self.node.shape[0])

    @classmethod
    def empty(cls) -> RunsTable:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, np.zeros(0))

    @classmethod
    def concat(cls, tables: list[RunsTable]) -> RunsTable:
        if not tables:
            return cls.empty()
        return cls(
            np.concatenate([t.node for t in tables]),
            np.concatenate([t.size for t in tables]),
            np.concatenate([t.count for t in tables]),
            np.concatenate([t.var for t in tables]),
        ).sorted()

    def sorted(self) -> RunsTable:
        """Sort by (node, size) (stable) and drop empty runs."""
        keep = self.count > 0
        t = RunsTable(self.node[keep], self.size[keep], self.count[keep], self.var[keep])
        order = np.lexsort((t.size, t.node))
        return RunsTable(t.node[order], t.size[order], t.count[order], t.var[order])

    def coalesced(self) -> RunsTable:
        """Sort by (node, size, var) and add up rows with identical (node, size, var)."""
        t = self
        keep = t.count > 0
        node, size, count, var = t.node[keep], t.size[keep], t.count[keep], t.var[keep]
        if node.size == 0:
            return RunsTable.empty()
        order = np.lexsort((var, size, node))
        node, size, count, var = node[order], size[order], count[order], var[order]
        new = np.ones(node.size, dtype=bool)
        new[1:] = (node[1:] != node[:-1]) | (size[1:] != size[:-1]) | (var[1:] != var[:-1])
        starts = np.flatnonzero(new)
        return RunsTable(node[starts], size[starts], np.add.reduceat(count, starts), var[starts])

    def node_slice(self, v: int) -> slice:
        lo, hi = np.searchsorted(self.node, [v, v + 1])
        return slice(int(lo), int(hi))

    def for_node(self, v: int) -> RunsTable:
        s = self.node_slice(v)
        return RunsTable(self.node[s], self.size[s], self.count[s], self.var[s])

    def group_counts(self, n_nodes: int) -> np.ndarray:
        """Number of groups per node id (length n_nodes)."""
        return np.bincount(self.node, weights=self.count, minlength=n_nodes).astype(np.int64)

    def histograms(self, node_ids: ArrayLike, K: int) -> np.ndarray:
        """Dense (len(node_ids), K+1) histograms of the given nodes (rows in that order)."""
        node_ids = np.asarray(node_ids, dtype=np.int64)
        pos = np.full(int(max(node_ids.max(initial=-1), self.node.max(initial=-1))) + 1, -1, np.int64)
        pos[node_ids] = np.arange(node_ids.size)
        W = int(K) + 1
        row = pos[self.node] if self.node.size else self.node
        m = row >= 0
        flat = row[m] * W + clip_sizes(self.size[m], K)
        # bincount adds in float64: exact for counts below 2^53
        out = np.bincount(flat, weights=self.count[m], minlength=node_ids.size * W)
        return out.astype(np.int64).reshape(node_ids.size, W)
