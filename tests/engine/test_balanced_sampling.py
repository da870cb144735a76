"""Balanced draws (engine.synthesis._balanced_sampling): the balance marginals against a brute force, the
exchange search against every single swap on small pools, and statistical tests of the draw
(balance far tighter than the systematic draw's, every household drawn about n·q times)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from engine.queries._queries import Workload, answer, incidence_matrix
from engine.queries._support import Support
from engine.synthesis._balanced_sampling import BalanceTargets, balance_workloads, balanced_draw, balanced_draws, systematic_positions
from engine.synthesis._household_sampling import household_order, sample_households, sample_sibling_households
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)


def test_balance_workloads_are_every_pair_and_the_persons_triples():
    ws = balance_workloads(DOMAIN)
    g, p = [a.name for a in DOMAIN.group], [a.name for a in DOMAIN.person]
    assert [w for w in ws if w.level == "group"] == [Workload("group", pair) for pair in itertools.combinations(g, 2)]
    assert {w.person_attrs for w in ws if w.level == "person" and not w.group_attrs} == (
        set(itertools.combinations(p, 2)) | set(itertools.combinations(p, 3)))
    assert {(w.group_attrs, w.person_attrs) for w in ws if w.group_attrs and w.person_attrs} == (
        {((a,), (b,)) for a in g for b in p} | {(("NP",), pair) for pair in itertools.combinations(p, 2)})
    assert len(ws) == len(set(ws)) and all(w.first == 0 and not w.normalised for w in ws)  # every person counts


def test_balance_targets_equal_the_workloads_answers():
    data = random_data(DOMAIN, 150, seed=3)
    bt = BalanceTargets.for_data(data)
    w = np.random.default_rng(4).random(data.n_households)
    reference = np.concatenate([answer(data, wl, w) for wl in bt.workloads])
    np.testing.assert_allclose(bt.expected(w), reference, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bt.rows.sum(axis=1).A1, [sum(answer(data.take(np.array([h])), wl).sum() for wl in bt.workloads)
                                                          for h in range(data.n_households)])


def test_balance_rows_are_the_transposed_stack_of_the_incidences():
    """The rows written in place are, array for array, the stacked incidences transposed (the
    construction they replace), a partition workload among them."""
    data = random_data(DOMAIN, 300, seed=8)
    ws = [Workload("group", (DOMAIN.group[0].name,)), *balance_workloads(DOMAIN)]
    rows = BalanceTargets.for_data(data, ws).rows
    stacked = sp.vstack([incidence_matrix(data, w) for w in ws], format="csr").T.tocsr()
    stacked.sort_indices()
    assert rows.has_sorted_indices and rows.shape == stacked.shape and rows.dtype == np.uint8  # counts of ≤ M persons: one byte
    for a, b in ((rows.indptr, stacked.indptr), (rows.indices, stacked.indices), (rows.data, stacked.data)):
        np.testing.assert_array_equal(a, b)


def test_expected_is_the_float64_product_bit_for_bit():
    """The one-byte rows' product (taken block by block) is the float64 matrix's ``rows.T @ x``
    to the last bit: the balanced draw compares losses, so a rounding difference could change a
    swap and the released households. Negative control: the same blocks' products added up
    (each block's sums started from zero) are not bit-identical, so the equality is not vacuous."""
    import engine.synthesis._balanced_sampling as bs

    data = random_data(DOMAIN, 3000, seed=9)
    bt = BalanceTargets.for_data(data)
    wide = bt.rows.astype(np.float64)
    x = np.random.default_rng(10).random(data.n_households)
    np.testing.assert_array_equal(bt.expected(x), wide.T @ x)
    starts = range(0, data.n_households, bs.BLOCK)
    summed = sum(wide[lo : lo + bs.BLOCK].T @ x[lo : lo + bs.BLOCK] for lo in starts)
    assert len(starts) > 1 and not np.array_equal(summed, wide.T @ x)


def test_expected_many_is_expected_per_column_bit_for_bit(monkeypatch):
    """The batched product a state's PUMAs share (one pass over the rows for several vectors)
    gives each column exactly :meth:`BalanceTargets.expected` of its vector, on a widened
    (two-block) target too; and the sibling draws that use it release exactly the households of
    draws that compute their own expected counts, across more siblings than one batch holds.
    Negative control: the batch's products per block of households added up (another summation
    order) differ in the last bits, so the equality is not vacuous."""
    import engine.synthesis._balanced_sampling as bs

    data = random_data(DOMAIN, 3000, seed=11)
    bt = BalanceTargets.for_data(data)
    widened = bt.extended(random_data(DOMAIN, 700, seed=12))
    rng = np.random.default_rng(13)
    for targets in (bt, widened):
        X = rng.random((targets.n_households, 5))
        many = targets.expected_many(X)
        for j in range(X.shape[1]):
            np.testing.assert_array_equal(many[:, j], targets.expected(X[:, j]))
    wide, Y = bt.rows.astype(np.float64), X[: bt.n_households]
    other = sum(wide[lo : lo + bs.BLOCK].T @ Y[lo : lo + bs.BLOCK] for lo in range(0, bt.n_households, bs.BLOCK))
    assert not np.array_equal(other, bt.expected_many(Y))
    with pytest.raises(ValueError, match="one entry per balance household"):
        bt.expected(np.ones(bt.n_households + 1))

    small = random_data(DOMAIN, 300, seed=14)
    st = BalanceTargets.for_data(small)
    qs = [rng.dirichlet(np.ones(small.n_households)) for _ in range(5)]
    totals = [30, 25, 40, 20, 35]
    monkeypatch.setattr(bs, "EXPECTED_BATCH", 2)  # three batches over five siblings
    batched = balanced_draws(st, qs, totals, [np.random.default_rng(k) for k in range(5)], household_order(small))
    carried, own = np.zeros(st.n_cells), []
    for k, (q, n) in enumerate(zip(qs, totals)):
        idx, residual = bs._draw(st, q, n, np.random.default_rng(k), household_order(small), carried, 2, 100, 16)
        carried += residual
        own.append(idx)
    for a, b in zip(batched, own):
        np.testing.assert_array_equal(a, b)


def test_systematic_positions_hit_floor_or_ceil_of_n_q():
    p = np.random.default_rng(5).dirichlet(np.ones(40))
    for u in (0.0, 0.3, 0.999):
        counts = np.bincount(systematic_positions(p, 97, u), minlength=40)
        assert counts.sum() == 97 and np.all(np.abs(counts - 97 * p) < 1 + 1e-9)


def _loss(bt: BalanceTargets, idx: np.ndarray, target: np.ndarray) -> float:
    r = bt.expected(np.bincount(idx, minlength=bt.n_households)) - target
    return float(r @ r)


def test_exchange_search_ends_where_no_single_swap_helps():
    """Brute force on small pools: once the search stops, no swap of a chosen pool household for an
    unchosen one lowers the balance loss, and the search never ends above its systematic start."""
    data = random_data(DOMAIN, 60, seed=7)
    bt = BalanceTargets.for_data(data)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        q = rng.dirichlet(np.ones(data.n_households) * 0.5)
        n, k = 6, 3
        target = n * bt.expected(q)
        # the same generator's pool of k·n and its systematic subsample (the search's start)
        g = np.random.default_rng(seed)
        pool = systematic_positions(q, k * n, g.random())
        start = pool[int(g.integers(k)) + k * np.arange(n)]
        idx = balanced_draw(bt, q, n, np.random.default_rng(seed), pool_factor=k, exact_candidates=k * n, max_rounds=10_000)
        assert idx.size == n and set(idx) <= set(pool)
        loss = _loss(bt, idx, target)
        assert loss <= _loss(bt, start, target) + 1e-9
        # remove one chosen pool unit, add one unchosen pool unit: every such swap
        chosen = list(idx)
        rest = list(pool)
        for h in chosen:
            rest.remove(h)
        for i, j in itertools.product(range(n), range(len(rest))):
            swapped = np.array(chosen[:i] + chosen[i + 1 :] + [rest[j]])
            assert _loss(bt, swapped, target) >= loss - 1e-9, (seed, i, j)


def test_balanced_draw_is_balanced_and_close_to_n_q_in_distribution():
    """Statistical test over repeated draws against the systematic draw of the same posterior:
    the balance loss is a small fraction of the systematic draw's; every household's mean count
    stays near n·q_h; on cells the balance does not hold (a three-attribute household × person
    workload) the squared error is lower and the search's bias is a small part of it."""
    data = random_data(DOMAIN, 300, seed=11)
    s = Support.from_data(data)
    bt = BalanceTargets.for_data(data)
    order = household_order(data)
    q = np.random.default_rng(12).dirichlet(np.ones(data.n_households))
    n, reps = 120, 400
    target = n * bt.expected(q)
    third = Workload("person", ("TEN", "R18"), ("AGE",))
    third_expected = n * answer(data, third, q)
    mean = np.zeros(data.n_households)
    loss_bal, loss_sys, third_bal, third_sys = [], [], [], []
    for r in range(reps):
        idx = balanced_draw(bt, q, n, np.random.default_rng(r), order)
        c = np.bincount(idx, minlength=data.n_households)
        mean += c / reps
        loss_bal.append(_loss(bt, idx, target))
        third_bal.append(answer(data, third, c))
        sys_idx = order[systematic_positions(q[order], n, np.random.default_rng(10_000 + r).random())]
        loss_sys.append(_loss(bt, sys_idx, target))
        third_sys.append(answer(data, third, np.bincount(sys_idx, minlength=data.n_households)))
    assert np.mean(loss_bal) < 0.25 * np.mean(loss_sys)
    # each household is drawn from the posterior (the pool) and kept or not by the search: its mean
    # count stays within a fraction of one draw of n q_h
    assert np.abs(mean - n * q).max() < 0.25
    bal, sys_ = np.array(third_bal) - third_expected, np.array(third_sys) - third_expected
    assert (bal**2).mean() < 0.8 * (sys_**2).mean()
    # the systematic draw is unbiased; the search's bias adds under 5 % of its noise
    assert (bal.mean(axis=0) ** 2).sum() < 0.05 * sys_.var(axis=0).sum()
    # reproducible from the generator
    np.testing.assert_array_equal(balanced_draw(bt, q, n, np.random.default_rng(3), order), balanced_draw(bt, q, n, np.random.default_rng(3), order))
    out = sample_households(s, q, n, np.random.default_rng(3), order=order, method="balanced", balance=bt)
    assert out.n_households == n


def test_balanced_sampling_rejects_what_it_cannot_do():
    data = random_data(DOMAIN, 40, seed=13)
    s = Support.from_data(data)
    q = np.full(data.n_households, 1 / data.n_households)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="balance targets"):
        sample_households(s, q, 10, rng, method="balanced")
    with pytest.raises(ValueError, match="size counts"):
        sample_households(s, q, None, rng, sizes=[1, 1, 1, 1], method="balanced", balance=BalanceTargets.for_data(data))
    with pytest.raises(ValueError, match="one per balance household"):
        balanced_draw(BalanceTargets.for_data(data), q[:-1], 5, rng)
    assert balanced_draw(BalanceTargets.for_data(data), q, 0, rng).size == 0


def test_sibling_draws_carry_their_residual_so_the_parent_stays_balanced():
    """Error diffusion over sibling nodes (statistical, 60 repetitions): the siblings' summed
    balance residual is far below that of independent balanced draws of the same posteriors, each
    sibling's own residual stays near an independent draw's, and each sibling is drawn from its own
    posterior (mean counts as near n·q as an independent draw's). The first sibling is exactly the
    plain balanced draw."""
    data = random_data(DOMAIN, 300, seed=21)
    bt = BalanceTargets.for_data(data)
    order = household_order(data)
    rng = np.random.default_rng(22)
    qs = [rng.dirichlet(np.ones(data.n_households)) for _ in range(5)]
    totals = [40, 55, 35, 60, 45]
    expected = [n * bt.expected(q) for n, q in zip(totals, qs)]
    parent_sib, parent_ind, own_sib, own_ind = [], [], [], []
    means = [np.zeros(data.n_households) for _ in qs]
    means_ind = [np.zeros(data.n_households) for _ in qs]
    reps = 60
    for r in range(reps):
        gens = [np.random.default_rng(1000 * r + k) for k in range(len(qs))]
        sib = balanced_draws(bt, qs, totals, gens, order)
        ind = [balanced_draw(bt, q, n, np.random.default_rng(1000 * r + k), order) for k, (q, n) in enumerate(zip(qs, totals))]
        np.testing.assert_array_equal(sib[0], ind[0])  # nothing carried into the first
        res_sib = [bt.expected(np.bincount(i, minlength=data.n_households)) - e for i, e in zip(sib, expected)]
        res_ind = [bt.expected(np.bincount(i, minlength=data.n_households)) - e for i, e in zip(ind, expected)]
        parent_sib.append(float(np.sum(sum(res_sib) ** 2)))
        parent_ind.append(float(np.sum(sum(res_ind) ** 2)))
        own_sib.append(np.mean([x @ x for x in res_sib]))
        own_ind.append(np.mean([x @ x for x in res_ind]))
        for k, (i, j) in enumerate(zip(sib, ind)):
            means[k] += np.bincount(i, minlength=data.n_households) / reps
            means_ind[k] += np.bincount(j, minlength=data.n_households) / reps
    assert np.mean(parent_sib) < 0.5 * np.mean(parent_ind)
    assert np.mean(own_sib) < 3 * np.mean(own_ind)
    # every sibling's mean counts as close to n·q as the independent balanced draws' (themselves tested above)
    for m, mi, q, n in zip(means, means_ind, qs, totals):
        assert np.abs(m - n * q).mean() < 1.3 * np.abs(mi - n * q).mean()
    # the households with their geography, reproducible from the generators
    s = Support.from_data(data)
    out = sample_sibling_households(s, qs, totals, [np.random.default_rng(k) for k in range(5)], [(1, 100 + k) for k in range(5)],
                                    order=order, balance=bt)
    again = sample_sibling_households(s, qs, totals, [np.random.default_rng(k) for k in range(5)], [(1, 100 + k) for k in range(5)],
                                      order=order, balance=bt)
    assert [o.n_households for o in out] == totals and all(np.all(o.geo == (1, 100 + k)) for k, o in enumerate(out))
    assert all(np.array_equal(a.group, b.group) and np.array_equal(a.person, b.person) for a, b in zip(out, again))
    with pytest.raises(ValueError, match="one total"):
        balanced_draws(bt, qs, totals[:-1], [np.random.default_rng(0)] * 5)


@pytest.mark.parametrize("method", ["balanced", "systematic"])
def test_a_node_whose_total_is_zero_gets_no_household_and_leaves_its_siblings_drawable(method):
    """A declared PUMA whose DP household count is 0 (one without private households, say) is a
    node like the others: an empty draw, its siblings drawn to their totals."""
    data = random_data(DOMAIN, 200, seed=31)
    s, order = Support.from_data(data), household_order(data)
    rng = np.random.default_rng(32)
    qs = [rng.dirichlet(np.ones(data.n_households)) for _ in range(3)]
    totals = [30, 0, 25]
    if method == "balanced":
        out = sample_sibling_households(s, qs, totals, [np.random.default_rng(k) for k in range(3)], [(1, 100 + k) for k in range(3)],
                                        order=order, balance=BalanceTargets.for_data(data))
    else:
        out = [sample_households(s, q, n, np.random.default_rng(k), geo=(1, 100 + k), order=order, method="systematic")
               for k, (q, n) in enumerate(zip(qs, totals))]
    assert [o.n_households for o in out] == totals and out[1].n_persons == 0


def test_targets_with_edited_copies_equal_the_stacked_build():
    """Edited copies of the public households (a run with one person attribute relabelled, a run
    with a household attribute and another person attribute's two codes swapped: a widened
    support's flipped copies) get the targets of the concatenated households, array for array,
    though each run rebuilds only its edited attributes' cells and takes the rest from the
    originals' rows. Negative control: the copies' rows differ from their originals' (taking
    every cell from the originals would fail), while the cells of a workload reading no edited
    attribute are equal (what is taken over)."""
    from engine.data import HierarchicalData

    public = random_data(DOMAIN, 700, seed=11)
    sex, rac, ten = DOMAIN.person_index("SEX"), DOMAIN.person_index("RAC"), DOMAIN.group_index("TEN")
    person = public.person.copy()
    person[:, sex] = 1 - person[:, sex]
    first = HierarchicalData(DOMAIN, public.geo, public.group, person, public.person_offsets)
    group, person = public.group.copy(), public.person.copy()
    group[:, ten] = (group[:, ten] + 1) % 3
    person[:, rac] = np.choose(person[:, rac], [2, 1, 0])
    second = HierarchicalData(DOMAIN, public.geo, group, person, public.person_offsets)
    # the second run copies only some households (a widened support's copies of the households a flip changes)
    some = np.sort(np.random.default_rng(3).choice(700, 260, replace=False))
    second = second.take(some)
    plain = BalanceTargets.for_data(public)
    widened = plain.with_copies(public, HierarchicalData.concat([first, second]), [np.arange(700), some])
    full = BalanceTargets.for_data(HierarchicalData.concat([public, first, second]))
    assert len(widened.blocks) == 3 and widened.blocks[0] is plain.blocks[0]
    for a, b in ((widened.rows.indptr, full.rows.indptr), (widened.rows.indices, full.rows.indices), (widened.rows.data, full.rows.data)):
        np.testing.assert_array_equal(a, b)
    for block, originals in zip(widened.blocks[1:], (plain.blocks[0], plain.blocks[0][some])):
        assert (block != originals).nnz > 0
    untouched = _columns(plain, Workload("person", ("NP",), ("AGE", "RAC")))
    np.testing.assert_array_equal(widened.blocks[1][:, untouched].toarray(), plain.blocks[0][:, untouched].toarray())
    with pytest.raises(ValueError, match="699 households for runs of"):
        plain.with_copies(public, first.take(np.arange(699)), [np.arange(700)])


def _columns(targets: BalanceTargets, workload: Workload) -> np.ndarray:
    """The columns of ``workload``'s cells in ``targets``' rows."""
    i = targets.workloads.index(workload)
    start = sum(w.n_cells(DOMAIN) for w in targets.workloads[:i])
    return np.arange(start, start + workload.n_cells(DOMAIN))


def test_extended_targets_share_the_first_block_and_equal_the_stacked_build():
    """A widened support's targets (the public households, then other households) built as the
    public block plus one block are, array for array, the targets of the concatenated households:
    the same rows, the same rows taken for a pool in any order, the same expected counts to the
    last bit; the public block is shared, not copied. Negative control: the pool's rows left in
    block order (the given order not restored) differ, so the row comparison is not vacuous."""
    from engine.data import HierarchicalData

    public, copies = random_data(DOMAIN, 700, seed=11), random_data(DOMAIN, 700, seed=12)
    plain = BalanceTargets.for_data(public)
    widened = plain.extended(copies)
    full = BalanceTargets.for_data(HierarchicalData.concat([public, copies]))
    assert widened.blocks[0] is plain.blocks[0] and widened.n_households == full.n_households == 1400
    for a, b in ((widened.rows.indptr, full.rows.indptr), (widened.rows.indices, full.rows.indices), (widened.rows.data, full.rows.data)):
        np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(13)
    pool = rng.integers(0, 1400, 300)
    taken, reference = widened.take(pool), full.rows[pool].astype(np.float64)
    for a, b in ((taken.indptr, reference.indptr), (taken.indices, reference.indices), (taken.data, reference.data)):
        np.testing.assert_array_equal(a, b)
    in_block_order = full.rows[np.sort(pool, kind="stable")].astype(np.float64)
    assert (in_block_order != reference).nnz > 0
    x = rng.random(1400)
    np.testing.assert_array_equal(widened.expected(x), full.rows.astype(np.float64).T @ x)


def test_cross_products_of_pool_rows_equal_the_sparse_product():
    """The exact swaps' cross terms (``_cross``) are ``R[a] @ R[b].T`` value for value on count
    rows, for fewer candidates than the scratch holds, with repeated rows and with rows that have
    no entry; the scratch is left zero for the next round."""
    from engine.synthesis._balanced_sampling import _cross

    rng = np.random.default_rng(21)
    R = sp.random(60, 500, density=0.1, random_state=22, format="csr", data_rvs=lambda n: rng.integers(1, 9, n).astype(float))
    R = sp.vstack([R, sp.csr_matrix((1, 500))], format="csr")  # row 60: empty
    scratch = np.zeros((500, 16))
    for a, b in ((rng.choice(60, 16, replace=False), rng.choice(60, 16, replace=False)), (rng.integers(0, 60, 7), rng.integers(0, 60, 5)),
                 (np.array([3, 60, 4]), np.array([60, 1]))):
        got = _cross(R, a, b, scratch)
        np.testing.assert_array_equal(got, (R[a] @ R[b].T).toarray())
        assert got.shape == (a.size, b.size) and not scratch.any()


def _reference_draw(bt: BalanceTargets, q: np.ndarray, n: int, rng: np.random.Generator, order: np.ndarray, max_rounds: int) -> tuple[np.ndarray, int]:
    """The exchange search written plainly: ``R @ r`` and the gains taken afresh every round, r moved
    by the swapped rows' dense sums; a round's exact swaps among its candidates each with the
    candidates' products with r taken afresh (``R[u] @ r``). Returns (the draw, how many batch rounds
    found no better batch)."""
    from engine.synthesis._balanced_sampling import _cross, _rows_sum, _top

    k, cands = 2, 16
    expected = n * bt.expected(q / q.sum())
    pool = order[systematic_positions(q[order], k * n, float(rng.random()))]
    chosen = np.zeros(k * n, dtype=bool)
    chosen[int(rng.integers(k)) + k * np.arange(n)] = True
    R = bt.take(pool)
    r = R.T @ chosen.astype(np.float64) - expected
    sq = np.asarray(R.multiply(R).sum(axis=1)).ravel()
    loss, batch, failed = float(r @ r), max(1, n // 10), 0
    for _ in range(max_rounds):
        s = R @ r
        gain_remove, gain_add = np.where(chosen, 2 * s - sq, -np.inf), np.where(chosen, -np.inf, -(2 * s + sq))
        if batch > 1:
            out, into = _top(gain_remove, batch), _top(gain_add, batch)
            m = min(out.size, into.size)
            out, into = out[:m], into[:m]
            keep = gain_remove[out] + gain_add[into] > 0
            out, into = out[keep], into[keep]
            if out.size:
                r_new = r + _rows_sum(R, into) - _rows_sum(R, out)
                if float(r_new @ r_new) < loss:
                    chosen[out], chosen[into] = False, True
                    r, loss, batch = r_new, float(r_new @ r_new), min(2 * batch, max(1, n // 10))
                    continue
            batch //= 2
            failed += 1
            continue
        out, into = _top(gain_remove, cands), _top(gain_add, cands)
        cross = _cross(R, out, into, np.zeros((R.shape[1], cands)))
        free_out, free_in, swapped = np.ones(out.size, dtype=bool), np.ones(into.size, dtype=bool), False
        while free_out.any() and free_in.any():
            s_out, s_in = R[out] @ r, R[into] @ r
            delta = -(2 * s_out - sq[out])[:, None] + (2 * s_in + sq[into])[None, :] - 2 * cross
            delta[~free_out, :], delta[:, ~free_in] = np.inf, np.inf
            i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if delta[i, j] >= -1e-9:
                break
            chosen[out[i]], chosen[into[j]] = False, True
            free_out[i], free_in[j], swapped = False, False, True
            r = r - _rows_sum(R, out[i : i + 1]) + _rows_sum(R, into[j : j + 1])
        if not swapped:
            break
        loss = float(r @ r)
    return pool[chosen], failed


def test_the_exchange_search_is_the_plain_search_that_recomputes_every_round():
    """The search skips ``R @ r`` after a round that changed nothing (a batch that did not lower the
    loss) and moves r by an exact swap on its two rows' cells: the same households as the plain
    search that recomputes the product every round and adds the rows' dense sums, on draws whose
    batches fail, whether the search ends by its round bound or where no swap helps."""
    data = random_data(DOMAIN, 300, seed=31)
    bt = BalanceTargets.for_data(data)
    order = household_order(data)
    failures = 0
    for seed, (n, rounds) in itertools.product(range(4), ((60, 100), (120, 12), (35, 1000))):
        q = np.random.default_rng(100 + seed).dirichlet(np.ones(data.n_households) * 0.7)
        want, failed = _reference_draw(bt, q, n, np.random.default_rng(seed), order, rounds)
        got = balanced_draw(bt, q, n, np.random.default_rng(seed), order, max_rounds=rounds)
        np.testing.assert_array_equal(got, want)
        failures += failed
    assert failures > 0
