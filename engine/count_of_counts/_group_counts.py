"""Private group counts (beyond Kuo et al. 2018, who treat G_v as public; the paper's
Section 3 sketches this extension: noisy counts made consistent by nonnegative least
squares, "one number per region").

Input: noisy counts ĝ_v for any subset of nodes (NaN = not measured), e.g. the leaves
only, or every level with its own budget, and optional per-node variances.  Output: the
nonnegative INTEGER, tree-consistent counts g (g_parent = sum of its children's) that
minimise

    f(x) = sum_v w_v (g_v(x) - ĝ_v)^2,   w_v = 1 / var_v,   x = leaf counts in Z_{>=0},

where g_v(x) is the sum of the leaves under v.  This is solved EXACTLY:

* f is a *laminar convex* function of the leaf vector (a sum of univariate convex
  functions of sums over a laminar family of leaf sets), hence M♮-convex (Murota,
  "Discrete Convex Analysis", 2003, Sec. 6.3), and the box x >= 0 keeps it M♮-convex.
* For an M♮-convex function, x is a global minimiser iff no move x + e_i, x - e_j,
  x + e_i - e_j improves it (Murota, Thm. 6.26).  We run steepest descent over exactly these
  moves, first with step 2^k (scaling, to travel fast), then with step 1 until no improving
  move remains -- which certifies global optimality.
* The best move is found in O(N) per iteration by one bottom-up pass: for every node the
  cheapest "add s to one leaf below" / "remove s from one leaf below" path cost, and at every
  internal node the cheapest exchange between two different child subtrees (only the nodes
  strictly below the lowest common ancestor change).

(The design note's "nonnegative integer least squares over the tree".  Counts are
post-processing of the noisy measurements; the measurement itself -- one count per node,
sensitivity 1 when neighbours differ by a whole group -- belongs to the privacy engine.)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._hierarchy import Hierarchy

__all__ = ["consistent_group_counts", "inverse_variance_merge", "tree_objective"]


def tree_objective(hierarchy: Hierarchy, counts: ArrayLike, noisy: ArrayLike, weights: ArrayLike) -> float:
    """f = sum_v w_v (counts_v - noisy_v)^2 over measured nodes (weights 0 elsewhere)."""
    r = np.where(np.isnan(noisy), 0.0, np.asarray(counts, float) - np.nan_to_num(noisy))
    return float((np.asarray(weights, float) * r * r).sum())


def inverse_variance_merge(values: ArrayLike, variances: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the inverse-variance weighted mean of independent unbiased measurements and its
    variance. ``values``, ``variances``: sequences of (N,) arrays, NaN where a measurement does not
    cover the node; nodes no measurement covers stay NaN."""
    v = np.asarray(values, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    if v.shape != var.shape or v.ndim != 2:
        raise ValueError("values and variances must be equal-shaped sequences of (N,) arrays")
    ok = ~np.isnan(v)
    if np.any(var[ok] <= 0):
        raise ValueError("variances must be positive")
    w = np.where(ok, 1.0 / np.where(ok, var, 1.0), 0.0)
    wsum = w.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(wsum > 0, (w * np.nan_to_num(v)).sum(axis=0) / wsum, np.nan)
        out_var = np.where(wsum > 0, 1.0 / wsum, np.nan)
    return mean, out_var


def _group_min(vals: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per contiguous group: min, position of the first min, second-smallest value."""
    m1 = np.minimum.reduceat(vals, starts)
    local = np.arange(vals.size) - np.repeat(starts, lens)
    hit = vals == np.repeat(m1, lens)
    big = vals.size + 1
    arg = np.minimum.reduceat(np.where(hit, local, big), starts) + starts
    v2 = vals.copy()
    v2[arg] = np.inf
    m2 = np.minimum.reduceat(v2, starts)
    return m1, arg, m2


def child_groups(h: Hierarchy) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per level below the root, deepest first: (node ids of the level, the parent of each child
    group, each group's start in ids, its length); children of a parent are contiguous."""
    out = []
    for lv in range(h.n_levels - 1, 0, -1):
        ids = h.level_range(lv)
        par = h.parent[ids]
        st = np.flatnonzero(np.concatenate(([True], par[1:] != par[:-1])))
        out.append((ids, par[st], st, np.diff(np.append(st, ids.size))))
    return out


def tree_least_squares(hierarchy: Hierarchy, target: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The real-valued minimiser of Σ_v w_v (g_v − t_v)² over consistent g (every internal node
    the sum of its children), by the two-pass algorithm of Hay et al. (2010, §4, weighted):
    upward, each node's estimate from its own measurement and its children's sum, merged by
    precision; downward, each parent's final value minus its children's sum shared out in
    proportion to the children's variances (all of it to the unmeasured ones when there are
    any). ``weights`` 0: not measured. Nodes no measurement reaches get 0."""
    h = hierarchy
    w = np.asarray(weights, dtype=np.float64)
    z = np.where(w > 0, np.asarray(target, dtype=np.float64), 0.0)
    prec = w.copy()
    groups = child_groups(h)

    def variance(i: np.ndarray) -> np.ndarray:  # inf where unknown
        return np.where(prec[i] > 0, 1.0 / np.where(prec[i] > 0, prec[i], 1.0), np.inf)

    for ids, pars, st, _ in groups:  # upward, deepest level first
        var = variance(ids)
        child_prec = 1.0 / np.add.reduceat(var, st)  # 0 when a child is unknown
        total = w[pars] + child_prec
        merged = w[pars] * np.where(w[pars] > 0, target[pars], 0.0) + child_prec * np.add.reduceat(z[ids], st)
        z[pars] = np.where(total > 0, merged / np.where(total > 0, total, 1.0), 0.0)
        prec[pars] = total
    g = z.copy()
    for ids, pars, st, ln in reversed(groups):  # downward, top level first
        var = variance(ids)
        unknown = np.isinf(var)
        n_unknown = np.repeat(np.add.reduceat(unknown.astype(np.float64), st), ln)
        known_var = np.repeat(np.add.reduceat(np.where(unknown, 0.0, var), st), ln)
        share = np.where(n_unknown > 0, unknown / np.maximum(n_unknown, 1.0),
                         np.where(unknown, 0.0, var) / np.where(known_var > 0, known_var, 1.0))
        g[ids] = z[ids] + share * np.repeat(g[pars] - np.add.reduceat(z[ids], st), ln)
    return g


def consistent_group_counts(hierarchy: Hierarchy, noisy: ArrayLike, variances: ArrayLike | None = None, max_iter: int = 1_000_000) -> np.ndarray:
    """Exact nonnegative-integer, consistent weighted least-squares group counts (one per
    node, in node-id order).  ``noisy``: (N,) floats, NaN where a node was not measured.
    ``variances``: (N,) positive (default 1)."""
    h = hierarchy
    N = h.n_nodes
    noisy = np.asarray(noisy, dtype=np.float64)
    if noisy.shape != (N,):
        raise ValueError("noisy must have one entry per node")
    meas = ~np.isnan(noisy)
    var = np.ones(N) if variances is None else np.broadcast_to(np.asarray(variances, float), (N,))
    if np.any(var[meas] <= 0):
        raise ValueError("variances must be positive")
    w = np.where(meas, 1.0 / np.where(meas, var, 1.0), 0.0)
    target = np.where(meas, noisy, 0.0)
    leaf = h.is_leaf()
    leaves = np.flatnonzero(leaf)
    # start from the rounded real-valued optimum: the descent below is exact from any start (the
    # objective is M♮-convex, so a point no exchange improves is optimal), but from the rounded
    # leaves alone it needs a move per unit of disagreement between levels, O(nodes) moves of
    # O(nodes) each
    x = np.zeros(N, dtype=np.int64)  # leaf values (internal entries unused)
    x[leaves] = np.maximum(np.rint(tree_least_squares(h, target, w)[leaves]), 0).astype(np.int64)

    levels = child_groups(h)
    roots = h.level_range(0)

    def sums(xv: np.ndarray) -> np.ndarray:
        return h.aggregate_up(np.where(leaf, xv, 0))

    g = sums(x)
    resid = np.abs(g - target)[meas]
    s = 1 << int(np.ceil(np.log2(max(1.0, float(resid.max(initial=0.0)))))) if resid.size else 1
    tol = 1e-9 * max(1.0, float(w.sum()))
    it = 0
    while True:
        it += 1
        if it > max_iter:
            raise RuntimeError("group-count descent did not converge")
        r = g - target
        up = w * (2.0 * s * r + s * s)
        down = w * (-2.0 * s * r + s * s)
        down = np.where(leaf & (x < s), np.inf, down)
        up_arg = np.arange(N)
        down_arg = np.arange(N)
        best, move = 0.0, None
        for ids, pars, st, ln in levels:
            u1, ua, u2 = _group_min(up[ids], st, ln)
            d1, da, d2 = _group_min(down[ids], st, ln)
            ua_id, da_id = ids[ua], ids[da]
            # exchange at each parent between two different child subtrees
            ex = np.where(ua != da, u1 + d1, np.minimum(u1 + d2, u2 + d1))
            k = int(np.argmin(ex)) if ex.size else -1
            if k >= 0 and ex[k] < best - tol:
                if ua[k] != da[k]:
                    a, b = up_arg[ua_id[k]], down_arg[da_id[k]]
                elif u1[k] + d2[k] <= u2[k] + d1[k]:
                    a = up_arg[ua_id[k]]
                    sel = _second(down[ids][st[k] : st[k] + ln[k]], da[k] - st[k])
                    b = down_arg[ids[st[k] + sel]]
                else:
                    sel = _second(up[ids][st[k] : st[k] + ln[k]], ua[k] - st[k])
                    a = up_arg[ids[st[k] + sel]]
                    b = down_arg[da_id[k]]
                best, move = float(ex[k]), ("ex", a, b)
            up[pars] += u1
            down[pars] += d1
            up_arg[pars] = up_arg[ua_id]
            down_arg[pars] = down_arg[da_id]
        k = int(np.argmin(up[roots]))
        if up[roots][k] < best - tol:
            best, move = float(up[roots][k]), ("add", up_arg[roots[k]], -1)
        k = int(np.argmin(down[roots]))
        if down[roots][k] < best - tol:
            best, move = float(down[roots][k]), ("del", -1, down_arg[roots[k]])
        if move is None:
            if s == 1:
                break
            s //= 2
            continue
        _, a, b = move
        if a >= 0:
            x[a] += s
        if b >= 0:
            x[b] -= s
        g = sums(x)
    return g


def _second(vals: np.ndarray, exclude: int) -> int:
    v = vals.copy()
    v[exclude] = np.inf
    return int(np.argmin(v))
