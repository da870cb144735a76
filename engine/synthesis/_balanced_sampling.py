"""Balanced draws of a node's households: the sample's low-order marginals held to the posterior's.

Releasing microdata means drawing whole households: ``n`` integer copies of support households
whose expected counts are ``n·q``. Every released marginal then carries the draw's noise on top of
the posterior's own error. Systematic sampling along the household order
(:func:`engine.synthesis._household_sampling.household_order`) removes that noise from the household
attributes' leading runs only; person attributes and their combinations keep all of it, and at
large budgets that noise is a large part of the released error (``benchmarks/results/HISTORY.md``).

A balanced sample (Deville & Tillé, "Efficient balanced sampling: the cube method", Biometrika
2004) chooses its units so that the sample's totals of auxiliary variables equal their expected
values. The auxiliary variables here are the cells of every one- and two-attribute marginal of the
domain and of the persons' three-attribute marginals (:func:`balance_workloads`): pairs of household
attributes, pairs of person attributes, a household attribute with a person attribute, person
triples and the household size with a person pair — the tables every release query is built from,
chosen by the domain alone, never by a benchmark's workload. The draw (:func:`balanced_draw`):

1. a pool of ``pool_factor · n`` households drawn systematically from q along the household order;
2. its systematic subsample of ``n`` (every ``pool_factor``-th, random start) — exactly the
   systematic draw of ``n``, the starting point;
3. an exchange search on the pool (the combinatorial-optimisation integerisation of population
   synthesis): swap chosen and unchosen pool households while the squared distance
   ``‖A c − n·A q‖²`` between the sample's balance counts and their expected values falls —
   batches of the best single swaps while a batch helps, then exact best swaps (cross term
   included) among the ``exact_candidates`` best removals and additions, as many a round as still
   help among them (their gains kept exact through their own gram), until none helps or
   ``max_rounds`` rounds (products of the pool's rows with the residual) are reached.

A state's PUMAs are drawn one after the other (:func:`balanced_draws`), each search aiming at its
expected counts less the residual the earlier PUMAs left (error diffusion): the state's marginals,
sums of its PUMAs', then carry a bounded residual instead of the PUMAs' independent ones added up.
The person triples among the balanced cells and the diffusion help together, not one without the
other (``benchmarks/results/HISTORY.md``).

Every released household is a pool household, i.e. a draw from the posterior, so the posterior's
higher-order structure is kept; the search only chooses which of the draws to keep. The result is a
function of q, n and the generator: post-processing of the DP posterior (no privacy cost), and
reproducible from the sampling seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse import _sparsetools

from engine.data import Domain, HierarchicalData, repeat_runs
from engine.queries import Workload, household_cell_pairs

__all__ = ["BalanceTargets", "balance_workloads", "balanced_draw", "balanced_draws", "systematic_positions"]


def balance_workloads(domain: Domain) -> list[Workload]:
    """Every two-attribute marginal of the domain (each one-attribute marginal is a sum of them):
    household pairs (group level), person pairs (person level, every person) and household ×
    person (person level); and the three-attribute marginals of the persons: every person triple
    and the household size with every person pair (the size is the household's defining attribute,
    which every person of the household shares). A domain with a single attribute on a side
    contributes its one-way marginal instead of pairs."""
    g = [a.name for a in domain.group]
    p = [a.name for a in domain.person]
    out = [Workload("group", pair) for pair in itertools.combinations(g, 2)] or [Workload("group", (a,)) for a in g]
    out += [Workload("person", (), pair) for pair in itertools.combinations(p, 2)] or [Workload("person", (), (a,)) for a in p]
    out += [Workload("person", (a,), (b,)) for a in g for b in p]
    out += [Workload("person", (), triple) for triple in itertools.combinations(p, 3)]
    if domain.size_attribute in g:
        out += [Workload("person", (domain.size_attribute,), pair) for pair in itertools.combinations(p, 2)]
    return out


@dataclass(frozen=True, eq=False)
class BalanceTargets:
    """The balance marginals' incidence over one set of support households: ``blocks`` (households
    × cells, CSR, one block per run of consecutive households, stacked in order: the rows) hold
    household h's counts in every cell of every workload of ``workloads``, in the smallest unsigned
    integer type that holds them (persons of one household: one byte, where float64 took eight, on
    tens of millions of entries). Built once per support (:meth:`for_data`) and shared by every node
    drawn from it; a widened support's targets (the public households, then their flipped copies)
    share the public support's block (:meth:`extended`) instead of holding it again. Every product
    with them is taken in float64, exactly as with the stacked float64 matrix."""

    workloads: tuple[Workload, ...]
    blocks: tuple[sp.csr_matrix, ...]

    @classmethod
    def for_data(cls, data: HierarchicalData, workloads: Sequence[Workload] | None = None) -> BalanceTargets:
        ws = tuple(balance_workloads(data.domain) if workloads is None else workloads)
        if not ws:
            raise ValueError("balanced sampling needs at least one balance workload")
        return cls(ws, (household_rows(data, ws),))

    def extended(self, more: HierarchicalData, originals: HierarchicalData | None = None, rows: np.ndarray | None = None) -> BalanceTargets:
        """These households followed by ``more``: the blocks kept, one block added. ``originals``:
        the first block's households, of which ``more`` holds edited copies row for row (a widened
        support's flipped copies) — of all of them, or of those at ``rows``; the cells of every
        workload that reads only attributes on which each copy equals its original are then taken
        from the original's row, not built again, and the block is the same, entry for entry."""
        if originals is None:
            return BalanceTargets(self.workloads, (*self.blocks, household_rows(more, self.workloads)))
        if originals.n_households != self.blocks[0].shape[0]:
            raise ValueError(f"originals: {originals.n_households} households for a first block of {self.blocks[0].shape[0]}")
        first = self.blocks[0]
        if rows is not None:
            originals, first = originals.take(rows), first[rows]
        if originals.n_households != more.n_households:
            raise ValueError(f"originals: {originals.n_households} households for {more.n_households} copies")
        same = unchanged_attributes(originals, more)
        reread = [w for w in self.workloads if not set(w.group_attrs) | set(w.person_attrs) <= same]
        sizes = [w.n_cells(more.domain) for w in self.workloads]
        ends = np.cumsum(sizes)
        new_cells = np.concatenate([np.arange(e - n, e) for w, n, e in zip(self.workloads, sizes, ends) if w in reread] or [np.zeros(0, np.int64)])
        kept = np.ones(self.n_cells, dtype=bool)
        kept[new_cells] = False
        block = copied_rows(first, kept)
        if reread:
            fresh = household_rows(more, reread)
            fresh.indices = new_cells[fresh.indices].astype(fresh.indices.dtype)  # each workload's cells to their place: orders kept
            fresh = sp.csr_matrix((fresh.data, fresh.indices, fresh.indptr), shape=block.shape)
            block = block + fresh  # disjoint cells: each row's entries merged in column order, no value added to another
        block.has_sorted_indices = True
        return BalanceTargets(self.workloads, (*self.blocks, block))

    def with_copies(self, originals: HierarchicalData, copies: HierarchicalData, runs: Sequence[np.ndarray]) -> BalanceTargets:
        """These targets (of ``originals``, their first block) followed by ``copies``: runs of
        edited copies of ``originals``, one copy of each household at ``runs[k]`` in run k, in order
        (a widened support's flipped copies, a run per flip: ``WidenedSupport.copies``). One block
        per run (:meth:`extended`): each run rebuilds only the cells of the attributes its own edit
        changed."""
        if copies.n_households != sum(len(r) for r in runs):
            raise ValueError(f"copies: {copies.n_households} households for runs of {[len(r) for r in runs]}")
        targets, lo = self, 0
        for rows in runs:
            rows = np.asarray(rows, dtype=np.int64)
            targets = targets.extended(copies.take(np.arange(lo, lo + rows.size)), originals, rows)
            lo += rows.size
        return targets

    @property
    def n_households(self) -> int:
        return sum(int(b.shape[0]) for b in self.blocks)

    @property
    def n_cells(self) -> int:
        return int(self.blocks[0].shape[1])

    @property
    def rows(self) -> sp.csr_matrix:
        """The blocks stacked (a copy when there are several: for inspection, not for the draws)."""
        return self.blocks[0] if len(self.blocks) == 1 else sp.vstack(self.blocks, format="csr")

    def take(self, households: np.ndarray) -> sp.csr_matrix:
        """The rows of ``households`` (in the given order) in float64: ``rows[households]``."""
        households = np.asarray(households, dtype=np.int64)
        starts = np.cumsum([0] + [int(b.shape[0]) for b in self.blocks])
        block_of = np.searchsorted(starts, households, side="right") - 1
        order = np.argsort(block_of, kind="stable")
        parts = [b[households[order][block_of[order] == i] - starts[i]] for i, b in enumerate(self.blocks)]
        return sp.vstack(parts, format="csr", dtype=np.float64)[np.argsort(order)]

    def expected(self, counts: np.ndarray) -> np.ndarray:
        """The balance counts of households weighted by ``counts`` (expected copies per household):
        ``rows.T @ counts`` in float64, the same sums in the same order (scipy's product of a CSR
        matrix's transpose runs ``csc_matvec``, which adds household after household into one
        output), taken over blocks of :data:`BLOCK` households so that only a block's counts are
        ever converted to float64 (scipy converts the whole matrix for a mixed-type product)."""
        x = np.asarray(counts, dtype=np.float64)
        if x.shape != (self.n_households,):
            raise ValueError(f"expected counts: one entry per balance household ({self.n_households}), got shape {x.shape}")
        return self.expected_many(x[:, None])[:, 0]

    def expected_many(self, counts: np.ndarray) -> np.ndarray:
        """:meth:`expected` of several count vectors at once, the columns of ``counts``
        (households × k): (cells × k), each column bit for bit :meth:`expected` of its vector
        (``csc_matvecs`` adds ``a·x[h, :]`` household after household, the same additions as
        ``csc_matvec`` per column). The rows are read and converted to float64 once for all k
        vectors: a state's PUMAs, whose draws each need their expected counts, share one pass."""
        x = np.ascontiguousarray(counts, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != self.n_households:
            raise ValueError(f"expected counts: households × vectors with {self.n_households} rows, got shape {x.shape}")
        k = x.shape[1]
        out, start = np.zeros((self.n_cells, k)), 0
        for R in self.blocks:
            for lo in range(0, R.shape[0], BLOCK):
                hi = min(lo + BLOCK, R.shape[0])
                a, b = R.indptr[lo], R.indptr[hi]
                _sparsetools.csc_matvecs(R.shape[1], hi - lo, k, R.indptr[lo : hi + 1] - a, R.indices[a:b], R.data[a:b].astype(np.float64),
                                         x[start + lo : start + hi].ravel(), out.ravel())
            start += R.shape[0]
        return out


BLOCK = 512  # households per block of BalanceTargets.expected: a few MB of float64 at a time, as fast as the whole product


def household_rows(data: HierarchicalData, workloads: Sequence[Workload]) -> sp.csr_matrix:
    """Households × cells, CSR with sorted indices: household h's row holds its counts in the cells
    of every workload, the workloads' cells side by side in the given order (the transpose of their
    stacked incidences). Written in place in two passes over the workloads (the first counts each
    row's entries): stacking the incidences and transposing would hold the matrix twice at once,
    hundreds of MB on a widened public support."""
    n = data.n_households
    lengths, top = np.zeros(n, dtype=np.int64), 0
    for w in workloads:
        h, _, k = household_cell_pairs(data, w)
        lengths += np.bincount(h, minlength=n)
        top = max(top, int(k.max(initial=0)))
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    n_cells = sum(w.n_cells(data.domain) for w in workloads)
    index_type = np.int32 if max(int(indptr[-1]), n_cells) < 2**31 else np.int64
    indices, values = np.empty(int(indptr[-1]), dtype=index_type), np.empty(int(indptr[-1]), dtype=np.min_scalar_type(top))
    filled, offset = indptr[:-1].copy(), 0
    for w in workloads:
        # one entry per (household, cell), ordered by household, then cell
        h, c, k = household_cell_pairs(data, w)
        per = np.bincount(h, minlength=n)
        pos = filled[h] + np.arange(h.size) - repeat_runs(np.cumsum(per) - per, per)
        indices[pos], values[pos] = c + offset, k
        filled += per
        offset += w.n_cells(data.domain)
    rows = sp.csr_matrix((values, indices, indptr.astype(index_type)), shape=(n, n_cells), copy=False)
    rows.has_sorted_indices = True
    return rows


def unchanged_attributes(a: HierarchicalData, b: HierarchicalData) -> frozenset[str]:
    """The attributes on which every household of ``a`` equals the same household of ``b``: the
    household attributes column by column, the person attributes where both have the same persons
    per household (otherwise none of them)."""
    d = a.domain
    same = {x.name for j, x in enumerate(d.group) if np.array_equal(a.group[:, j], b.group[:, j])}
    if np.array_equal(a.person_offsets, b.person_offsets):
        same |= {x.name for j, x in enumerate(d.person) if np.array_equal(a.person[:, j], b.person[:, j])}
    return frozenset(same)


def copied_rows(R: sp.csr_matrix, cells: np.ndarray) -> sp.csr_matrix:
    """``R`` with only the entries in the columns where ``cells`` (a mask) holds: sorted indices
    and the data type kept, taken :data:`BLOCK` · 16 rows at a time (a whole widened support's
    entries would hold a position array several times the matrix)."""
    n = R.shape[0]
    indptr = np.zeros(n + 1, dtype=np.int64)
    parts_i, parts_d = [], []
    step = BLOCK * 16
    for lo in range(0, n, step):
        part = R[lo : lo + step]
        keep = cells[part.indices]
        # int32 running counts (a chunk's entries stay far below 2^31): int64's cumsum is several times slower
        kept_before = np.zeros(keep.size + 1, dtype=np.int32)
        np.cumsum(keep.view(np.uint8), dtype=np.int32, out=kept_before[1:])
        indptr[lo + 1 : lo + 1 + part.shape[0]] = kept_before[part.indptr[1:]] - kept_before[part.indptr[:-1]]
        parts_i.append(part.indices[keep])
        parts_d.append(part.data[keep])
    np.cumsum(indptr, out=indptr)
    index_type = R.indices.dtype if indptr[-1] < 2**31 else np.int64
    out = sp.csr_matrix((np.concatenate(parts_d) if parts_d else np.zeros(0, R.dtype),
                         np.concatenate(parts_i).astype(index_type, copy=False) if parts_i else np.zeros(0, index_type),
                         indptr.astype(index_type)), shape=R.shape, copy=False)
    out.has_sorted_indices = True
    return out


def systematic_positions(p: np.ndarray, n: int, u: float) -> np.ndarray:
    """Indices of a systematic draw of ``n`` from the weights ``p`` (in their order) with start
    ``u`` ∈ [0, 1): the points (u + j)/n on the cumulative distribution."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    return np.minimum(np.searchsorted(cdf, (u + np.arange(n)) / n, side="right"), p.size - 1).astype(np.int64)


def _entries(R: sp.csr_matrix, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the given rows' entries in ``R``'s arrays, row after row, and each row's count."""
    start, stop = R.indptr[rows], R.indptr[np.asarray(rows) + 1]
    lengths = stop - start
    pos = np.repeat(start - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(int(lengths.sum()))
    return pos, lengths


def _rows_sum(R: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """Σ of the given rows of ``R`` (dense, one entry per column), by one bincount."""
    pos, _ = _entries(R, rows)
    return np.bincount(R.indices[pos], weights=R.data[pos], minlength=R.shape[1])


def _cross(R: sp.csr_matrix, a: np.ndarray, b: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """``R[a] @ R[b].T`` dense: the rows ``b`` spread into ``scratch`` (zeros, columns × at least
    len(b), C-ordered; left zero), and the rows ``a`` multiplied with it by scipy's kernel of a
    sparse matrix times dense columns, called on ``a``'s entries in place (no sparse matrix built
    for a product of a few rows). The entries are counts, so every product and sum is an integer
    held exactly, in any order: the sparse product's values, without its per-call conversions (the
    exact swaps take one per round)."""
    width = scratch.shape[1]
    spread = scratch.reshape(-1)  # a view: the spread is written through to scratch and cleared there
    pb, lb = _entries(R, b)
    slots = R.indices[pb].astype(np.int64) * width + np.repeat(np.arange(b.size), lb)
    pa, la = _entries(R, a)
    spread[slots] = R.data[pb]
    out = np.zeros((a.size, width))
    indptr = np.zeros(a.size + 1, dtype=R.indices.dtype)
    np.cumsum(la, out=indptr[1:])
    _sparsetools.csr_matvecs(a.size, R.shape[1], width, indptr, R.indices[pa], np.asarray(R.data[pa], dtype=np.float64), spread, out.reshape(-1))
    spread[slots] = 0.0
    return out[:, : b.size]


def _top(score: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest finite scores, largest first (ties by index)."""
    k = min(k, int(np.isfinite(score).sum()))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    idx = np.argpartition(-score, k - 1)[:k]
    return idx[np.lexsort((idx, -score[idx]))]


def balanced_draw(
    balance: BalanceTargets,
    p: np.ndarray,
    n: int,
    rng: np.random.Generator,
    order: np.ndarray | None = None,
    *,
    pool_factor: int = 2,
    max_rounds: int = 100,
    exact_candidates: int = 16,
) -> np.ndarray:
    """``n`` support indices drawn from the weights ``p`` and balanced on ``balance`` (module
    docstring). ``order``: the permutation of the support along which the pool is drawn (default
    the support order); ``pool_factor``: pool size over ``n`` (1: the plain systematic draw);
    ``max_rounds``: bound on the exchange rounds; ``exact_candidates``: removals and additions
    compared pairwise (with the cross term) once batches stop helping."""
    return _draw(balance, p, n, rng, order, None, pool_factor, max_rounds, exact_candidates)[0]


def balanced_draws(
    balance: BalanceTargets,
    weights: Sequence[np.ndarray],
    totals: Sequence[int],
    rngs: Sequence[np.random.Generator],
    order: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Sibling nodes (a state's PUMAs) drawn one after the other by :func:`balanced_draw`, each
    node's exchange search aiming at its expected balance counts less what the nodes drawn before
    it left over (their summed draw-minus-expected residual): error diffusion, so that the
    parent's sums of the balance marginals stay near the posteriors' instead of adding up the
    nodes' independent residuals. Every node's households are still its own posterior's pool
    draws; a function of the weights, totals and generators (in this order)."""
    if not (len(weights) == len(totals) == len(rngs)):
        raise ValueError("give one total and one generator per node")
    carried = np.zeros(balance.n_cells)
    out: list[np.ndarray] = []
    for lo in range(0, len(weights), EXPECTED_BATCH):
        batch = weights[lo : lo + EXPECTED_BATCH]
        expected = balance.expected_many(np.column_stack([_distribution(balance, p) for p in batch]))
        for j, (p, n, rng) in enumerate(zip(batch, totals[lo : lo + EXPECTED_BATCH], rngs[lo : lo + EXPECTED_BATCH])):
            idx, residual = _draw(balance, p, n, rng, order, carried, 2, 100, 16, expected=expected[:, j])
            carried += residual
            out.append(idx)
    return out


EXPECTED_BATCH = 16  # nodes whose expected balance counts share one pass over the rows: (households × 16) float64 at a time


def _distribution(balance: BalanceTargets, p: np.ndarray) -> np.ndarray:
    """The weights ``p`` checked (one non-negative entry per balance household, positive mass) and normalised."""
    p = np.asarray(p, dtype=np.float64)
    if p.shape != (balance.n_households,) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("weights must be non-negative with positive mass, one per balance household")
    out: np.ndarray = p / p.sum()
    return out


def _draw(balance: BalanceTargets, p: np.ndarray, n: int, rng: np.random.Generator, order: np.ndarray | None, offset: np.ndarray | None,
          pool_factor: int, max_rounds: int, exact_candidates: int, expected: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`balanced_draw` minimising ‖draw − expected + ``offset``‖² over the balance cells;
    returns (indices, draw − expected). ``expected``: the balance counts of ``p`` normalised, when
    the caller checked ``p`` and computed them (:meth:`BalanceTargets.expected_many`)."""
    p = np.asarray(p, dtype=np.float64)
    if expected is None:  # a caller that gives them (balanced_draws) checked and normalised p already
        expected = balance.expected(_distribution(balance, p))
    if pool_factor < 1 or exact_candidates < 1:
        raise ValueError("pool_factor and exact_candidates must be >= 1")
    n = int(n)
    expected = n * expected
    shift = np.zeros_like(expected) if offset is None else np.asarray(offset, dtype=np.float64)
    if shift.shape != expected.shape:
        raise ValueError("the offset needs one entry per balance cell")
    if n <= 0:
        return np.zeros(0, dtype=np.int64), -expected
    perm = np.arange(p.size, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    k = int(pool_factor)
    pool = perm[systematic_positions(p[perm], k * n, float(rng.random()))]
    chosen = np.zeros(k * n, dtype=bool)
    chosen[int(rng.integers(k)) + k * np.arange(n)] = True
    R = balance.take(pool)  # pool unit × cell
    r = R.T @ chosen.astype(np.float64) - expected + shift
    if k == 1:
        return pool, r - shift
    sq = np.add.reduceat(R.data**2, R.indptr[:-1]) if R.nnz else np.zeros(R.shape[0])  # ‖a_u‖²
    loss = float(r @ r)
    scratch = np.zeros((R.shape[1], 2 * exact_candidates))  # the exact swaps' candidates, spread (_cross)
    batch_max = max(1, n // 10)
    batch = batch_max
    changed = True
    for _ in range(max_rounds):
        if changed:  # a round that swaps nothing (a batch that did not help) leaves r, s and the gains as they were
            s = R @ r
            # loss change of removing a chosen unit: −(2 s_u − ‖a_u‖²); of adding an unchosen one: 2 s_u + ‖a_u‖²
            gain_remove = np.where(chosen, 2 * s - sq, -np.inf)
            gain_add = np.where(chosen, -np.inf, -(2 * s + sq))
            changed = False
        if batch > 1:
            out, into = _top(gain_remove, batch), _top(gain_add, batch)
            m = min(out.size, into.size)
            out, into = out[:m], into[:m]
            keep = gain_remove[out] + gain_add[into] > 0  # both sorted: a prefix
            out, into = out[keep], into[keep]
            if out.size:
                r_new = r + _rows_sum(R, into) - _rows_sum(R, out)
                loss_new = float(r_new @ r_new)
                if loss_new < loss:
                    chosen[out], chosen[into] = False, True
                    r, loss, changed = r_new, loss_new, True
                    batch = min(2 * batch, batch_max)
                    continue
            batch //= 2
            continue
        # exact swaps among the best candidates: Δ = −gain_remove_i − gain_add_j − 2 a_i·a_j, the
        # candidates' gains kept exact after each swap through their own gram (s_u moves by
        # a_u·a_j − a_u·a_i), so that one product of R serves every swap that still helps among them
        out, into = _top(gain_remove, exact_candidates), _top(gain_add, exact_candidates)
        if out.size == 0 or into.size == 0:
            break
        cand = np.concatenate([out, into])
        gram = _cross(R, cand, cand, scratch)  # a_u·a_v of every two candidates (integers, exact)
        k = out.size
        g_out, g_in = gain_remove[out].copy(), gain_add[into].copy()
        free_out, free_in = np.ones(k, dtype=bool), np.ones(into.size, dtype=bool)
        swapped = False
        while free_out.any() and free_in.any():
            delta = -g_out[:, None] - g_in[None, :] - 2 * gram[:k, k:]
            delta[~free_out, :] = np.inf
            delta[:, ~free_in] = np.inf
            i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if delta[i, j] >= -1e-9:
                break
            chosen[out[i]], chosen[into[j]] = False, True
            free_out[i], free_in[j] = False, False
            # r − a_i + a_j on the two rows' own cells (a row holds each cell once); the other cells
            # are unchanged, as the dense sums' zeros leave them
            gone, came = slice(R.indptr[out[i]], R.indptr[out[i] + 1]), slice(R.indptr[into[j]], R.indptr[into[j] + 1])
            r[R.indices[gone]] -= R.data[gone]
            r[R.indices[came]] += R.data[came]
            moved = gram[:, k + j] - gram[:, i]  # each candidate's s moves by a_u·a_j − a_u·a_i
            g_out += 2 * moved[:k]
            g_in -= 2 * moved[k:]
            swapped = True
        if not swapped:
            break
        loss, changed = float(r @ r), True
    return pool[chosen], r - shift
