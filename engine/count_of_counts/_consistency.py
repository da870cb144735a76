"""Top-down consistency for hierarchical count-of-counts (Kuo et al., VLDB 2018, Section 5).

Every node's histogram is estimated independently (Section 4) and turned into runs of
(size, count, variance).  From the root down, for each parent p and its children:

1. **Optimal matching** (Section 5.2, Algorithm 2, Lemma 5).  Match the j-th smallest group
   of p with the j-th smallest group of the union of the children.  On runs this is a
   two-pointer merge of the parent's cumulative run boundaries with the children's
   cumulative *size-class* boundaries (a size class = all children's groups of one size):
   every elementary interval between consecutive boundaries is a "piece" pairing one parent
   run with one size class.  When a class is matched to a parent run only in part, its
   groups are split between the children in proportion to their (remaining) counts,
   rounded by largest remainder (paper, footnote 10), piece by piece in size order.
   All parents of one level are processed together; cost O(U log U) for U runs, independent
   of the number of groups.
2. **Merge** (Section 5.3).  A matched pair carries two estimates (s_p, v_p), (s_c, v_c) of
   one group's size.  ``"weighted"``: inverse-variance mean s = (s_p/v_p + s_c/v_c) /
   (1/v_p + 1/v_c), variance 1/(1/v_p + 1/v_c); ``"average"``: plain mean (baseline), with
   variance (v_p + v_c)/4.  The size is rounded (half to even) and clipped into [0, K].
3. Recurse with the children's updated runs.  The leaves' runs are the answer; every upper
   node's histogram is the sum of its leaves' (:meth:`Hierarchy.aggregate_up`), so
   integrality, non-negativity, sum = G_v and consistency hold by construction.

``leaves_only`` is the baseline that uses only the leaves' own estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._forms import RunsTable
from ._hierarchy import Hierarchy

__all__ = ["Matching", "match_runs", "merge_matching", "top_down", "leaves_only", "consistent_histograms"]


@dataclass
class Matching:
    """Matched pieces: ``count`` groups of child run ``child_entry`` (row of the child
    table as passed) matched to groups of parent run ``parent_entry`` (row of the parent
    table)."""

    parent_entry: np.ndarray
    child_entry: np.ndarray
    count: np.ndarray

    def cost(self, parent: RunsTable, child: RunsTable) -> int:
        """Sum over matched groups of |parent size - child size|."""
        return int((self.count * np.abs(parent.size[self.parent_entry] - child.size[self.child_entry])).sum())


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[k], starts[k] + lens[k])."""
    tot = int(lens.sum())
    if tot == 0:
        return np.zeros(0, np.int64)
    offs = np.cumsum(lens) - lens
    return np.repeat(starts - offs, lens) + np.arange(tot, dtype=np.int64)


def match_runs(parent: RunsTable, child: RunsTable, parent_of: ArrayLike) -> Matching:
    """Optimal (least total |size difference|) perfect matching between every parent's
    groups and its children's groups, on runs.

    ``parent``: runs of the parent nodes, sorted by (node, size) (equal sizes keep their
    order).  ``child``: runs of their children (any order).  ``parent_of``: array mapping a
    child node id to its parent node id.  Every parent's group count must equal the sum of
    its children's.
    """
    parent_of = np.asarray(parent_of, dtype=np.int64)
    if len(child) == 0 and len(parent) == 0:
        z = np.zeros(0, np.int64)
        return Matching(z, z, z)
    if len(parent) > 1 and np.any(
        (np.diff(parent.node) < 0) | ((np.diff(parent.node) == 0) & (np.diff(parent.size) < 0))
    ):
        raise ValueError("parent runs must be sorted by (node, size)")
    pn_all = parent_of[child.node]
    corder = np.lexsort((child.node, child.size, pn_all))  # by parent, size, child node
    pn = pn_all[corder]
    cs = child.size[corder]
    cc = child.count[corder]
    m = cc.size
    # size classes = (parent, size)
    newc = np.ones(m, dtype=bool)
    newc[1:] = (pn[1:] != pn[:-1]) | (cs[1:] != cs[:-1])
    cstart = np.flatnonzero(newc)
    clen = np.diff(np.append(cstart, m))
    ctotal = np.add.reduceat(cc, cstart) if m else np.zeros(0, np.int64)
    cpn = pn[cstart]
    # parents with children only (leaves at this level are not matched)
    n_ids = int(max(parent.node.max(initial=-1), cpn.max(initial=-1))) + 1
    Gc = np.bincount(cpn, weights=ctotal, minlength=n_ids).astype(np.int64)
    Gp = np.bincount(parent.node, weights=parent.count, minlength=n_ids).astype(np.int64)
    has_children = np.zeros(n_ids, dtype=bool)
    has_children[cpn] = True
    prow = np.flatnonzero(has_children[parent.node])
    if not np.array_equal(Gp[has_children], Gc[has_children]):
        bad = np.flatnonzero(has_children & (Gp != Gc))[:5]
        raise ValueError(f"children's group counts do not add up to the parent's (parents {bad.tolist()})")
    p_end = np.cumsum(parent.count[prow])
    c_end = np.cumsum(ctotal)
    if p_end.size and p_end[-1] != c_end[-1]:
        raise ValueError("total group counts differ between parents and children")
    # pieces: elementary intervals of the merged boundaries (two-pointer merge)
    bnd = np.union1d(p_end, c_end)
    pstart = np.concatenate(([0], bnd[:-1]))
    amount = bnd - pstart
    piece_prun = np.searchsorted(p_end, pstart, side="right")
    piece_cls = np.searchsorted(c_end, pstart, side="right")
    # rank of a piece inside its class (pieces of a class are consecutive)
    cls_first_piece = np.searchsorted(piece_cls, np.arange(cstart.size))
    prank = np.arange(amount.size) - cls_first_piece[piece_cls]
    rem = cc.copy()
    crem = ctotal.copy()
    out_p: list[np.ndarray] = []
    out_c: list[np.ndarray] = []
    out_n: list[np.ndarray] = []
    for t in range(int(prank.max(initial=-1)) + 1):
        pcs = np.flatnonzero(prank == t)
        cls = piece_cls[pcs]
        n_t = amount[pcs]
        lens = clen[cls]
        ent = _ranges(cstart[cls], lens)
        grp = np.repeat(np.arange(pcs.size), lens)
        gstart = np.cumsum(lens) - lens
        r = rem[ent]
        R = crem[cls][grp]
        q = n_t[grp] * r
        fl = q // R
        fr = q - fl * R
        deficit = n_t - np.add.reduceat(fl, gstart)
        o = np.lexsort((ent, -fr, grp))
        pos = np.arange(ent.size) - gstart[grp[o]]
        bonus = np.zeros(ent.size, dtype=np.int64)
        bonus[o] = pos < deficit[grp[o]]
        alloc = fl + bonus
        rem[ent] -= alloc
        crem[cls] -= n_t
        keep = alloc > 0
        out_p.append(prow[piece_prun[pcs[grp[keep]]]])
        out_c.append(corder[ent[keep]])
        out_n.append(alloc[keep])
    if np.any(rem != 0):
        raise AssertionError("matching left child groups unmatched")

    def cat(xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(0, np.int64)

    return Matching(cat(out_p), cat(out_c), cat(out_n))


def merge_matching(parent: RunsTable, child: RunsTable, matching: Matching, K: int, merge: str = "weighted") -> RunsTable:
    """The children's runs after replacing each matched child estimate by the merge of the
    two estimates (Section 5.3), rounded and clipped to [0, K]."""
    sp = parent.size[matching.parent_entry].astype(np.float64)
    vp = parent.var[matching.parent_entry]
    sc = child.size[matching.child_entry].astype(np.float64)
    vc = child.var[matching.child_entry]
    if merge == "weighted":
        ip, ic = 1.0 / vp, 1.0 / vc
        v = 1.0 / (ip + ic)
        s = (sp * ip + sc * ic) * v
    elif merge == "average":
        s = 0.5 * (sp + sc)
        v = 0.25 * (vp + vc)
    else:
        raise ValueError(f"merge must be 'weighted' or 'average', got {merge!r}")
    size = np.clip(np.rint(s), 0, K).astype(np.int64)
    return RunsTable(child.node[matching.child_entry], size, matching.count, v).coalesced()


def _rows_of(runs: RunsTable, ids: np.ndarray) -> RunsTable:
    mask = np.zeros(int(max(runs.node.max(initial=-1), ids.max(initial=-1))) + 1, dtype=bool)
    mask[ids] = True
    keep = mask[runs.node] if len(runs) else np.zeros(0, bool)
    return RunsTable(runs.node[keep], runs.size[keep], runs.count[keep], runs.var[keep])


def top_down(hierarchy: Hierarchy, runs: RunsTable, K: int, merge: str = "weighted") -> RunsTable:
    """Algorithm 1 of the paper (consistency part): returns the final runs of every LEAF.

    ``runs``: the independent per-node estimates of all nodes (node ids of ``hierarchy``),
    each node's counts summing to its G_v, with Sum_children G_c = G_p."""
    runs = runs.sorted()
    current = _rows_of(runs, hierarchy.level_range(0))
    final = []
    leaf = hierarchy.is_leaf()
    for lv in range(hierarchy.n_levels - 1):
        final.append(_rows_of(current, np.flatnonzero(leaf & (hierarchy.level == lv))))
        child = _rows_of(runs, hierarchy.level_range(lv + 1))
        matching = match_runs(current, child, hierarchy.parent)
        current = merge_matching(current, child, matching, K, merge).sorted()
    final.append(current)
    return RunsTable.concat(final)


def leaves_only(hierarchy: Hierarchy, runs: RunsTable) -> RunsTable:
    """Baseline: keep only the leaves' own estimates (upper levels = their sums)."""
    return _rows_of(runs.sorted(), hierarchy.leaves())


def consistent_histograms(hierarchy: Hierarchy, leaf_runs: RunsTable, K: int) -> np.ndarray:
    """(N, K+1) integer histograms of every node: the leaves' runs, summed up the tree."""
    H = leaf_runs.histograms(np.arange(hierarchy.n_nodes), K)
    return hierarchy.aggregate_up(H)
