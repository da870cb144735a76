"""Vectorised / sparse workload answers vs a pure-Python reference, on data and weighted supports."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

from engine.data._hierarchical_data import HierarchicalData
from engine.queries._queries import (
    NORM_SCALE,
    IncidenceCache,
    Workload,
    answer,
    centred_gram,
    group_rows,
    incidence_matrix,
    incidence_patterns,
    node_answers,
    normalise_columns,
    normalised_answer,
    pattern_index,
)
from engine.queries._support import Support
from tests.engine._support_testdata import all_workloads, brute_force_answer, random_data, small_domain

DOMAIN = small_domain(M=4)
DATA = random_data(DOMAIN, 60, seed=3)
WORKLOADS = all_workloads(DOMAIN, max_k=3)


def test_workload_kinds_are_all_covered():
    kinds = {(w.level, bool(w.group_attrs), bool(w.person_attrs)) for w in WORKLOADS}
    assert kinds == {
        ("group", True, False),   # partitions
        ("group", True, True),    # group-level "contains"
        ("group", False, True),   # "contains" with S_G = ∅
        ("person", True, True),
        ("person", False, True),
        ("person", True, False),  # persons counted by their household's attributes
    }


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.id)
def test_answers_match_brute_force(w: Workload):
    rng = np.random.default_rng(zlib.crc32(w.id.encode()))
    weights = rng.random(DATA.n_households)
    ref = brute_force_answer(DATA, w)
    ref_w = brute_force_answer(DATA, w, weights)
    np.testing.assert_allclose(answer(DATA, w), ref)
    np.testing.assert_allclose(answer(DATA, w, weights), ref_w)
    A = incidence_matrix(DATA, w)
    assert A.shape == (w.n_cells(DOMAIN), DATA.n_households)
    np.testing.assert_allclose(A @ np.ones(DATA.n_households), ref)
    np.testing.assert_allclose(A @ weights, ref_w)
    s = Support(DATA, weights)
    np.testing.assert_allclose(s.answer(w), ref_w)
    total = weights.sum() if w.level == "group" else weights @ DATA.sizes
    np.testing.assert_allclose(s.normalised_answer(w), ref_w / total)
    n_total = DATA.n_households if w.level == "group" else DATA.n_persons
    np.testing.assert_allclose(normalised_answer(DATA, w), ref / n_total)
    if w.level == "group":
        assert set(np.unique(A.data)) <= {1.0}
        if w.is_partition():
            np.testing.assert_array_equal(np.asarray(A.sum(axis=0)).ravel(), 1.0)


FIRST = [Workload("person", w.group_attrs, w.person_attrs, k) for w in WORKLOADS if w.level == "person" and len(w.attrs) <= 2
         for k in (1, 2, 3)]


@pytest.mark.parametrize("w", FIRST, ids=lambda w: w.id)
def test_first_persons_workloads_match_brute_force(w: Workload):
    weights = np.random.default_rng(zlib.crc32(w.id.encode())).random(DATA.n_households)
    np.testing.assert_allclose(answer(DATA, w), brute_force_answer(DATA, w))
    np.testing.assert_allclose(Support(DATA, weights).answer(w), brute_force_answer(DATA, w, weights))
    every = Workload("person", w.group_attrs, w.person_attrs)
    assert answer(DATA, w).sum() == np.minimum(DATA.sizes, w.first).sum() < answer(DATA, every).sum()
    assert Workload.from_id(w.id) == w and w.id.endswith(f";first={w.first}")
    P = incidence_patterns(DATA, w)
    assert (P.matrix[P.pattern_of].T != incidence_matrix(DATA, w)).nnz == 0


NORMALISED = [Workload(w.level, w.group_attrs, w.person_attrs, k, True) for w in WORKLOADS if not w.is_partition() and len(w.attrs) <= 2
              for k in ((0, 2) if w.level == "person" else (0,))]


@pytest.mark.parametrize("w", NORMALISED, ids=lambda w: w.id)
def test_normalised_workloads_match_brute_force(w: Workload):
    """Every household's column rescaled to ⌊S·k/‖k‖₂⌋ (the pure-Python reference computes it per
    household with math.isqrt): answers, weighted answers, the incidence and its patterns; every
    column's norm is at most S and a household with one counted cell has exactly S there."""
    weights = np.random.default_rng(zlib.crc32(w.id.encode())).random(DATA.n_households)
    np.testing.assert_array_equal(answer(DATA, w), brute_force_answer(DATA, w))
    np.testing.assert_allclose(Support(DATA, weights).answer(w), brute_force_answer(DATA, w, weights))
    A = incidence_matrix(DATA, w)
    norms = np.sqrt(np.asarray(A.multiply(A).sum(axis=0)).ravel())
    assert norms.max() <= NORM_SCALE and np.all(A.data == np.round(A.data))
    single = np.diff(A.tocsc().indptr) == 1
    assert single.any() and np.all(norms[single] == NORM_SCALE)
    P = incidence_patterns(DATA, w)
    assert (P.matrix[P.pattern_of].T != A).nnz == 0
    assert Workload.from_id(w.id) == w and w.id.endswith(";norm")


@pytest.mark.parametrize("w", [w for w in WORKLOADS if len(w.attrs) <= 2] + NORMALISED, ids=lambda w: w.id)
def test_node_answers_are_each_nodes_own_answer(w: Workload):
    """Every node's row of ``node_answers`` is, bit for bit, ``answer`` of that node's households
    alone (brute force: the node's households taken out); households in no node (−1) count nowhere,
    and a node without households answers zeros."""
    rng = np.random.default_rng(zlib.crc32(w.id.encode()))
    node_of = rng.integers(-1, 4, DATA.n_households)  # nodes 0..3, −1 in none; node 4 holds no household
    rows = node_answers(DATA, w, node_of, 5)
    assert rows.shape == (5, w.n_cells(DOMAIN)) and rows.dtype == np.float64
    for j in range(5):
        np.testing.assert_array_equal(rows[j], answer(DATA.take(np.flatnonzero(node_of == j)), w))
    assert not rows[4].any()


def test_normalise_columns_is_exact_at_integer_boundaries():
    """⌊S·k/‖k‖₂⌋ where S·k/‖k‖₂ is an integer (counts 3 and 4: ‖k‖ = 5, 64·3/5 is not, but scale
    5 gives 3 and 4 exactly) and where floating point would round just above one (‖(1, 1)‖ = √2)."""
    h = np.array([0, 0, 1, 1, 2])
    k = np.array([3, 4, 1, 1, 2])
    np.testing.assert_array_equal(normalise_columns(h, k, 3, scale=5), [3, 4, 3, 3, 5])
    np.testing.assert_array_equal(normalise_columns(h, k, 3, scale=64), [38, 51, 45, 45, 64])
    big = np.arange(1, 9)
    v = normalise_columns(np.zeros(8, dtype=int), big, 1, scale=1 << 20)
    assert int((v * v).sum()) <= (1 << 20) ** 2
    np.testing.assert_array_equal(v, [math.isqrt((1 << 40) * int(x) ** 2 // int((big**2).sum())) for x in big])


def test_from_id_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown workload option"):
        Workload.from_id("person:|SEX;half")
    assert Workload.from_id("person:NP|SEX;first=2;norm") == Workload("person", ("NP",), ("SEX",), 2, True)


def test_first_persons_is_validated():
    assert Workload("person", (), ("SEX",), DOMAIN.max_size).sensitivity(DOMAIN, "household") == (DOMAIN.max_size,) * 2
    with pytest.raises(ValueError, match="person-level"):
        Workload("group", (), ("SEX",), 2)
    with pytest.raises(ValueError, match="non-negative"):
        Workload("person", (), ("SEX",), -1)


@pytest.mark.parametrize("w", [w for w in WORKLOADS if len(w.attrs) <= 2], ids=lambda w: w.id)
def test_patterns_reconstruct_the_incidence(w: Workload):
    A = incidence_matrix(DATA, w)
    P = incidence_patterns(DATA, w, A)
    recon = P.matrix[P.pattern_of].T
    assert (recon != A).nnz == 0
    # patterns are distinct
    dense = P.matrix.toarray()
    assert np.unique(dense, axis=0).shape[0] == P.n_patterns
    x = np.random.default_rng(0).random(DATA.n_households)
    np.testing.assert_allclose(P.matrix.T @ P.mass(x), A @ x)


def test_joint_patterns_group_households_with_equal_stacked_columns():
    """Households share a joint pattern exactly when their columns agree in every workload."""
    ws = [w for w in WORKLOADS if len(w.attrs) <= 2][:4]
    B, pattern_of = IncidenceCache(DATA).joint_patterns(ws)
    stacked = sp.vstack([incidence_matrix(DATA, w) for w in ws]).toarray()
    np.testing.assert_array_equal(B.toarray()[:, pattern_of], stacked)  # every household's column
    assert np.unique(B.toarray(), axis=1).shape[1] == B.shape[1]  # distinct patterns
    assert B.shape[1] < DATA.n_households  # the test data has repeated columns: the grouping is not trivial


def test_pattern_pairs_sum_the_weights_of_each_pair_of_patterns():
    """W[v, u] = Σ q over the households of row pattern v and column pattern u, equal to a
    duplicate-summing COO build; the structure is cached for the next weights."""
    ws = [w for w in WORKLOADS if len(w.attrs) <= 2]
    rows, cols = ws[:2], ws[2:4]
    cache = IncidenceCache(DATA)
    _, pb = cache.joint_patterns(rows)
    _, pa = cache.joint_patterns(cols)
    pairs = cache.pattern_pairs(rows, cols)
    for seed in range(2):
        q = np.random.default_rng(seed).random(DATA.n_households)
        want = sp.csr_matrix((q, (pb, pa)), shape=pairs.shape).toarray()
        np.testing.assert_allclose(pairs.matrix(q).toarray(), want, rtol=1e-12)
    assert cache.pattern_pairs(rows, cols) is pairs
    assert len(pairs.indices) < DATA.n_households  # households share pairs: the structure is smaller


def test_joint_patterns_extended_from_a_cached_prefix_equal_a_fresh_build():
    """The adaptive rounds add one workload at a time: the extension of a cached prefix is the
    same grouping and matrix as building the list from nothing; the cache stays bounded."""
    ws = [w for w in WORKLOADS if len(w.attrs) <= 2][:5]
    grown = IncidenceCache(DATA)
    for k in range(1, len(ws) + 1):
        B, pattern_of = grown.joint_patterns(ws[:k])
        F, fresh_of = IncidenceCache(DATA).joint_patterns(ws[:k])
        stacked = sp.vstack([incidence_matrix(DATA, w) for w in ws[:k]]).toarray()
        np.testing.assert_array_equal(B.toarray()[:, pattern_of], stacked)
        assert B.shape == F.shape and np.unique(B.toarray(), axis=1).shape[1] == B.shape[1]
        # the same partition of the households (pattern ids may be numbered differently)
        assert np.unique(np.stack([pattern_of, fresh_of]), axis=1).shape[1] == F.shape[1]
    small = IncidenceCache(DATA)
    small.JOINT_CACHE = 2
    for k in range(1, len(ws) + 1):
        small.joint_patterns(ws[:k])
    assert len(small._joint) == 2


def test_kept_lists_outlive_the_last_used_ones_until_forgotten():
    """A list marked with ``keep`` (before or after it is grouped) stays, the same arrays, while
    more lists than the cache of last-used ones holds are grouped; the last ``KEPT_CACHE`` marked
    lists are kept; ``forget_joints`` drops them. Negative control: an unmarked list is pushed out."""
    ws = [w for w in WORKLOADS if len(w.attrs) <= 2][:5]
    cache = IncidenceCache(DATA)
    cache.JOINT_CACHE, cache.KEPT_CACHE = 1, 2
    early, plain = cache._by_pattern(ws[:1]), cache._by_pattern(ws[:2])
    cache.keep(ws[:2])  # marked after grouping: moved to the kept lists
    cache.keep(ws[:3])  # marked before
    late = cache._by_pattern(ws[:3])
    for k in range(4, len(ws) + 1):
        cache.joint_patterns(ws[:k])
    assert cache._by_pattern(ws[:2]) is plain and cache._by_pattern(ws[:3]) is late
    assert cache._by_pattern(ws[:1]) is not early  # pushed out, grouped again
    cache.keep(ws[:4])
    cache.joint_patterns(ws[:4])
    assert list(cache._kept) == [tuple(ws[:3]), tuple(ws[:4])]  # the last two marked
    cache.forget_joints()
    assert not cache._kept and not cache._joint and cache._by_pattern(ws[:3]) is not late


@pytest.mark.parametrize("high", [3, 70_000, 2**31])
def test_group_rows_numbers_the_groups_in_lexicographic_order(high):
    """Exact grouping, groups numbered by the rows' lexicographic order after ``start``, however
    many columns fit in one fused key (large codes: one column per key; small: all at once)."""
    rng = np.random.default_rng(high)
    n = 4000
    start = rng.integers(0, 40, n)
    cols = [rng.integers(0, 2, n) * (high - 1) for _ in range(6)]  # codes 0 and high − 1: the radix is high
    gid, first = group_rows(cols, n, start)
    rows = np.stack([start, *cols], axis=1)
    uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
    np.testing.assert_array_equal(gid, inverse.reshape(-1))
    np.testing.assert_array_equal(rows[first], uniq)
    assert 1 < uniq.shape[0] < n  # neither trivial nor all distinct


def test_live_incidence_is_the_joint_incidence_restricted_to_each_live_set():
    """The restriction to the live patterns (those of positive prior mass) is kept for the next
    fit with the same zero-mass patterns and rebuilt, not reused, when they change."""
    ws = [w for w in WORKLOADS if len(w.attrs) <= 2][:3]
    cache = IncidenceCache(DATA)
    M, Mt, _ = cache.joint_incidence(ws)
    U = M.shape[1]
    first, second = np.arange(0, U, 2), np.arange(1, U)
    for live in (first, second, first):
        A, At = cache.live_incidence(ws, live)
        np.testing.assert_array_equal(At.toarray(), Mt.toarray()[live])
        np.testing.assert_array_equal(A.toarray(), M.toarray()[:, live])
    again = cache.live_incidence(ws, first.copy())
    assert again[1] is At and np.shares_memory(again[0].data, At.data)  # the same live set: the kept restriction, the matrix its CSC view
    for k in range(1, len(ws) + 1):  # a copy per workload list: only the last LIVE_CACHE lists are kept
        cache.live_incidence(ws[:k], np.arange(1, cache.joint_incidence(ws[:k])[0].shape[1]))
    assert len(cache._live) == cache.LIVE_CACHE


def test_cache_builds_each_incidence_once_and_is_shared():
    s = Support.from_data(DATA)
    w = Workload("person", ("TEN",), ("AGE",))
    A1 = s.incidence(w)
    s2 = s.with_weights(np.arange(DATA.n_households, dtype=float))
    assert s2.incidence(w) is A1
    assert s2.cache is s.cache
    np.testing.assert_allclose(s2.answer(w), answer(DATA, w, np.arange(DATA.n_households)))
    c = IncidenceCache(DATA).prepare([w, Workload("group", ("TEN", "NP"))])
    assert c.partition_cells(Workload("group", ("TEN", "NP"))).shape == (DATA.n_households,)
    with pytest.raises(ValueError):
        c.partition_cells(w)


def test_support_validates_weights():
    with pytest.raises(ValueError):
        Support(DATA, np.ones(3))
    with pytest.raises(ValueError):
        Support(DATA, -np.ones(DATA.n_households))
    s = Support.from_data(DATA)
    assert math.isclose(s.total_weight, 1.0)
    assert math.isclose(s.n_persons, DATA.sizes.mean())


# -- sensitivities: observed change on random neighbouring datasets never exceeds the bound ------
def _remove_household(data: HierarchicalData, h: int) -> HierarchicalData:
    return data.select(np.arange(data.n_households) != h)


def _worst_case_household(domain, rng, same: bool) -> HierarchicalData:
    """One household of M persons, all identical (person-level worst case) or all different."""
    M = domain.max_size
    group = [int(rng.integers(a.size)) for a in domain.group]
    group[domain.group_index(domain.size_attribute)] = M - 1
    if same:
        person = np.tile([int(rng.integers(a.size)) for a in domain.person], (M, 1))
    else:
        person = np.stack([np.arange(M) % a.size for a in domain.person], axis=1)
    return HierarchicalData.from_arrays(domain, np.zeros((1, len(domain.geography))), [group], person, [0, M])


def _remove_person(data: HierarchicalData, h: int, rng) -> HierarchicalData:
    """Person unit: drop one person of household h and let every derived household attribute change."""
    d = data.domain
    drop = int(data.person_offsets[h] + rng.integers(data.sizes[h]))
    keep = np.ones(data.n_persons, bool)
    keep[drop] = False
    sizes = data.sizes.copy()
    sizes[h] -= 1
    group = data.group.copy()
    for j, a in enumerate(d.group):
        group[h, j] = rng.integers(a.size)
    group[h, d.group_index(d.size_attribute)] = sizes[h] - 1
    return HierarchicalData.from_arrays(
        d, data.geo, group, data.person[keep], np.concatenate([[0], np.cumsum(sizes)])
    )


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.id)
def test_sensitivity_bounds_hold_on_neighbours(w: Workload):
    rng = np.random.default_rng(zlib.crc32(w.id.encode()) + 1)
    base = answer(DATA, w)
    l1_h, l2_h = w.sensitivity(DOMAIN, "household")
    l1_p, l2_p = w.sensitivity(DOMAIN, "person")
    worst_l1 = 0.0
    for h in rng.choice(DATA.n_households, 15, replace=False):
        diff = answer(_remove_household(DATA, int(h)), w) - base
        assert np.abs(diff).sum() <= l1_h + 1e-9 and np.linalg.norm(diff) <= l2_h + 1e-9
    for same in (True, False):
        big = HierarchicalData.concat([DATA, _worst_case_household(DOMAIN, rng, same)])
        diff = answer(big, w) - base
        worst_l1 = max(worst_l1, np.abs(diff).sum())
        assert np.abs(diff).sum() <= l1_h + 1e-9 and np.linalg.norm(diff) <= l2_h + 1e-9
    # the household-unit bound is attained by one of the two worst-case households
    assert worst_l1 == pytest.approx(l1_h)
    multi = np.flatnonzero(DATA.sizes >= 2)
    for h in rng.choice(multi, 15, replace=False):
        diff = answer(_remove_person(DATA, int(h), rng), w) - base
        assert np.abs(diff).sum() <= l1_p + 1e-9 and np.linalg.norm(diff) <= l2_p + 1e-9


def test_outer_in_place_in_bands_is_the_whole_expression_bit_for_bit():
    """The banded in-place ``M -= outer(x, y)`` and ``M /= outer(x, y)`` (the interval estimates'
    memory-saving form) equal the one-expression results to the last bit, over several bands."""
    from engine.queries._queries import OUTER_ROWS, outer_in_place

    rng = np.random.default_rng(4)
    n = 2 * OUTER_ROWS + 37
    M, x, y = rng.normal(size=(n, n)), rng.random(n) + 0.1, rng.random(n) + 0.1
    got = M.copy()
    outer_in_place(got, x, y)
    np.testing.assert_array_equal(got, M - np.outer(x, y))
    got = M.copy()
    outer_in_place(got, x, y, np.divide)
    np.testing.assert_array_equal(got, M / np.outer(x, y))


def test_centred_gram_is_the_answers_covariance_under_the_weights():
    """Brute force, dense: A diag(w) Aᵀ − (A w)(A w)ᵀ on a workload pair's stacked incidence."""
    ws = [Workload("group", ("TEN",)), Workload("person", ("TEN",), ("AGE",))]
    A = sp.vstack([incidence_matrix(DATA, w) for w in ws], format="csr")
    w = np.random.default_rng(3).random(DATA.n_households)
    w /= w.sum()
    D = A.toarray()
    np.testing.assert_allclose(centred_gram(A, w), D @ np.diag(w) @ D.T - np.outer(D @ w, D @ w), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_lower_centred_gram_keeps_the_products_lower_triangle_bit_for_bit(monkeypatch, fmt):
    """In bands (here of 7 rows, against 31): the lower triangle and the diagonal are the whole
    product's, value for value (the solvers that read it must give the same result), and the upper
    triangle is its mirror; from either sparse layout (the interval estimates pass a CSC selection of
    rows), with weights of 0 among them. Reference: the product as scipy forms it, A·diag(w)·Aᵀ."""
    import engine.queries._queries as queries
    rng = np.random.default_rng(5)
    A = sp.random(31, 400, density=0.2, random_state=6, format=fmt, data_rvs=lambda n: rng.integers(1, 4, n).astype(float))
    w = rng.random(400)
    w[rng.random(400) < 0.1] = 0.0
    w /= w.sum()
    whole = centred_gram(A, w)
    a = A @ w
    np.testing.assert_array_equal(whole, (A.multiply(w[None, :]).tocsr() @ A.T.tocsr()).toarray() - np.outer(a, a))
    monkeypatch.setattr(queries, "GRAM_BAND", 7)
    banded = centred_gram(A, w, lower=True)
    low = np.tril_indices(31)
    np.testing.assert_array_equal(banded[low], whole[low])
    np.testing.assert_allclose(banded, banded.T, rtol=0, atol=0)
    np.testing.assert_allclose(banded, whole, rtol=1e-13, atol=1e-16)


def test_hstack_rows_is_scipys_hstack_array_for_array():
    """The joint incidence's stacking (``hstack_rows``) against scipy's: the same indptr, indices
    and data, with an empty block, empty rows and integer blocks among them; blocks of different
    row counts are refused."""
    from engine.queries._queries import hstack_rows

    rng = np.random.default_rng(8)
    blocks = [sp.random(40, k, density=d, random_state=int(rng.integers(1 << 30)), format="csr") for k, d in ((5, 0.3), (9, 0.0), (3, 0.5), (12, 0.1))]
    counts = rng.integers(0, 3, (40, 4)).astype(np.uint8)
    counts[:10] = 0
    blocks = [b.tolil() for b in blocks]
    for b in blocks:
        b[:10] = 0  # rows 0-9 empty in every block
    blocks = [b.tocsr() for b in blocks] + [sp.csr_matrix(counts)]
    got, want = hstack_rows(blocks), sp.hstack(blocks, format="csr", dtype=np.float64)
    for a, b in ((got.indptr, want.indptr), (got.indices, want.indices), (got.data, want.data)):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    assert got.shape == want.shape and (np.diff(got.indptr) == 0).any()
    with pytest.raises(ValueError, match="one row count"):
        hstack_rows([blocks[0], sp.csr_matrix((39, 2))])


def test_forgotten_joint_incidences_are_rebuilt_array_for_array():
    """``forget_joints`` drops the kept joint incidences (and restrictions, pattern pairs) but not
    the per-workload incidences; a list grouped again from nothing is the same matrix, array for
    array and column for column, as the one extended from its cached prefix: a worker that forgot
    its lists between stages fits on the same matrices. Negative control: the columns of another
    list differ, so the comparison is not vacuous."""
    ws = [w for w in WORKLOADS if len(w.attrs) <= 2][:4]
    cache = IncidenceCache(DATA)
    for k in range(1, len(ws) + 1):
        extended, ext_of = cache.joint_patterns(ws[:k])
    cache.live_incidence(ws, np.arange(1, extended.shape[1]))
    cache.pattern_pairs(ws[:1], ws)
    kept = dict(cache._A)
    cache.forget_joints()
    assert not cache._joint and not cache._live and not cache._pairs and cache._A == kept
    fresh, fresh_of = cache.joint_patterns(ws)
    for a, b in ((extended.indptr, fresh.indptr), (extended.indices, fresh.indices), (extended.data, fresh.data), (ext_of, fresh_of)):
        np.testing.assert_array_equal(a, b)
    other, _ = IncidenceCache(DATA).joint_patterns(ws[1:])
    assert other.shape != fresh.shape or not np.array_equal(other.indices, fresh.indices)


def test_pattern_numbers_are_int32_and_select_as_int64_did():
    """A workload's pattern numbers are kept as int32 (half the memory on every household of a
    support): the same numbers as the int64 grouping, so every gather and sum over them is the
    same; a support too large for int32 keeps int64."""
    w = Workload("person", ("TEN",), ("AGE",))
    P = incidence_patterns(DATA, w)
    assert P.pattern_of.dtype == np.int32
    gid, _ = group_rows([P.pattern_of.astype(np.int64)], DATA.n_households)
    np.testing.assert_array_equal(gid, P.pattern_of)  # numbered 0..U-1 in order: the grouping itself
    x = np.random.default_rng(3).random(P.n_patterns)
    np.testing.assert_array_equal(x[P.pattern_of], x[P.pattern_of.astype(np.int64)])
    assert pattern_index(2**31 - 1) is np.int32 and pattern_index(2**31) is np.int64

