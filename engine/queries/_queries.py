"""Hierarchical marginal workloads (H-GEM paper, Table 1) and their exact answers.

A workload W_S is one attribute set S = S_G ∪ S_I at one level:
- ``group``:  count of households matching y_G that (when S_I ≠ ∅) contain at least one person
              matching y_I;
- ``person``: count of persons matching y_I whose household matches y_G.
Answers are count vectors over dom(S_G) × dom(S_I) in C order (group attributes first, in the
order given, then person attributes). Everything is vectorised with numpy.

For repeated evaluation on a weighted support (public households + weights, ``engine.queries._support``)
each workload is also available as a sparse incidence A (cells × households, scipy CSR:
:func:`incidence_matrix`), so that answering for any weights x is the mat-vec ``A @ x``;
:class:`IncidenceCache` builds them once per set of households, and :func:`incidence_patterns`
groups households with identical incidence columns (used by the entropy projections of
``engine.synthesis._prior_update``).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, TypeVar, cast

import numpy as np
import scipy.sparse as sp
from scipy.sparse import _sparsetools

from engine.data import Domain, HierarchicalData, repeat_runs, sorted_counts

Level = Literal["group", "person"]
PrivacyUnit = Literal["household", "person"]
"""What one individual's data is: the neighbouring relation every sensitivity here is charged for.

``household``: two inputs are neighbours when one holds one more housing unit (with all its
persons) or one more group-quarters person. Every ingestion rule maps that to at most one more
encoded household of at most M persons (an oversize household is clipped to M persons or
dropped; a group-quarters person is dropped or is a one-person household).

``person``: two inputs are neighbours when one holds one more person record, who joins an
existing unit (sharing its serial number and geography, with a person number of its own) or is
alone in a new one. What the encoded data see (``docs/privacy.md``): a household of s < M persons
gains one; a household at the cap M (or above it) gains one — under ``oversize: clip`` one of its
kept persons may be replaced by the newcomer (they are kept in person-number order, the
householder first), under ``oversize: exclude`` a household of M disappears whole; a one-person
household appears; a housing unit whose householder is removed, or that gains a second
householder, is excluded whole at ingestion (``schemas.ingestion.HouseholdRules.householders``),
so that neighbour removes a whole household of at most M persons. Every sensitivity charged
under the person unit covers all of these, so every person, householder included, has the
release's guarantee: a householder's presence may carry their housing unit's other persons in or
out of the input, and that whole change is what is bounded.
"""


@dataclass(frozen=True, order=True)
class Workload:
    """``first`` (person level only): count only the first ``first`` persons of each household
    (householder first, in the household's own person order). A household then adds at most
    ``first`` persons to any cell, so under the household unit the sensitivity falls from M to
    ``first``; the persons further down large households are left to the prior and the other
    workloads. 0 (default): every person.

    ``normalised`` (any workload but a partition): each household's contribution — its column
    v_h of counts (person level) or of ones ("contains") over the cells — is rescaled to the
    integer vector ⌊S·v_h / ‖v_h‖₂⌋ (S = :data:`NORM_SCALE`), whose L2 norm is at most S
    whatever the household. Under the household unit the L2 sensitivity is then S, one
    household's worth, where plain counts have ``counted persons`` (person level) or √c
    ("contains") households' worth: every household's column carries signal energy ‖column‖²
    = S² against noise variance ∝ S², where counting the first two persons (sensitivity 2)
    gives a one-person household ¼ of that, two persons in different cells ½ and a third person
    nothing. The synthesis models whole households, so the rescaled count is as linear a query
    on its support as the plain one (the incidence holds the rescaled integers): nothing is
    biased; the measurement is a different, better conditioned statistic of the same households
    (contribution bounding per privacy unit in L2, as in user-level DP, e.g. Amin et al. 2019,
    "Bounding user contributions")."""

    level: Level
    group_attrs: tuple[str, ...] = ()
    person_attrs: tuple[str, ...] = ()
    first: int = 0
    normalised: bool = False

    def __post_init__(self) -> None:
        if self.level not in ("group", "person"):
            raise ValueError(f"workload level must be 'group' or 'person', got {self.level!r}")
        if not self.group_attrs and not self.person_attrs:
            raise ValueError("a workload needs at least one attribute")
        if self.level == "person" and not self.person_attrs and not self.group_attrs:
            raise ValueError("a person-level workload needs attributes")
        if not isinstance(self.first, int) or self.first < 0:
            raise ValueError(f"first must be a non-negative integer, got {self.first!r}")
        if self.first and self.level != "person":
            raise ValueError("only a person-level workload can count the first persons of a household")
        if not isinstance(self.normalised, bool):
            raise ValueError(f"normalised must be a bool, got {self.normalised!r}")
        if self.normalised and self.is_partition():
            raise ValueError("a partition workload (group level, no person attribute) is already of unit norm per household: "
                             "it cannot be normalised")

    @property
    def id(self) -> str:
        base = f"{self.level}:{','.join(self.group_attrs)}|{','.join(self.person_attrs)}"
        if self.first:
            base += f";first={self.first}"
        return f"{base};norm" if self.normalised else base

    @classmethod
    def from_id(cls, wid: str) -> Workload:
        wid, *options = wid.split(";")
        first, normalised = 0, False
        for o in options:
            if o == "norm":
                normalised = True
            elif o.startswith("first="):
                first = int(o.removeprefix("first="))
            else:
                raise ValueError(f"unknown workload option {o!r} in {wid!r}")
        level, rest = wid.split(":", 1)
        g, p = rest.split("|", 1)
        # the level is parsed text here; __post_init__ rejects anything but "group" / "person"
        return cls(cast(Level, level), tuple(a for a in g.split(",") if a), tuple(a for a in p.split(",") if a), first, normalised)

    @property
    def household_unit(self) -> float:
        """What one household's worth is in this workload's cells: :data:`NORM_SCALE` for a
        normalised workload (its rows divided by it speak in households, like a count's), 1 else."""
        return float(NORM_SCALE) if self.normalised else 1.0

    def counted_persons(self, max_size: int) -> int:
        """The most persons of one household this workload counts: M, or ``first`` when smaller."""
        return min(max_size, self.first) if self.first else max_size

    @property
    def attrs(self) -> tuple[str, ...]:
        return self.group_attrs + self.person_attrs

    def shape(self, domain: Domain) -> tuple[int, ...]:
        return tuple(domain.group_attribute(a).size for a in self.group_attrs) + tuple(
            domain.person_attribute(a).size for a in self.person_attrs
        )

    def n_cells(self, domain: Domain) -> int:
        return int(np.prod(self.shape(domain), dtype=np.int64))

    def is_partition(self) -> bool:
        """True when every household falls in exactly one cell (group level, no person attributes)."""
        return self.level == "group" and not self.person_attrs

    # -- sensitivities -----------------------------------------------------------------
    def sensitivity(self, domain: Domain, unit: PrivacyUnit) -> tuple[float, float]:
        """(L1, L2) sensitivity of the count vector under the privacy unit.

        household unit (add/remove one household of ≤ M persons):
          group, S_I = ∅: 1 / 1;  group, S_I ≠ ∅: c / √c with c = min(M, |dom S_I|);
          person: m / m with m = min(M, first) the persons counted (all may fall into one cell).
        person unit (:data:`PrivacyUnit`: one household's persons change — one joins or leaves,
        or, at the cap M under ``oversize: clip``, one of its M kept persons is replaced by the
        newcomer — and its derived attributes — size, householder's attributes, presence of
        children … — may change; or a whole household of ≤ M persons appears or disappears):
          group, S_I = ∅: the household moves cell: 2 / √2;
          group, S_I ≠ ∅: the household leaves at most c = min(M, |dom S_I|) cells and enters at
            most c, each by one: 2c / √(2c) (attained at the cap under ``clip``, a replaced person
            changing a derived group attribute such as the presence of children);
          person: the m = min(M, first) persons counted before may all move to another cell and
            m are counted after: 2m / √2·m (with ``first`` a person inserted among the first
            pushes the last counted one out, within the same bound).
          A household appearing or disappearing changes each vector by at most its household-unit
          bound, within the bounds above. Under ``oversize: exclude`` no household keeps M persons
          on both sides, so 2M−1 would do there when |dom S_I| ≥ M; one bound serves every rule.
        """
        M = domain.max_size
        if self.normalised:
            return self._normalised_sensitivity(domain, unit)
        if self.level == "group":
            if not self.person_attrs:
                return (1.0, 1.0) if unit == "household" else (2.0, math.sqrt(2.0))
            dom_i = int(np.prod([domain.person_attribute(a).size for a in self.person_attrs]))
            c = min(M, dom_i)
            if unit == "household":
                return float(c), math.sqrt(c)
            return float(2 * c), math.sqrt(2 * c)
        m = self.counted_persons(M)
        if unit == "household":
            return float(m), float(m)
        return float(2 * m), math.sqrt(2.0) * m

    def _normalised_sensitivity(self, domain: Domain, unit: PrivacyUnit) -> tuple[float, float]:
        """A normalised workload (class docstring): every household's column is a non-negative
        integer vector of L2 norm ≤ S on at most c = min(counted persons, |dom S_I|) cells (its
        persons' cells; the group cell is one), so of L1 norm ≤ S·√c (Cauchy–Schwarz).
        household unit: one column appears or disappears: L1 S·√c, L2 S.
        person unit: one household's column a = ⌊S·u⌋ is replaced by another b = ⌊S·u'⌋ (u, u'
        non-negative unit vectors, so u·u' ≥ 0 and ‖u − u'‖₂ ≤ √2; each floor is off by less
        than one in each of at most c entries): ‖a − b‖₂ ≤ √2·S + 2√c; a household that appears
        (a = 0) moves it by ‖b‖₂ ≤ S. L1: ‖a − b‖₁ ≤ ‖a‖₁ + ‖b‖₁ ≤ 2S·√c."""
        S = NORM_SCALE
        dom_i = int(np.prod([domain.person_attribute(a).size for a in self.person_attrs])) if self.person_attrs else 1
        c = min(self.counted_persons(domain.max_size), dom_i)
        l1 = S * math.sqrt(c)
        if unit == "household":
            return l1, float(S)
        return 2.0 * l1, (math.sqrt(2.0) * S + 2.0 * math.sqrt(c)) * (1.0 + 1e-12)  # the floors' strict < 1 leaves room; 1e-12 covers rounding


NORM_SCALE = 64  # a normalised workload's household column: an integer vector of L2 norm ≤ 64 (Workload)


def normalise_columns(household: np.ndarray, counts: np.ndarray, n_households: int, scale: int = NORM_SCALE) -> np.ndarray:
    """⌊scale·k / ‖k_h‖₂⌋ for every (household, cell) entry of count k, ‖k_h‖₂ the L2 norm of the
    household's counts: exactly, in integers (⌊√⌊x⌋⌋ = ⌊√x⌋ for x ≥ 0), so that the rescaled
    column's norm is at most ``scale`` with no floating-point rounding to break the bound."""
    k = np.asarray(counts, dtype=np.int64)
    h = np.asarray(household, dtype=np.int64)
    sq = np.bincount(h, weights=(k * k).astype(np.float64), minlength=int(n_households))  # small integers: exact in float64
    t = (scale * scale * k * k) // np.maximum(np.rint(sq[h]).astype(np.int64), 1)
    v = np.floor(np.sqrt(t.astype(np.float64))).astype(np.int64)
    v -= (v * v > t).astype(np.int64)
    v += ((v + 1) * (v + 1) <= t).astype(np.int64)
    return v


# -- cell indices ------------------------------------------------------------------------
def group_cells(data: HierarchicalData, attrs: tuple[str, ...]) -> np.ndarray:
    """Flat cell index of every household over dom(attrs) (C order); zeros when attrs = ()."""
    d = data.domain
    if not attrs:
        return np.zeros(data.n_households, dtype=np.int64)
    cols = [data.group[:, d.group_index(a)].astype(np.int64) for a in attrs]
    return np.ravel_multi_index(cols, [d.group_attribute(a).size for a in attrs])


def person_cells(data: HierarchicalData, attrs: tuple[str, ...]) -> np.ndarray:
    """Flat cell index of every person over dom(attrs) (C order); zeros when attrs = ()."""
    d = data.domain
    if not attrs:
        return np.zeros(data.n_persons, dtype=np.int64)
    cols = [data.person[:, d.person_index(a)].astype(np.int64) for a in attrs]
    return np.ravel_multi_index(cols, [d.person_attribute(a).size for a in attrs])


def counted_person_cells(data: HierarchicalData, w: Workload, g: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(household, cell) of every person the workload counts (its first ``w.first`` per household,
    or all), the cell over dom(S_G) × dom(S_I); ``g``: the households' group cells if known."""
    d = data.domain
    g = group_cells(data, w.group_attrs) if g is None else g
    n_i = int(np.prod([d.person_attribute(a).size for a in w.person_attrs], dtype=np.int64)) if w.person_attrs else 1
    hh = data.person_household
    cells = g[hh] * n_i + person_cells(data, w.person_attrs)
    if w.first:
        keep = data.person_slot < w.first
        hh, cells = hh[keep], cells[keep]
    return hh, cells


def household_cell_pairs(data: HierarchicalData, w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sparse incidence of a workload: (household index, cell index, count) triples.

    group level: each (household, cell) pair at most once, count 1 (a household "contains");
    person level: count = number of the household's persons in that cell; a normalised workload:
    those entries rescaled per household (:func:`normalise_columns`).
    """
    g = group_cells(data, w.group_attrs)
    if w.level == "group" and not w.person_attrs:
        return np.arange(data.n_households, dtype=np.int64), g, np.ones(data.n_households, dtype=np.int64)
    hh, cells = counted_person_cells(data, w, g)
    n_cells = w.n_cells(data.domain)
    uniq, counts = sorted_counts(hh * n_cells + cells)
    h, c = np.divmod(uniq, n_cells)
    if w.level == "group":
        counts = np.ones_like(counts)
    if w.normalised:
        counts = normalise_columns(h, counts, data.n_households)
    return h, c, counts


def answer_entries(data: HierarchicalData, w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(household, cell, count) entries whose per-cell sums are ``w``'s answer; count None: one per
    entry (an unnormalised person workload, one entry per counted person: no need to pair
    households with cells), else :func:`household_cell_pairs`."""
    if w.level == "person" and not w.normalised:
        hh, cells = counted_person_cells(data, w)
        return hh, cells, None
    return household_cell_pairs(data, w)


def answer(data: HierarchicalData, w: Workload, weights: np.ndarray | None = None) -> np.ndarray:
    """Exact answer (counts, float64) of workload ``w``; ``weights`` per household (default 1)."""
    hh, cells, k = answer_entries(data, w)
    wt = None if weights is None else np.asarray(weights, dtype=np.float64)[hh]
    if k is not None:
        wt = k.astype(np.float64) if wt is None else k * wt
    return np.bincount(cells, weights=wt, minlength=w.n_cells(data.domain)).astype(np.float64, copy=False)


def node_answers(data: HierarchicalData, w: Workload, node_of: np.ndarray, n_nodes: int) -> np.ndarray:
    """:func:`answer` of every node's households at once, (``n_nodes``, cells): row j is the answer
    of the households h with ``node_of[h] == j`` (−1: in no node). A household's entries do not
    depend on the other households, and they are integers, so each row equals :func:`answer` of
    that node's households alone, exactly."""
    n_cells = w.n_cells(data.domain)
    hh, cells, k = answer_entries(data, w)
    node = np.asarray(node_of, dtype=np.int64)[hh]
    keep = node >= 0
    counts = np.bincount(node[keep] * n_cells + cells[keep], weights=None if k is None else k[keep].astype(np.float64),
                         minlength=int(n_nodes) * n_cells)
    return counts.astype(np.float64).reshape(int(n_nodes), n_cells)


def normalised_answer(data: HierarchicalData, w: Workload, weights: np.ndarray | None = None) -> np.ndarray:
    """Answer normalised as in the H-GEM paper (Table 1): group level by N_G, person level by N_I.

    With ``weights`` (a weighted support), N_G = Σ_h w_h and N_I = Σ_h w_h · size_h.
    """
    counts = answer(data, w, weights)
    total: float
    if weights is None:
        total = data.n_households if w.level == "group" else data.n_persons
    else:
        wt = np.asarray(weights, dtype=np.float64)
        total = wt.sum() if w.level == "group" else float(wt @ data.sizes)
    return counts / total if total > 0 else counts


# -- sparse incidences ---------------------------------------------------------------------
def incidence_matrix(data: HierarchicalData, w: Workload) -> sp.csr_matrix:
    """The workload as a sparse matrix A (cells × households), CSR, float64.

    ``A[c, h]`` is 1 when household h is counted in cell c of a group-level workload (a partition
    when S_I = ∅, a "contains" query otherwise) and the number of h's persons in cell c for a
    person-level workload (a normalised workload: those entries rescaled per household). For
    any household weights x, ``A @ x`` is ``answer(data, w, x)``: this is the matrix W of Tao et
    al. (§2, "a workload W of M linear queries ... y = Wx") restricted to the support, and the
    query matrix of PMW-Pub over the public domain.
    """
    h, c, k = household_cell_pairs(data, w)
    return sp.csr_matrix(
        (k.astype(np.float64), (c, h)), shape=(w.n_cells(data.domain), data.n_households)
    )


@dataclass(frozen=True, eq=False)
class Patterns:
    """The distinct columns ("patterns") of a workload's incidence over a support.

    ``matrix`` (U × cells, CSR) holds pattern u in row u; ``pattern_of`` (N_G,) gives each
    household's pattern, so ``incidence[:, h] == matrix[pattern_of[h]].T``. Households that share a
    pattern are indistinguishable to the workload, so an entropy projection onto its answers
    multiplies all of them by the same factor (the Lagrangian form, Tao et al. eq. (3)) and can be
    solved on the U patterns instead of the N_G households.
    """

    matrix: sp.csr_matrix
    pattern_of: np.ndarray

    @property
    def n_patterns(self) -> int:
        return int(self.matrix.shape[0])

    def second_moment_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pattern u, flat cell pair i·C+j, a_ui·a_uj) for every pair of non-zeros of each pattern,
        so that ``Σ_u π_u a_u a_uᵀ`` is one ``bincount`` (the Hessian of the entropy-projection
        dual). Cached: the structure depends on the support only."""
        return self._second_moment_pairs

    @cached_property
    def _second_moment_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        P = self.matrix
        C = P.shape[1]
        k = np.diff(P.indptr)
        us: list[np.ndarray] = []
        cells: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        for r1 in range(int(k.max(initial=0))):
            for r2 in range(int(k.max(initial=0))):
                u = np.flatnonzero(k > max(r1, r2))
                i1 = P.indptr[u] + r1
                i2 = P.indptr[u] + r2
                us.append(u)
                cells.append(P.indices[i1].astype(np.int64) * C + P.indices[i2])
                vals.append(P.data[i1] * P.data[i2])

        def cat(xs: list[np.ndarray], dt: type[np.generic]) -> np.ndarray:
            return np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)

        return cat(us, np.int64), cat(cells, np.int64), cat(vals, np.float64)

    @cached_property
    def transposed(self) -> sp.csr_matrix:
        """``matrix`` transposed (cells × U, CSR), built once per support."""
        return self.matrix.T.tocsr()

    def mass(self, weights: np.ndarray) -> np.ndarray:
        """Total weight of the households of every pattern, (U,)."""
        return np.bincount(self.pattern_of, weights=weights, minlength=self.n_patterns)


def centred_gram(A: sp.csr_matrix, w: np.ndarray, lower: bool = False) -> np.ndarray:
    """A diag(w) Aᵀ − (A w)(A w)ᵀ, dense: the covariance of the answers ``A`` (cells × households or
    patterns) under the distribution ``w`` (one draw, unscaled) — what the interval estimates and the
    empirical-Bayes likelihood build their dense algebra on. ``lower``: the lower triangle and the
    diagonal are the product's (the same values, bit for bit), the upper triangle's off-diagonal
    blocks their mirror: for the symmetric solvers that read one triangle (LAPACK's potrf with
    ``lower=True``, numpy's ``eigh`` with its default ``UPLO="L"``), a band of rows at a time
    against the rows up to its end only, so that the upper triangle's off-diagonal blocks are never
    multiplied out."""
    A = A.tocsr()
    a = A @ w
    # diag(w) applied to the stored entries (each entry times its column's weight: the products
    # ``A.multiply`` forms, without its broadcast's conversions)
    Aw = sp.csr_matrix((A.data * np.asarray(w, dtype=np.float64)[A.indices], A.indices, A.indptr), shape=A.shape)
    if not lower or A.shape[0] <= GRAM_BAND:
        gram: np.ndarray = (Aw @ A.T).toarray()
    else:
        gram = np.empty((A.shape[0], A.shape[0]))
        for lo in range(0, A.shape[0], GRAM_BAND):
            hi = min(lo + GRAM_BAND, A.shape[0])
            # rows ≤ the band's end against the band, transposed: entry (i, j) adds A[i, k]·Aw[j, k]
            # over k in ascending order, the whole product's sums bit for bit; the band side is the
            # one transposed (its few rows, not the rows up to the band's end, as the other order does)
            gram[lo:hi, :hi] = (leading_rows(A, hi) @ Aw[lo:hi].T).toarray().T
            gram[:lo, lo:hi] = gram[lo:hi, :lo].T
    outer_in_place(gram, a, a)
    return gram


def leading_rows(A: sp.csr_matrix, n: int) -> sp.csr_matrix:
    """``A[:n]`` as a view of ``A``'s arrays: scipy's slice copies them in a routine that holds the
    GIL, and the banded gram takes one such slice per band of up to the whole matrix."""
    end = int(A.indptr[n])
    return sp.csr_matrix((A.data[:end], A.indices[:end], A.indptr[: n + 1]), shape=(n, A.shape[1]), copy=False)


def hstack_rows(blocks: Sequence[sp.csr_matrix]) -> sp.csr_matrix:
    """Row-aligned CSR blocks side by side in float64: ``sp.hstack(blocks, format="csr",
    dtype=np.float64)`` array for array (each row holds the blocks' entries in block order, each
    block's columns shifted past the blocks before it). Each block's entries are written straight
    to their places; scipy's stack first concatenates every block's arrays into copies, which on a
    state's joint incidence (tens of millions of entries, each fresh allocation paged in by the
    worker's allocator) took several times as long."""
    n = blocks[0].shape[0]
    if any(b.shape[0] != n for b in blocks):
        raise ValueError(f"blocks of {sorted({b.shape[0] for b in blocks})} rows: hstack_rows needs one row count")
    lengths = np.zeros(n, dtype=np.int64)
    for b in blocks:
        lengths += np.diff(b.indptr)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz, n_cols = int(indptr[-1]), sum(int(b.shape[1]) for b in blocks)
    index_type = np.int32 if max(nnz, n_cols - 1) <= np.iinfo(np.int32).max else np.int64
    indices, data = np.empty(nnz, dtype=index_type), np.empty(nnz, dtype=np.float64)
    filled, offset = indptr[:-1].copy(), 0
    for b in blocks:
        per = np.diff(b.indptr)
        pos = repeat_runs(filled - b.indptr[:-1], per)
        pos += np.arange(b.indptr[-1])
        indices[pos] = b.indices[: b.indptr[-1]].astype(index_type, copy=False) + index_type(offset)
        data[pos] = b.data[: b.indptr[-1]]
        filled += per
        offset += int(b.shape[1])
    return sp.csr_matrix((data, indices, indptr.astype(index_type)), shape=(n, n_cols), copy=False)


GRAM_BAND = 384  # rows per band of a lower centred_gram: fewer bands redo more of the upper triangle, more pay the sparse product's per-call cost


def outer_in_place(M: np.ndarray, x: np.ndarray, y: np.ndarray, op: np.ufunc = np.subtract) -> None:
    """``M = op(M, outer(x, y))`` in place (``np.subtract``: centring, ``np.divide``: whitening), a
    band of rows at a time: the same operations on the same products as the whole expression,
    without the two further dense matrices it holds at once (a state's measured cells make each
    tens of MB, and the two threads of a worker may be in this step together)."""
    for lo in range(0, M.shape[0], OUTER_ROWS):
        band = M[lo : lo + OUTER_ROWS]
        op(band, np.outer(x[lo : lo + OUTER_ROWS], y), out=band)


OUTER_ROWS = 256  # rows per band of outer_in_place: a few MB of products at a time


GROUP_KEY_LIMIT = 1 << 62  # a fused group key stays below this: int64 with room to spare


def group_rows(columns: Sequence[np.ndarray], n: int, start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows grouped by their non-negative integer codes in ``columns`` (after the groups
    ``start``, if given), exactly, by successive 1-D ``np.unique`` (much faster than
    ``unique(axis=0)``): (group 0..U−1 of every row, the first row of every group). The groups
    are numbered in the lexicographic order of (start, columns...). Consecutive columns are fused
    into one mixed-radix key while it fits in int64 (each code below its radix, so the key's
    order is the tuples' lexicographic order): one sort per fused run instead of one per column,
    the same numbering."""
    gid = np.zeros(n, dtype=np.int64) if start is None else np.asarray(start, dtype=np.int64)
    cols = [np.asarray(c, dtype=np.int64) for c in columns]
    radix = [int(c.max(initial=0)) + 1 for c in cols]
    i = 0
    while i < len(cols):
        key, span = gid, int(gid.max(initial=0)) + 1
        j = i
        while j < len(cols) and (j == i or span * radix[j] < GROUP_KEY_LIMIT):
            key = key * radix[j] + cols[j]
            span *= radix[j]
            j += 1
        _, gid = np.unique(key, return_inverse=True)
        gid = gid.reshape(-1).astype(np.int64)
        i = j
    _, first = np.unique(gid, return_index=True)
    return gid, first


def incidence_patterns(data: HierarchicalData, w: Workload, A: sp.csr_matrix | None = None) -> Patterns:
    """Exact grouping of households by their column of the incidence (no hashing).

    A household has at most M non-zero cells (one per person at most), so its column is encoded as
    a fixed-length key of ≤ M sorted ``cell·(B+1)+value`` codes padded with −1 (B the largest
    entry: M for counts, :data:`NORM_SCALE` normalised); the keys are grouped exactly by
    successive 1-D ``np.unique`` on (group so far, next code).
    """
    if A is None:
        A = incidence_matrix(data, w)
    n = data.n_households
    if w.is_partition():
        cells = group_cells(data, w.group_attrs)
        uniq, inv = np.unique(cells, return_inverse=True)
        m = sp.csr_matrix(
            (np.ones(uniq.size), (np.arange(uniq.size), uniq)), shape=(uniq.size, A.shape[0])
        )
        return Patterns(m, inv.astype(pattern_index(n)))
    At = A.T.tocsr()
    At.sort_indices()
    nnz = np.diff(At.indptr)
    width = max(int(nnz.max(initial=0)), 1)
    B1 = max(data.domain.max_size, int(At.data.max(initial=0))) + 1
    codes = At.indices.astype(np.int64) * B1 + np.rint(At.data).astype(np.int64)
    row = repeat_runs(np.arange(n, dtype=np.int64), nnz)
    slot = np.arange(codes.size, dtype=np.int64) - repeat_runs(At.indptr[:-1].astype(np.int64), nnz)
    keys = np.full((n, width), -1, dtype=np.int64)
    keys[row, slot] = codes
    # exact row grouping, one column at a time (1-D uniques are much faster than unique(axis=0))
    gid, first = group_rows([keys[:, j] + 1 for j in range(width)], n)
    return Patterns(At[first].tocsr(), gid.astype(pattern_index(n)))


def pattern_index(n_households: int) -> type[np.signedinteger]:
    """The integer type of a household's pattern number (:attr:`Patterns.pattern_of`): int32 while
    the households allow, half of int64's memory on a support's every workload (a widened support
    holds one such array per workload for each of its hundreds of thousands of households)."""
    return np.int32 if n_households < 2**31 else np.int64


@dataclass(frozen=True)
class PatternPairs:
    """Households grouped by a pair of patterns (:meth:`IncidenceCache.pattern_pairs`): a CSR
    structure (``indptr``, ``indices``, ``shape``) and each household's entry ``pair_of``."""

    indptr: np.ndarray
    indices: np.ndarray
    pair_of: np.ndarray
    shape: tuple[int, int]

    def matrix(self, q: np.ndarray) -> sp.csr_matrix:
        """W[row pattern, column pattern] = Σ q over the households of that pair."""
        data = np.bincount(self.pair_of, weights=np.asarray(q, dtype=np.float64), minlength=len(self.indices))
        return sp.csr_matrix((data, self.indices, self.indptr), shape=self.shape)


Method = TypeVar("Method", bound=Callable[..., Any])


def _locked(method: Method) -> Method:
    """An :class:`IncidenceCache` method run under the cache's lock: the threads of a worker share
    its supports, and a lookup that finds a list another thread is about to evict, or two threads
    building the same incidence at once, would fail or hold it twice."""
    @functools.wraps(method)
    def run(self: IncidenceCache, *args: Any) -> Any:
        with self._lock:
            return method(self, *args)
    return cast(Method, run)


class IncidenceCache:
    """Incidence matrices (and their patterns) of workloads over one fixed set of households.

    Build once per support and reuse for every node that updates a prior on that support
    (state posterior → every PUMA of the state): answering a workload for new weights is then a
    single sparse matrix–vector product. The joint patterns of the last ``JOINT_CACHE`` workload
    lists are kept (least recently used dropped): a worker's support serves every state.

    ``copies_of`` (a cache of other households, a set of attribute names, and each household's
    row among those households): ``data`` is copies of those households, differing from them only
    in the named attributes — all of them first, in order, then runs of copies of some of them (the
    prior mixture's widened support, ``engine.synthesis._prior_mixture.widen``). A workload that
    reads none of the named attributes has the same column for a copy as for its original, so its
    incidence is the other cache's with its columns taken in the copies' order and its patterns are
    the other cache's, each household's repeated — taken from there, exactly, instead of grouping
    all the copies again.
    """

    # a node's fits reuse few lists at a time (an adaptive round extends the last one; a PUMA's
    # fits and error estimates alternate its own list and its state's), while each kept list holds
    # its stacked incidence (tens of MB on a public support, a hundred on a widened one): a longer
    # memory mostly kept the lists of nodes already done, in every worker, for the whole run; an
    # adaptive round needs only the list it extends, and a node's chain of rounds passes through a
    # cache of three as through one of four
    JOINT_CACHE = 3
    # lists every node on the support groups (:meth:`keep`): a state's measured workloads without
    # and with the pair completion, which the final fit extends by its rounds' choices. They come
    # back once per state, after the rounds' lists have pushed them out of the three above, and
    # each is a few hundred thousand households grouped again; two are kept apart from those
    KEPT_CACHE = 2
    LIVE_CACHE = 2  # restrictions kept (live_incidence): each is a copy of a joint incidence, and the fits that reuse one come one after another

    def __init__(self, data: HierarchicalData, copies_of: tuple[IncidenceCache, frozenset[str], np.ndarray] | None = None):
        self.data: HierarchicalData = data
        self._copies_of = copies_of
        self._lock = threading.RLock()
        self._runs: list[tuple[int, int, np.ndarray | None]] = []  # each run of copies: its rows, its originals (None: all, in order)
        if copies_of is not None:
            n, origin = copies_of[0].data.n_households, np.asarray(copies_of[2], dtype=np.int64)
            if n == 0 or origin.shape != (data.n_households,) or not np.array_equal(origin[:n], np.arange(n)) \
                    or origin.min() < 0 or origin.max() >= n:
                raise ValueError(f"copies_of: each of the {data.n_households} households' row among the copied cache's {n}, "
                                 f"those first in order, expected")
            # a run of copies holds its originals in ascending order: a new one starts where the order drops
            starts = [0, *(n + np.flatnonzero(np.diff(origin[n - 1 :]) <= 0)).tolist(), origin.size]
            for lo, hi in zip(starts[:-1], starts[1:]):
                rows = origin[lo:hi]
                self._runs.append((lo, hi, None if hi - lo == n else rows))
            self._copies_of = (copies_of[0], copies_of[1], origin)
        self._A: dict[Workload, sp.csr_matrix] = {}
        self._patterns: dict[Workload, Patterns] = {}
        self._cells: dict[Workload, np.ndarray] = {}
        self._joint: OrderedDict[tuple[Workload, ...], tuple[sp.csr_matrix, np.ndarray]] = OrderedDict()
        self._kept: OrderedDict[tuple[Workload, ...], tuple[sp.csr_matrix, np.ndarray]] = OrderedDict()
        self._recurring: set[tuple[Workload, ...]] = set()
        self._pairs: OrderedDict[tuple[tuple[Workload, ...], tuple[Workload, ...]], PatternPairs] = OrderedDict()
        self._live: OrderedDict[tuple[Workload, ...], tuple[np.ndarray, sp.csr_matrix]] = OrderedDict()

    def _copied(self, w: Workload) -> tuple[IncidenceCache, np.ndarray] | None:
        """The copied cache and each household's row in it when ``w`` reads no attribute the copies vary in."""
        if self._copies_of is None or self._copies_of[1].intersection(w.attrs):
            return None
        return self._copies_of[0], self._copies_of[2]

    @_locked
    def matrix(self, w: Workload) -> sp.csr_matrix:
        A = self._A.get(w)
        if A is None:
            copied = self._copied(w)
            if copied is None:
                A = incidence_matrix(self.data, w)
            else:
                base = copied[0].matrix(w)
                A = sp.hstack([base if rows is None else base[:, rows] for _, _, rows in self._runs], format="csr")
            A = self._A[w] = A
        return A

    @_locked
    def patterns(self, w: Workload) -> Patterns:
        P = self._patterns.get(w)
        if P is None:
            copied = self._copied(w)
            if copied is None:
                P = incidence_patterns(self.data, w, self.matrix(w))
            else:  # the same distinct columns, first met among the copied households: the same numbering
                base = copied[0].patterns(w)
                P = Patterns(base.matrix, base.pattern_of[copied[1]])
            self._patterns[w] = P
        return P

    @_locked
    def joint_patterns(self, workloads: Sequence[Workload]) -> tuple[sp.csc_matrix, np.ndarray]:
        """The households grouped by their column of the stacked incidence of ``workloads`` (equal
        in every one of them): ``(matrix, pattern_of)`` with ``matrix`` (Σ cells × U) holding one
        column per pattern and ``pattern_of`` (N_G,) each household's pattern, so that
        ``vstack(incidences)[:, h] == matrix[:, pattern_of[h]]``. Exact: the per-workload
        patterns (:func:`incidence_patterns`) are combined by successive 1-D ``np.unique``.
        ``matrix`` is the CSC view of the kept pattern-major CSR matrix (U × Σ cells)."""
        P, pattern_of = self._by_pattern(workloads)
        return P.T, pattern_of

    def _by_pattern(self, workloads: Sequence[Workload]) -> tuple[sp.csr_matrix, np.ndarray]:
        """:meth:`joint_patterns` kept pattern-major: ``(U × Σ cells CSR, pattern_of)``."""
        key = tuple(workloads)
        # a marked list lives in the kept lists only (keep moves it there), any other in the last-used
        store, limit = (self._kept, self.KEPT_CACHE) if key in self._recurring else (self._joint, self.JOINT_CACHE)
        got = store.get(key)
        if got is None:
            # extend the longest cached prefix (the adaptive rounds add one workload at a time)
            n = next((k for k in range(len(key) - 1, 0, -1) if self._cached(key[:k]) is not None), 0)
            found = self._cached(key[:n]) if n else None
            prefix, prefix_of = found if found is not None else (None, None)
            gid, first = group_rows([self.patterns(w).pattern_of for w in key[n:]], self.data.n_households, prefix_of)
            # one row per pattern: the prefix's row of its pattern, then each new workload's
            blocks = [] if prefix is None or prefix_of is None else [prefix[prefix_of[first]]]
            blocks += [self.patterns(w).matrix[self.patterns(w).pattern_of[first]] for w in key[n:]]
            by_pattern = hstack_rows(blocks) if blocks else sp.csr_matrix((first.size, 0))
            # one orientation kept, pattern-major: a pattern's row holds its few cells, so both
            # products read a vector of cells that stays in cache — Mᵀλ gathers from λ (CSR) and
            # M q scatters into it (the CSC view) — where the cell-major orientation gathered from
            # and scattered into a vector of patterns, at twice the time. Either orientation adds a
            # cell's patterns, and a pattern's cells, in ascending order: the same sums, bit for bit
            got = store[key] = (by_pattern, gid)
        store.move_to_end(key)
        while len(store) > limit:
            store.popitem(last=False)
        return got

    def _cached(self, key: tuple[Workload, ...]) -> tuple[sp.csr_matrix, np.ndarray] | None:
        """The kept or last-used grouping of ``key``, None when neither holds it."""
        return self._kept.get(key, self._joint.get(key))

    @_locked
    def keep(self, workloads: Sequence[Workload]) -> None:
        """Mark ``workloads`` as a list every node on this support groups (:data:`KEPT_CACHE`):
        its joint patterns, once built, are kept apart from the last-used lists, the last
        ``KEPT_CACHE`` lists so marked, until :meth:`forget_joints`."""
        key = tuple(workloads)
        self._recurring.add(key)
        if key in self._joint:
            self._kept[key] = self._joint.pop(key)
        if key in self._kept:
            self._kept.move_to_end(key)
            while len(self._kept) > self.KEPT_CACHE:
                self._kept.popitem(last=False)

    @_locked
    def joint_incidence(self, workloads: Sequence[Workload]) -> tuple[sp.csc_matrix, sp.csr_matrix, np.ndarray]:
        """:meth:`joint_patterns` with the transpose of its matrix: ``(matrix, its transpose,
        pattern_of)``, the matrix a CSC view of the kept pattern-major CSR transpose — what every
        MAP fit on these workloads multiplies by (``engine.synthesis._map_update``)."""
        P, pattern_of = self._by_pattern(workloads)
        return P.T, P, pattern_of

    @_locked
    def live_incidence(self, workloads: Sequence[Workload], live: np.ndarray) -> tuple[sp.csc_matrix, sp.csr_matrix]:
        """:meth:`joint_incidence`'s matrix and its transpose restricted to the patterns ``live``
        (ascending): ``(matrix[:, live], transpose[live])``, the second CSR, the first its CSC view
        (one copy kept, as in :meth:`joint_patterns`). The last restriction of each workload list
        is kept, for the last ``LIVE_CACHE`` lists: the fits that share a prior (every candidate
        strength of a played state, every PUMA under one state posterior) share its zero-mass
        patterns."""
        key = tuple(workloads)
        got = self._live.get(key)
        if got is None or not np.array_equal(got[0], live):
            got = self._live[key] = (np.array(live, copy=True), self._by_pattern(key)[0][live])
        self._live.move_to_end(key)
        while len(self._live) > self.LIVE_CACHE:
            self._live.popitem(last=False)
        return got[1].T, got[1]

    @_locked
    def forget_joints(self) -> None:
        """Drop the kept joint incidences, their restrictions and pattern pairs (the per-workload
        incidences and patterns stay): for a caller that knows the workload lists it grouped will
        not come again."""
        self._joint.clear()
        self._kept.clear()
        self._recurring.clear()
        self._live.clear()
        self._pairs.clear()

    @_locked
    def pattern_pairs(self, rows: Sequence[Workload], cols: Sequence[Workload]) -> PatternPairs:
        """The households grouped by their (pattern of ``rows``, pattern of ``cols``) pair
        (:meth:`joint_patterns` of each list), as a fixed CSR structure: the mass of every pair
        for household weights ``q`` is then one ``bincount`` (:meth:`PatternPairs.matrix`), the
        same structure serving every PUMA of a state."""
        key = (tuple(rows), tuple(cols))
        got = self._pairs.get(key)
        if got is None:
            B, pb = self.joint_patterns(rows)
            A, pa = self.joint_patterns(cols)
            n_rows, n_cols = B.shape[1], A.shape[1]
            pairs, inverse = np.unique(pb.astype(np.int64) * n_cols + pa, return_inverse=True)  # sorted: row, then column
            indptr = np.concatenate(([0], np.cumsum(np.bincount(pairs // n_cols, minlength=n_rows)))).astype(np.int64)
            got = self._pairs[key] = PatternPairs(indptr, (pairs % n_cols).astype(np.int64), inverse.reshape(-1), (n_rows, n_cols))
        self._pairs.move_to_end(key)
        while len(self._pairs) > self.JOINT_CACHE:
            self._pairs.popitem(last=False)
        return got

    @_locked
    def partition_cells(self, w: Workload) -> np.ndarray:
        """Cell of every household for a partition workload (group level, S_I = ∅)."""
        if not w.is_partition():
            raise ValueError(f"{w.id} is not a partition workload")
        c = self._cells.get(w)
        if c is None:
            c = self._cells[w] = group_cells(self.data, w.group_attrs)
        return c

    def answer(self, w: Workload, weights: np.ndarray) -> np.ndarray:
        """Σ_h weights_h · A[:, h] (counts if weights are counts, proportions if a distribution).

        On copies (``copies_of``) of a workload that reads no varied attribute, the copied cache's
        incidence is applied to each run's weights in turn (a run of some households' copies: its
        weights added onto their rows first), accumulating into one output: for runs of all the
        households, the additions of ``matrix(w) @ weights`` in their order (each row of the copied
        matrix holds the runs' entries one after the other), without building that matrix — on a
        widened support the copied incidences were most of its cache."""
        x = np.asarray(weights, dtype=np.float64)
        copied = None if w in self._A else self._copied(w)
        if copied is None:
            out: np.ndarray = self.matrix(w) @ x
            return out
        A = copied[0].matrix(w)
        n = A.shape[1]
        if x.shape != (self.data.n_households,):
            raise ValueError(f"{w.id}: weights of shape {x.shape}, expected ({self.data.n_households},)")
        y = np.zeros(A.shape[0])
        for lo, hi, rows in self._runs:  # csr_matvec adds onto y[i], row entry after row entry
            block = np.ascontiguousarray(x[lo:hi]) if rows is None else np.bincount(rows, weights=x[lo:hi], minlength=n)
            # a run without weight adds only zeros (a copy outside the mixture, or a mixture
            # component on one run): skipping it leaves every sum as it was
            if block.any():
                _sparsetools.csr_matvec(A.shape[0], n, A.indptr, A.indices, A.data, block, y)
        return y

    def prepare(self, workloads: Iterable[Workload]) -> IncidenceCache:
        for w in workloads:
            self.matrix(w)
            if not w.is_partition():
                self.patterns(w)
            else:
                self.partition_cells(w)
        return self


class CandidateAnswers:
    """Answers of many candidate workloads on one set of households for changing weights.

    The counted persons (and the households) are grouped once by their full tuple of attribute
    codes — households and persons with equal codes fall in the same cell of every candidate —
    and each candidate's cell of every such pattern is computed once and kept (in the smallest
    integer type that holds its cells). A round then costs one weighted ``bincount`` over the
    persons (their weights summed per pattern) and one per candidate over the patterns, a few
    times fewer than the persons (:func:`answer` rebuilds the cells of every workload
    per call). Person-level candidates must share one ``first``."""

    def __init__(self, data: HierarchicalData, candidates: Sequence[Workload]):
        firsts = {w.first for w in candidates if w.level == "person"}
        if len(firsts) > 1 or any((w.level == "group" and w.person_attrs) or w.normalised for w in candidates):
            raise ValueError("candidates: plain person-level counts with one `first`, or group-level partitions")
        self.domain, self.n_households = data.domain, data.n_households
        first = firsts.pop() if firsts else 0
        keep = np.flatnonzero(data.person_slot < first) if first else np.arange(data.n_persons)
        d = data.domain
        group_cols = [data.group[:, j].astype(np.int64) for j in range(len(d.group))]
        self.household_pattern, group_first = group_rows(group_cols, data.n_households)
        household = data.person_household[keep]
        person_cols = [c[household] for c in group_cols] + [data.person[keep, j].astype(np.int64) for j in range(len(d.person))]
        self.person_pattern, person_first = group_rows(person_cols, keep.size)
        self.person_household = household
        # each attribute's code at every pattern's first member
        self.group_codes = {a.name: c[group_first] for a, c in zip(d.group, group_cols)}
        self.person_codes = {a.name: c[person_first] for a, c in zip([*d.group, *d.person], person_cols)}
        self._cells: dict[Workload, np.ndarray] = {}

    def _cells_of(self, w: Workload) -> np.ndarray:
        got = self._cells.get(w)
        if got is None:
            d = self.domain
            codes = self.group_codes if w.level == "group" else self.person_codes
            cells = np.zeros(next(iter(codes.values())).size, dtype=np.int64)
            for a in w.attrs:
                size = d.group_attribute(a).size if a in w.group_attrs else d.person_attribute(a).size
                cells *= size
                cells += codes[a]
            got = self._cells[w] = cells.astype(np.min_scalar_type(max(w.n_cells(d) - 1, 0)))
        return got

    def answers(self, workloads: Sequence[Workload], weights: np.ndarray) -> np.ndarray:
        """Σ_h weights_h · A_w[:, h] for every workload, concatenated (as :func:`answer`)."""
        wt = np.asarray(weights, dtype=np.float64)
        if wt.shape != (self.n_households,):
            raise ValueError(f"{wt.shape} weights for {self.n_households} households")
        per_group = np.bincount(self.household_pattern, weights=wt)
        per_person = np.bincount(self.person_pattern, weights=wt[self.person_household])
        return np.concatenate([np.bincount(self._cells_of(w), weights=per_person if w.level == "person" else per_group,
                                           minlength=w.n_cells(self.domain)) for w in workloads])


def exact_answers(data: HierarchicalData, workloads: Sequence[Workload]) -> list[np.ndarray]:
    """The exact counts of every workload on ``data``, equal to :func:`answer` per
    workload: through :class:`CandidateAnswers` (one grouping of the persons for all) when the
    workloads allow it (person level with one ``first``, or group-level partitions), else one by one."""
    firsts = {w.first for w in workloads if w.level == "person"}
    if len(firsts) > 1 or any((w.level == "group" and w.person_attrs) or w.normalised for w in workloads):
        return [np.asarray(answer(data, w), dtype=np.float64) for w in workloads]
    flat = CandidateAnswers(data, workloads).answers(workloads, np.ones(data.n_households))
    bounds = np.cumsum([0] + [w.n_cells(data.domain) for w in workloads])
    return [flat[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
