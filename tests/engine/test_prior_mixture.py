"""The prior that can be wrong (engine.synthesis._prior_mixture): the flipped copies keep everything but the
flipped attribute, the mixture lays the public prior on them, and the least-squares weight recovers
the mixture that generated the measurements (statistical test), matches a brute-force grid search
of its objective, and stays at zero where the measurements agree with the public prior."""

from __future__ import annotations

import numpy as np
import pytest

from engine.data._domain import Domain
from engine.data._hierarchical_data import HierarchicalData
from engine.queries._measurement import Measurement
from engine.queries._queries import IncidenceCache, Workload
from engine.queries._support import Support
from engine.synthesis._prior_mixture import Flip, choose_mixture, flipped, widen
from tests.engine._support_testdata import all_workloads, attr, random_data, small_domain

BASE = small_domain(M=4)
# the small domain with a household attribute derived from the householder's SEX
DOMAIN = Domain(group=(*BASE.group, attr("HHLDR_SEX", 2)), person=BASE.person, geography=BASE.geography, max_size=BASE.max_size)
FLIP = Flip("SEX", ("HHLDR_SEX",))
WORKLOADS = [Workload("person", (), ("SEX", "AGE")), Workload("person", ("TEN",), ("SEX",)), Workload("group", ("HHLDR_SEX", "NP")),
             Workload("person", (), ("RAC",))]


def with_householder_sex(data: HierarchicalData, male_share: float | None = None, seed: int = 0) -> HierarchicalData:
    """``data`` on :data:`DOMAIN`; ``male_share``: every person's SEX redrawn first (1 = male here,
    the share of persons with SEX = 1), so the data's SEX share can be far from another's."""
    person = data.person.copy()
    if male_share is not None:
        rng = np.random.default_rng(seed)
        person[:, 0] = (rng.random(data.n_persons) < male_share).astype(person.dtype)
    head = person[data.person_offsets[:-1], 0]
    group = np.concatenate([data.group, head[:, None].astype(data.group.dtype)], axis=1)
    return HierarchicalData.from_arrays(DOMAIN, data.geo, group, person, data.person_offsets)


def measure(data: HierarchicalData, sigma: float, rng: np.random.Generator) -> list[Measurement]:
    from engine.queries._queries import answer

    return [Measurement(w, answer(data, w) + rng.normal(0, sigma, w.n_cells(DOMAIN)), sigma) for w in WORKLOADS]


def test_a_flip_changes_the_attribute_and_its_householder_attributes_only():
    data = with_householder_sex(random_data(BASE, 300, seed=3))
    out = flipped(data, FLIP)
    assert np.array_equal(out.person[:, 0], 1 - data.person[:, 0])
    assert np.array_equal(out.person[:, 1:], data.person[:, 1:])
    k = DOMAIN.group_index("HHLDR_SEX")
    assert np.array_equal(out.group[:, k], 1 - data.group[:, k])
    assert np.array_equal(np.delete(out.group, k, axis=1), np.delete(data.group, k, axis=1))
    assert np.array_equal(out.person_offsets, data.person_offsets) and np.array_equal(out.geo, data.geo)
    # the derived attribute still is the householder's value
    assert np.array_equal(out.group[:, k], out.person[out.person_offsets[:-1], 0])


@pytest.mark.parametrize("flip, message", [
    (Flip("AGE"), "needs the two values to swap"),
    (Flip("AGE", (), (1, 1)), "two distinct codes"),
    (Flip("TENURE"), "is not a person attribute"),
    (Flip("SEX", ("TEN",)), "coded like SEX"),
])
def test_a_flip_the_domain_cannot_take_is_refused(flip, message):
    data = with_householder_sex(random_data(BASE, 20, seed=1))
    with pytest.raises(ValueError, match=message):
        flipped(data, flip)


def test_the_widened_support_holds_the_public_prior_and_the_mixture_lays_it_on_the_copies():
    public = with_householder_sex(random_data(BASE, 200, seed=2))
    w = widen(public, [FLIP])
    n = public.n_households
    assert w.support.n_support == 2 * n and w.n_public == n
    assert np.allclose(w.support.weights[:n], 1 / n) and np.all(w.support.weights[n:] == 0)
    base = np.random.default_rng(0).dirichlet(np.ones(n))
    p = w.prior(base, [0.3])
    assert np.allclose(p[:n], 0.7 * base) and np.allclose(p[n:], 0.3 * base) and np.isclose(p.sum(), 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        w.prior(base, [1.2])
    with pytest.raises(ValueError, match="twice"):
        widen(public, [FLIP, FLIP])
    with pytest.raises(ValueError, match="twice"):
        choose_mixture(Support.from_data(public), [FLIP, FLIP], [], 10)


@pytest.mark.parametrize("seed", range(4))
def test_the_mixture_weight_recovers_the_share_of_flipped_households_that_made_the_data(seed):
    """Private households drawn from the public ones and their flipped copies at λ = 0.3: the
    weight fitted to their noisy answers lands near 0.3, and on the minimum of its objective found
    by a brute-force grid search."""
    rng = np.random.default_rng(seed)
    public = with_householder_sex(random_data(BASE, 3000, seed=10 + seed), male_share=0.1, seed=seed)
    w = widen(public, [FLIP])
    G = 2000
    private = w.support.data.take(np.where(rng.random(G) < 0.3, rng.integers(0, 3000, G) + 3000, rng.integers(0, 3000, G)))
    ms = measure(private, 5.0, rng)
    choice = choose_mixture(Support.from_data(public), [FLIP], ms, G)
    assert choice.widened and abs(choice.weights[0] - 0.3) < 0.05
    # brute force: the objective on a grid of λ
    A = [w.support.answer(m.workload, w.prior(w.support.weights[:3000], [0.0])) for m in ms]
    B = [w.support.answer(m.workload, w.prior(w.support.weights[:3000], [1.0])) for m in ms]
    grid = np.linspace(0, 1, 2001)
    rss = [sum(float(np.sum(((m.noisy_answer - G * ((1 - g) * a + g * b)) / m.sigma) ** 2)) for m, a, b in zip(ms, A, B)) for g in grid]
    assert abs(choice.fitted[0] - grid[int(np.argmin(rss))]) <= 1e-3
    assert np.isclose(choice.rss[0], rss[0], rtol=1e-9) and choice.rss[1] <= min(rss) + 1e-6


@pytest.mark.parametrize("flip", [FLIP, Flip("RAC", (), (0, 2)), Flip("AGE", (), (1, 3))])
def test_the_relabelled_households_answers_are_the_public_answers_at_the_relabelled_cells(flip):
    """Every workload kind (group partitions, "contains", person counts, the first persons,
    normalised), under random weights: the answer of the flipped households equals the public
    answer taken at :func:`relabelled_cells` exactly — what lets the mixture be chosen without the
    widened support."""
    from engine.synthesis._prior_mixture import relabelled_cells

    public = with_householder_sex(random_data(BASE, 400, seed=31), male_share=0.3, seed=31)
    copies = Support.from_data(flipped(public, flip))
    support = Support.from_data(public)
    x = np.random.default_rng(32).random(400)
    kinds = list(all_workloads(DOMAIN, 2))
    kinds += [Workload("person", w.group_attrs, w.person_attrs, first=2) for w in kinds if w.level == "person"]
    kinds += [Workload(w.level, w.group_attrs, w.person_attrs, w.first, True) for w in kinds if not w.is_partition()]
    moved = 0
    for w in kinds:
        cells = relabelled_cells(w, DOMAIN, flip)
        assert np.array_equal(np.sort(cells), np.arange(w.n_cells(DOMAIN)))  # a permutation
        moved += int(np.any(cells != np.arange(cells.size)))
        assert np.allclose(copies.answer(w, x), support.answer(w, x)[cells], rtol=1e-12, atol=1e-12), w.id
    assert moved > len(kinds) // 4  # the attribute's workloads moved cells, the others kept theirs
    with pytest.raises(ValueError, match="two values"):
        relabelled_cells(kinds[0], DOMAIN, Flip("RAC"))


def test_measurements_that_agree_with_the_public_prior_keep_the_public_support():
    rng = np.random.default_rng(5)
    public = with_householder_sex(random_data(BASE, 3000, seed=20), male_share=0.1, seed=5)
    G = 2000
    private = public.take(rng.integers(0, 3000, G))
    choice = choose_mixture(Support.from_data(public), [FLIP], measure(private, 5.0, rng), G)
    assert not choice.widened and choice.weights == (0.0,)
    assert choice.to_dict()["widened"] is False


def test_the_widened_support_takes_what_no_flip_changes_from_the_public_cache_exactly():
    """Workloads that read no flipped attribute take their incidence and patterns from the public
    support's cache (its pattern matrix itself, each household's pattern repeated); every workload's
    incidence, patterns and the joint patterns equal a fresh build on the widened households."""
    public = with_householder_sex(random_data(BASE, 300, seed=5))
    public_support = Support.from_data(public)
    widened = widen(public, (FLIP,), public_cache=public_support.cache)
    fresh = IncidenceCache(widened.support.data)
    person = [w for w in all_workloads(DOMAIN) if w.level == "person"]
    variants = [Workload("person", w.group_attrs, w.person_attrs, first, norm) for w in person for first, norm in ((2, False), (0, True))]
    workloads = [*all_workloads(DOMAIN), *variants]  # plain, first persons, normalised
    reads_no_flip = [w for w in workloads if not {"SEX", "HHLDR_SEX"} & set(w.attrs)]
    reads_flip = [w for w in workloads if {"SEX", "HHLDR_SEX"} & set(w.attrs)]
    assert reads_no_flip and reads_flip
    for w in [*reads_no_flip, *reads_flip]:
        got, want = widened.support.cache.matrix(w), fresh.matrix(w)
        for part in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got, part), getattr(want, part))
        P, Q = widened.support.cache.patterns(w), fresh.patterns(w)
        np.testing.assert_array_equal(P.pattern_of, Q.pattern_of)
        np.testing.assert_array_equal(P.matrix.toarray(), Q.matrix.toarray())
    assert all(widened.support.cache.patterns(w).matrix is public_support.cache.patterns(w).matrix for w in reads_no_flip)
    ws = [*reads_no_flip[:3], *reads_flip[:2]]
    (A, pattern_of), (B, fresh_of) = widened.support.cache.joint_patterns(ws), fresh.joint_patterns(ws)
    np.testing.assert_array_equal(pattern_of, fresh_of)
    np.testing.assert_array_equal(A.toarray(), B.toarray())
    with pytest.raises(ValueError, match="public_cache"):
        widen(public, (FLIP,), public_cache=IncidenceCache(random_data(BASE, 300, seed=5)))


def test_answers_on_the_widened_support_are_the_repeated_incidence_products_bit_for_bit():
    """A workload that reads no flipped attribute is answered on the widened support by the public
    incidence applied to each copy's weights in turn, without building the repeated incidence: the
    same numbers, to the last bit, as the widened households' own incidence times the weights (the
    fits compare them), also where the public households or the copies have no weight (that repeat
    is skipped). Negative control: the copies' products added afterwards (another order of
    the same sums) differ in the last bits for some workload, so the equality is not vacuous."""
    public = with_householder_sex(random_data(BASE, 400, seed=7))
    public_support = Support.from_data(public)
    widened = widen(public, (FLIP,), public_cache=public_support.cache)
    fresh = IncidenceCache(widened.support.data)
    n = public.n_households
    x = np.random.default_rng(8).random(widened.support.data.n_households) * 1e3
    reads_no_flip = [w for w in all_workloads(DOMAIN) if not {"SEX", "HHLDR_SEX"} & set(w.attrs)]
    apart = []
    for w in all_workloads(DOMAIN):
        np.testing.assert_array_equal(widened.support.cache.answer(w, x), fresh.matrix(w) @ x)
        if w in reads_no_flip:
            base = public_support.cache.matrix(w)
            apart.append(not np.array_equal(base @ x[:n] + base @ x[n:], fresh.matrix(w) @ x))
    assert reads_no_flip and not any(w in widened.support.cache._A for w in reads_no_flip)  # never built there
    assert any(apart)
    for zero in (slice(0, n), slice(n, None)):  # a repeat without weight (skipped) changes no sum
        y = x.copy()
        y[zero] = 0.0
        for w in reads_no_flip:
            np.testing.assert_array_equal(widened.support.cache.answer(w, y), fresh.matrix(w) @ y)
    with pytest.raises(ValueError, match="expected"):
        widened.support.cache.answer(reads_no_flip[0], x[:n])


def test_the_node_support_holds_only_the_copies_the_mixture_weighs_in():
    """Two flips, the measurements asking for one: the node's support is the public households and
    that flip's copies (the other's, at weight 0, would only widen every later fit), and its prior
    is the full mixture's without the zero block."""
    from engine.synthesis._prior_mixture import node_prior, used_flips

    domain = Domain(group=DOMAIN.group, person=(*DOMAIN.person, attr("B", 2)), geography=DOMAIN.geography, max_size=DOMAIN.max_size)
    base = with_householder_sex(random_data(BASE, 3000, seed=40), male_share=0.1, seed=40)
    person = np.concatenate([base.person, np.zeros((base.n_persons, 1), dtype=base.person.dtype)], axis=1)  # B = 0 for everyone
    public = HierarchicalData.from_arrays(domain, base.geo, base.group, person, base.person_offsets)
    flips = (FLIP, Flip("B"))
    full = widen(public, flips)
    rng = np.random.default_rng(41)
    G = 2000
    support = Support.from_data(public)
    truth = full.prior(support.weights, [0.4, 0.0])  # the measurements' expectation: SEX copies at 0.4, no B copy
    ms = [Measurement(w, G * full.support.answer(w, truth) + rng.normal(0, 5.0, w.n_cells(domain)), 5.0)
          for w in [*WORKLOADS, Workload("person", (), ("B",))]]
    node_support, prior, choice = node_prior(support, flips, ms, G)
    assert choice is not None and choice.weights[0] > 0.2 and choice.weights[1] == 0.0
    assert used_flips(flips, choice) == (FLIP,)
    assert node_support.n_support == 2 * 3000 and node_support.data.equals(widen(public, [FLIP]).support.data)
    assert np.allclose(prior, full.prior(support.weights, choice.weights)[:6000]) and np.isclose(prior.sum(), 1.0)
    # nothing weighed in: the public support itself
    assert used_flips(flips, None) == ()


# -- swaps of a multi-valued attribute's codes ---------------------------------------------------
def race_public(n: int, seed: int, dependence: float = 1.0) -> HierarchicalData:
    """Households whose persons share RAC (with probability ``dependence`` each), RAC 0 common,
    RAC 2 rare."""
    data = random_data(BASE, n, seed=seed, dependence=dependence)
    rng = np.random.default_rng(seed)
    hh_rac = rng.choice(3, size=n, p=[0.8, 0.15, 0.05])
    person = data.person.copy()
    keep = rng.random(data.n_persons) < dependence
    person[:, 2] = np.where(keep, np.repeat(hh_rac, np.diff(data.person_offsets)), rng.integers(0, 3, data.n_persons))
    return HierarchicalData.from_arrays(BASE, data.geo, data.group, person, data.person_offsets)


RACE_WORKLOADS = [Workload("person", (), ("RAC",)), Workload("person", (), ("SEX", "RAC")), Workload("person", ("TEN",), ("RAC",)),
                  Workload("group", ("NP",))]


def test_a_swap_exchanges_two_codes_for_every_person_and_nothing_else():
    data = race_public(300, seed=1)
    out = flipped(data, Flip("RAC", (), (0, 2)))
    rac, new = data.person[:, 2], out.person[:, 2]
    assert np.array_equal(new, np.choose(rac, [2, 1, 0]))  # 0 -> 2, 2 -> 0, 1 stays
    assert np.array_equal(out.person[:, :2], data.person[:, :2]) and np.array_equal(out.group, data.group)
    assert Flip("RAC", (), (0, 2)).name == "RAC:0:2" and FLIP.name == "SEX"
    from engine.synthesis._prior_mixture import named_flips

    templates = (Flip("RAC"), FLIP)
    assert named_flips(["SEX", "RAC:0:2"], templates) == (FLIP, Flip("RAC", (), (0, 2)))
    # every swap reads back as itself, the swap of codes 0 and 1 included (not as its template)
    swaps = tuple(Flip("RAC").swapping(a, b) for a, b in ((0, 1), (0, 2), (1, 2)))
    assert named_flips([f.name for f in swaps], templates) == swaps
    with pytest.raises(ValueError, match="not among the run's prior flips"):
        named_flips(["AGE:0:1"], templates)


def test_value_residuals_match_a_brute_force_sum_and_find_the_under_represented_code():
    """The residual z-score of each code against a by-hand computation; on a private population
    with RAC 2 common (the prior's rarest) the swap chosen exchanges the prior's most common code
    with it."""
    from engine.queries._queries import answer
    from engine.synthesis._prior_mixture import choose_swaps, value_residuals

    public = race_public(3000, seed=2)
    support = Support.from_data(public)
    rng = np.random.default_rng(3)
    private = flipped(public, Flip("RAC", (), (0, 2))).take(rng.integers(0, 3000, 2000))
    sigma = 4.0
    ms = [Measurement(w, answer(private, w) + rng.normal(0, sigma, w.n_cells(BASE)), sigma) for w in RACE_WORKLOADS]
    z = value_residuals(support, support.weights, "RAC", ms, 2000)
    num, den = np.zeros(3), np.zeros(3)
    for m in ms[:3]:  # the person-level ones holding RAC
        shape = m.workload.shape(BASE)
        r = (m.noisy_answer - 2000 * support.answer(m.workload, support.weights / support.weights.sum())).reshape(shape)
        per_code = r.sum(axis=tuple(range(len(shape) - 1)))  # RAC is the last axis of each
        var = np.prod(shape) / 3 * sigma ** 2
        num, den = num + per_code / var, den + 1 / var
    assert np.allclose(z, num / np.sqrt(den))
    assert z[2] > 3 and z[0] < -3
    assert choose_swaps(support, [Flip("RAC")], ms, 2000) == (Flip("RAC", (), (0, 2)),)
    # measurements whose expectation is the prior's: no swap
    q = support.weights / support.weights.sum()
    agree = [Measurement(w, 2000 * support.answer(w, q) + rng.normal(0, sigma, w.n_cells(BASE)), sigma) for w in RACE_WORKLOADS]
    assert choose_swaps(support, [Flip("RAC")], agree, 2000) == ()


def test_no_swap_of_an_attribute_households_do_not_share():
    """Where persons of one household mostly differ in the attribute, swapping two codes for every
    person would make implausible persons: no swap, however far the measurements lie."""
    from engine.queries._queries import answer
    from engine.synthesis._prior_mixture import choose_swaps, shared_within_households

    public = race_public(3000, seed=4, dependence=0.0)
    assert shared_within_households(public, "RAC") < 0.5 < shared_within_households(race_public(3000, seed=4), "RAC")
    support = Support.from_data(public)
    rng = np.random.default_rng(5)
    private = flipped(public, Flip("RAC", (), (0, 2))).take(rng.integers(0, 3000, 2000))
    ms = [Measurement(w, answer(private, w) + rng.normal(0, 4.0, w.n_cells(BASE)), 4.0) for w in RACE_WORKLOADS]
    assert choose_swaps(support, [Flip("RAC")], ms, 2000) == ()


@pytest.mark.parametrize("seed", range(3))
def test_the_mixture_weight_of_a_swap_recovers_the_share_of_relabelled_households(seed):
    rng = np.random.default_rng(seed)
    public = race_public(3000, seed=10 + seed)
    swap = Flip("RAC", (), (0, 2))
    both = HierarchicalData.concat([public, flipped(public, swap)])
    G = 2000
    private = both.take(np.where(rng.random(G) < 0.4, rng.integers(0, 3000, G) + 3000, rng.integers(0, 3000, G)))
    from engine.queries._queries import answer

    ms = [Measurement(wl, answer(private, wl) + rng.normal(0, 4.0, wl.n_cells(BASE)), 4.0) for wl in RACE_WORKLOADS]
    choice = choose_mixture(Support.from_data(public), [swap], ms, G)
    assert choice.attributes == ("RAC:0:2",) and abs(choice.weights[0] - 0.4) < 0.05


def _full_mixture(public: HierarchicalData, flip: Flip, base: np.ndarray, lam: float) -> tuple[IncidenceCache, np.ndarray]:
    """The mixture on a copy of every public household (the reference the widened support folds)."""
    full = HierarchicalData.concat([public, flipped(public, Flip(flip.attribute, flip.householder_attributes, flip.values))])
    return IncidenceCache(full), np.concatenate([(1 - lam) * base, lam * base])


def test_a_swap_copies_only_the_households_it_changes_and_answers_as_the_full_copy():
    """A swap of two rare codes copies only the households holding one of them; every workload's
    expected answers under the mixture equal those of the mixture on a copy of every public
    household (an unchanged household's copy is the household: its weight stays on it), and the
    widened cache's incidences and patterns equal a fresh build on its households. Negative
    control: the public prior alone answers differently, so the comparison is not vacuous."""
    from engine.synthesis._prior_mixture import changed

    public = race_public(600, seed=3)
    swap = Flip("RAC", (), (1, 2))
    w = widen(public, [swap], public_cache=Support.from_data(public).cache)
    rac = public.person[:, 2]
    holds = np.array([np.isin(rac[a:b], (1, 2)).any() for a, b in zip(public.person_offsets[:-1], public.person_offsets[1:])])
    np.testing.assert_array_equal(changed(public, swap), holds)
    np.testing.assert_array_equal(w.copies[0], np.flatnonzero(holds))
    assert 0 < w.copies[0].size < 600 and w.support.n_support == 600 + w.copies[0].size
    base = np.random.default_rng(1).dirichlet(np.ones(600))
    p = w.prior(base, [0.35])
    assert np.isclose(p.sum(), 1.0)
    cache, q = _full_mixture(public, swap, base, 0.35)
    fresh = IncidenceCache(w.support.data)
    differs = False
    for wl in [*all_workloads(BASE), *RACE_WORKLOADS]:
        np.testing.assert_allclose(w.support.answer(wl, p), cache.matrix(wl) @ q, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(w.support.cache.answer(wl, p), fresh.matrix(wl) @ p, rtol=1e-12, atol=1e-15)
        got, want = w.support.cache.matrix(wl), fresh.matrix(wl)
        for part in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got, part), getattr(want, part))
        np.testing.assert_array_equal(w.support.cache.patterns(wl).pattern_of, fresh.patterns(wl).pattern_of)
        differs |= not np.allclose(cache.matrix(wl) @ q, cache.matrix(wl) @ np.concatenate([base, 0 * base]))
    assert differs


def test_a_share_copies_a_nested_subset_of_the_changed_households_and_keeps_their_weight():
    """A flip copied at a share holds about that share of the households it changes (binomial, 4
    sd), the same ones on every call, each smaller share's among a larger one's; the mixture keeps
    the prior's total, leaves the unchanged households' weight on them, and gives the copies
    λ times the changed households' prior weight, spread in proportion to the prior."""
    from engine.synthesis._prior_mixture import changed, copied, named_flips

    public = race_public(4000, seed=4)
    swap = Flip("RAC", (), (0, 1))
    hit = changed(public, swap)
    before = None
    for share in (1 / 8, 1 / 4, 1 / 2, 1.0):
        rows = copied(public, swap.sharing(share))
        np.testing.assert_array_equal(rows, copied(public, swap.sharing(share)))
        assert hit[rows].all() and np.all(np.diff(rows) > 0)
        n = int(hit.sum())
        assert abs(rows.size - share * n) <= 4 * np.sqrt(n * share * (1 - share)) + 1e-9
        assert before is None or np.isin(before, rows).all()
        before = rows
    flip = swap.sharing(0.25)
    assert flip.name == "RAC:0:1@0.25" and named_flips([flip.name], (Flip("RAC"),)) == (flip,)
    w = widen(public, [flip])
    base = np.random.default_rng(2).dirichlet(np.ones(4000))
    p = w.prior(base, [0.3])
    copies = p[4000:]
    assert np.isclose(p.sum(), 1.0) and np.isclose(copies.sum(), 0.3 * base[hit].sum())
    np.testing.assert_allclose(copies / base[w.copies[0]], copies[0] / base[w.copies[0][0]])
    np.testing.assert_array_equal(p[:4000][~hit], base[~hit])
    np.testing.assert_allclose(p[:4000][hit], 0.7 * base[hit])
    with pytest.raises(ValueError, match="share"):
        Flip("RAC", (), (0, 1), share=0.0)


def test_the_copied_share_follows_the_mixture_weight():
    """At most 1 / COPY_DENSITY of a public household's prior weight per copy, rounded up to the
    share grid: growing with the weight, all of the changed households once the weight is large."""
    from engine.synthesis._prior_mixture import COPY_DENSITY, SHARE_STEP, copy_share

    grid = np.linspace(0.001, 0.6, 200)
    shares = [copy_share(x, [x, 0.1]) for x in grid]
    assert all(a <= b for a, b in zip(shares, shares[1:])) and shares[-1] == 1.0
    for x, s in zip(grid, shares):
        assert s >= min(1.0, COPY_DENSITY * x / (0.9 - x)) and (s == 1.0 or s - 1 / SHARE_STEP < COPY_DENSITY * x / (0.9 - x))
        assert float(s * SHARE_STEP).is_integer()
    assert copy_share(0.0, [0.0]) == 1.0 and copy_share(0.5, [0.5, 0.5]) == 1.0


def test_mixture_weights_that_sum_to_one_in_rounding_leave_no_negative_prior_weight():
    """The least squares rescales weights whose sum exceeds 1 to sum 1; in floating point that sum
    can be 1 + 2⁻⁵² and a household two flips both change then got 1 − (λ₁ + λ₂) < 0 times its
    prior: a negative weight that every fit on the state's posterior carried into its PUMAs, where
    the rake to the state refused it and the release failed. The public block's weight is
    1 − Σ λ ≥ 0 exactly; the prior keeps it at 0."""
    domain = Domain(group=DOMAIN.group, person=(*DOMAIN.person, attr("B", 2)), geography=DOMAIN.geography, max_size=DOMAIN.max_size)
    base = with_householder_sex(random_data(BASE, 500, seed=42))
    person = np.concatenate([base.person, np.zeros((base.n_persons, 1), dtype=base.person.dtype)], axis=1)
    public = HierarchicalData.from_arrays(domain, base.geo, base.group, person, base.person_offsets)
    w = widen(public, (FLIP, Flip("B")))
    lam = np.array([0.5772841464584488, 0.42271585354155133])  # sums to 1 + 2⁻⁵²: rescaled by the least squares' rule
    assert lam.sum() <= 1 + 1e-12 and 1.0 - (0.0 + lam[0] + lam[1]) < 0
    both = w.changed[0] & w.changed[1]
    assert both.any()  # households both flips change, whose public weight is 1 − λ₁ − λ₂
    prior = w.prior(Support.from_data(public).weights, lam)
    assert np.all(prior >= 0) and np.all(prior[: w.n_public][both] == 0)
    assert np.isclose(prior.sum(), 1.0)
