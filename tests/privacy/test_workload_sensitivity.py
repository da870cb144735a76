"""Every sensitivity declared in engine/queries/_queries.py, checked on random and worst-case neighbours.

Domain: M = 4; group attributes NP (derived: #persons), TEN (free), HAS_CHILD (derived: any person
with AGEB = 0); person attributes AGEB (3), SEX (2), REL (5) — so |dom S_I| is both < M and ≥ M.
Under the person unit, NP and HAS_CHILD are re-derived after adding/removing a person, and the
neighbours are built under every combination of the ingestion rules (``oversize``,
``group_quarters``; a housing unit losing its householder is excluded).
"""

import itertools
import math
import typing

import numpy as np
import pytest

from engine.data._domain import Attribute, Domain
from engine.data._hierarchical_data import HierarchicalData
from engine.hgem.privacy import cell_sensitivity
from engine.queries._queries import NORM_SCALE, Workload, answer
from schemas.ingestion import HouseholdRules
from schemas.release_config import ReleaseConfig, load_config
from tests.sensitivity_harness import check_sensitivity, neighbour_pairs, random_household

M = 4


def _attr(name, k):
    return Attribute(name, tuple(str(i) for i in range(k)), tuple(f"{name}={i}" for i in range(k)))


DOMAIN = Domain(
    group=(
        Attribute("NP", tuple(str(i) for i in range(1, M + 1)), tuple(str(i) for i in range(1, M + 1))),
        _attr("TEN", 3),
        _attr("HAS_CHILD", 2),
    ),
    person=(_attr("AGEB", 3), _attr("SEX", 2), _attr("REL", 5)),
    geography=("ST", "PUMA"),
    max_size=M,
)


def rederive(group_row, persons, domain):
    out = np.array(group_row, dtype=np.int64, copy=True)
    out[domain.group_index("NP")] = len(persons) - 1
    out[domain.group_index("HAS_CHILD")] = int(np.any(persons[:, domain.person_index("AGEB")] == 0))
    return out


def make_data(n=120, seed=7):
    rng = np.random.default_rng(seed)
    geo, groups, persons, offs = [], [], [], [0]
    for _ in range(n):
        g, p = random_household(DOMAIN, int(rng.integers(1, M + 1)), rng, rederive)
        st = int(rng.integers(2))
        geo.append([st, 100 * st + int(rng.integers(2))])
        groups.append(g)
        persons.append(p)
        offs.append(offs[-1] + len(p))
    return HierarchicalData.from_arrays(DOMAIN, np.array(geo), np.array(groups), np.vstack(persons), np.array(offs))


DATA = make_data()
GROUP = [a.name for a in DOMAIN.group]
PERSON = [a.name for a in DOMAIN.person]
WORKLOADS = [
    Workload(level, tuple(a for a in combo if a in GROUP), tuple(a for a in combo if a in PERSON))
    for k in (1, 2, 3)
    for combo in itertools.combinations(GROUP + PERSON, k)
    for level in ("group", "person")
]


RULE_OPTIONS = typing.get_type_hints(HouseholdRules)
OVERSIZE = typing.get_args(RULE_OPTIONS["oversize"])
GROUP_QUARTERS = typing.get_args(RULE_OPTIONS["group_quarters"])
UNITS = typing.get_args(typing.get_type_hints(ReleaseConfig)["privacy_unit"])
COMBINATIONS = list(itertools.product(UNITS, OVERSIZE, GROUP_QUARTERS))


@pytest.fixture(scope="module")
def all_pairs():
    """Neighbours under every unit × oversize × group-quarters rule the config accepts."""
    rng = np.random.default_rng(2024)
    return {(unit, oversize, gq): neighbour_pairs(DATA, unit, trials=60, rng=rng, rederive=rederive, oversize=oversize,
                                                  group_quarters=gq)
            for unit, oversize, gq in COMBINATIONS}


@pytest.fixture(scope="module")
def pairs(all_pairs):
    """The default rules' neighbours (oversize clip), group-quarters persons kept as households."""
    return {unit: all_pairs[(unit, "clip", "single_person_households")] for unit in UNITS}


def dom_i(w):
    return int(np.prod([DOMAIN.person_attribute(a).size for a in w.person_attrs])) if w.person_attrs else 1


def attained_household(w):
    """The exact worst case under the household unit: it equals the declared bound."""
    if w.level == "person":
        return M, M
    if not w.person_attrs:
        return 1, 1
    c = min(M, dom_i(w))
    return c, math.sqrt(c)


def joined_below_cap(w):
    """The worst case of a person joining a household of M − 1 when NP ∈ S_G (the household
    always changes cell): the M − 1 counted before leave, the M counted after enter."""
    if w.level == "person":
        return 2 * (M - 1) + 1, math.sqrt((M - 1) ** 2 + M**2)
    if not w.person_attrs:
        return 2, math.sqrt(2)
    k = min(M - 1, dom_i(w)) + min(M, dom_i(w))  # leaves ≤ M−1 cells, enters ≤ M cells
    return k, math.sqrt(k)


def replaced_at_cap_attains(w):
    """Under ``clip`` a newcomer replacing the last kept person of a household of M flips HAS_CHILD:
    the M counted persons (group level: the c cells) leave and M enter — the declared bound —
    unless S_I holds AGEB (a household without a child then has fewer than 3 AGEB values)."""
    return "HAS_CHILD" in w.group_attrs and "AGEB" not in w.person_attrs


def test_workload_list_covers_every_type():
    kinds = {(w.level, bool(w.group_attrs), bool(w.person_attrs)) for w in WORKLOADS}
    assert kinds == {(lv, g, p) for lv in ("group", "person") for g in (True, False) for p in (True, False)} - {
        (lv, False, False) for lv in ("group", "person")
    }
    assert len(WORKLOADS) == 82


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.id)
def test_household_unit(w, pairs):
    l1, l2 = w.sensitivity(DOMAIN, "household")
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "household", l1, l2, pairs=pairs["household"])
    assert obs == pytest.approx(attained_household(w))
    assert obs == pytest.approx((l1, l2))  # the declared bound is attained


@pytest.mark.parametrize("oversize", OVERSIZE)
@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.id)
def test_person_unit(w, oversize, all_pairs):
    l1, l2 = w.sensitivity(DOMAIN, "person")
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "person", l1, l2,
                            pairs=all_pairs[("person", oversize, "single_person_households")])
    if "NP" in w.group_attrs:
        assert all(o >= j - 1e-9 for o, j in zip(obs, joined_below_cap(w)))
    if oversize == "clip" and replaced_at_cap_attains(w):
        assert obs == pytest.approx((l1, l2))  # the declared bound is exact: 2M, or 2c
    if oversize == "exclude":  # no household keeps M persons on both sides: one person below the declared bound
        assert obs[0] <= joined_below_cap(w)[0] + 1e-9
        if "NP" in w.group_attrs:
            assert obs == pytest.approx(joined_below_cap(w))
    if not w.group_attrs:  # a householder leaving takes the whole household: the household unit's worst case
        assert obs == pytest.approx(w.sensitivity(DOMAIN, "household"))


# one workload of every form, each with the group attributes that move a household between cells
EVERY_FORM = [Workload("group", ("NP", "HAS_CHILD"), ()), Workload("group", ("HAS_CHILD",), ("REL",)),
              Workload("group", (), ("REL",)), Workload("person", ("HAS_CHILD",), ("SEX",)), Workload("person", (), ("SEX",)),
              Workload("person", ("NP",), ("REL",), 2), Workload("person", ("HAS_CHILD",), ("REL",), 0, True),
              Workload("group", ("NP",), ("AGEB",), 0, True)]


@pytest.mark.parametrize("unit,oversize,group_quarters", COMBINATIONS)
def test_every_rule_combination_is_charged_enough(unit, oversize, group_quarters, all_pairs, tmp_path):
    """Every combination is accepted by the config (none is refused) and reaches the ingestion;
    the charged sensitivity of a workload of every form covers the observed change on that
    combination's worst-case neighbours (every workload: ``test_household_unit``, ``test_person_unit``)."""
    from tasks.ingest import household_rules
    from tests.test_config import write

    rules = {"max_household_size": M, "oversize": oversize, "group_quarters": group_quarters}
    cfg = load_config(write(tmp_path, lambda r: r.update(privacy_unit=unit, household_rules=rules)))
    assert household_rules(cfg) == HouseholdRules(**rules, householders="exclude" if unit == "person" else "refuse")
    pairs = all_pairs[(unit, oversize, group_quarters)]
    for w in EVERY_FORM:
        check_sensitivity(lambda d, w=w: answer(d, w), DATA, unit, *w.sensitivity(DOMAIN, unit), pairs=pairs)
        if not w.normalised:  # H-GEM's selection score moves by at most one cell's change
            worst_cell = max(float(np.abs(answer(b, w) - answer(a, w)).max()) for a, b in pairs)
            assert worst_cell <= cell_sensitivity(w, DOMAIN, unit)
    # the household count (session.measure_household_count): one household in or out
    assert check_sensitivity(lambda d: np.array([d.n_households]), DATA, unit, 1, 1, pairs=pairs) == (1, 1)


def test_harness_catches_the_bound_that_ignores_a_person_replaced_at_the_cap(all_pairs):
    """Negative control: the bound of a person joining below the cap (2M − 1) is broken under
    ``clip`` by a newcomer replacing the last kept person of a household of M."""
    w = Workload("person", ("HAS_CHILD",), ("SEX",))
    with pytest.raises(AssertionError, match="violated"):
        check_sensitivity(lambda d: answer(d, w), DATA, "person", *joined_below_cap(w),
                          pairs=all_pairs[("person", "clip", "exclude")])
    w = Workload("group", ("HAS_CHILD",), ("REL",))
    with pytest.raises(AssertionError, match="violated"):
        check_sensitivity(lambda d: answer(d, w), DATA, "person", *joined_below_cap(w),
                          pairs=all_pairs[("person", "clip", "exclude")])


def test_harness_catches_a_person_bound_that_ignores_the_householder(all_pairs):
    """Negative control: charging a workload without group attributes for one person's cell
    (1, 1) is broken by a householder leaving, which excludes the whole household."""
    w = Workload("person", (), ("SEX",))
    for oversize in OVERSIZE:
        with pytest.raises(AssertionError, match="violated"):
            check_sensitivity(lambda d: answer(d, w), DATA, "person", 1, 1, pairs=all_pairs[("person", oversize, "exclude")])


FIRST = [Workload("person", g, p, k) for k in (1, 2, 3) for g, p in
         ((("NP",), ("AGEB",)), (("TEN",), ("SEX",)), ((), ("REL",)), ((), ("AGEB", "SEX")), (("NP", "HAS_CHILD"), ()))]


@pytest.mark.parametrize("w", FIRST, ids=lambda w: w.id)
def test_first_persons_household_unit(w, pairs):
    """Counting the first k persons: a household adds at most k persons, all may share a cell."""
    l1, l2 = w.sensitivity(DOMAIN, "household")
    assert (l1, l2) == (w.first, w.first) and w.first < M
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "household", l1, l2, pairs=pairs["household"])
    assert obs == pytest.approx((l1, l2))  # attained by M identical persons


@pytest.mark.parametrize("w", FIRST, ids=lambda w: w.id)
def test_first_persons_person_unit(w, pairs):
    """k counted before and after (the household moves cell when NP changes): L1 = 2k, L2 = √2·k;
    a person inserted among the first pushes the last counted one out."""
    l1, l2 = w.sensitivity(DOMAIN, "person")
    assert (l1, l2) == pytest.approx((2 * w.first, math.sqrt(2) * w.first))
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "person", l1, l2, pairs=pairs["person"])
    if "NP" in w.group_attrs:
        assert obs == pytest.approx((l1, l2))


def test_harness_catches_a_first_persons_bound_that_ignores_the_push_out(pairs):
    """Without group attributes a person inserted after the householder moves two cells (in, and
    the pushed-out second one): a bound of 1 is caught by the insertions."""
    w = Workload("person", (), ("REL",), 2)
    with pytest.raises(AssertionError, match="violated"):
        check_sensitivity(lambda d: answer(d, w), DATA, "person", 1, 1, pairs=pairs["person"])


def test_counts_n_g_and_n_i(pairs):
    n_g = lambda d: np.array([d.n_households])  # noqa: E731
    n_i = lambda d: np.array([d.n_persons])  # noqa: E731
    assert check_sensitivity(n_g, DATA, "household", 1, 1, pairs=pairs["household"]) == (1, 1)
    assert check_sensitivity(n_i, DATA, "household", M, M, pairs=pairs["household"]) == (M, M)
    # a person arriving alone forms a new household: N_G is not invariant under the person unit;
    # a householder leaving takes the household's M persons with them
    assert check_sensitivity(n_g, DATA, "person", 1, 1, pairs=pairs["person"]) == (1, 1)
    assert check_sensitivity(n_i, DATA, "person", M, M, pairs=pairs["person"]) == (M, M)


def test_harness_catches_wrong_bounds(pairs):
    w = Workload("person", ("TEN",), ("SEX",))
    with pytest.raises(AssertionError, match="violated"):
        check_sensitivity(lambda d: answer(d, w), DATA, "household", M - 1, M, pairs=pairs["household"])
    w = Workload("group", ("NP",), ())
    with pytest.raises(AssertionError, match="violated"):  # the household-unit bound is wrong for persons
        check_sensitivity(lambda d: answer(d, w), DATA, "person", *w.sensitivity(DOMAIN, "household"),
                          pairs=pairs["person"])


def test_harness_builds_its_own_pairs():
    # pairs built inside check_sensitivity (custom rederive, then the default NP-only one)
    rng = np.random.default_rng(5)
    w = Workload("group", ("NP",), ("REL",))
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "person", *w.sensitivity(DOMAIN, "person"),
                            trials=30, rng=rng, rederive=rederive)
    assert obs[0] == 2 * M - 1
    d0 = DATA.select(np.ones(DATA.n_households, dtype=bool))
    obs = check_sensitivity(lambda d: answer(d, Workload("group", ("TEN",), ())), d0, "household", 1, 1,
                            trials=20, rng=rng)
    assert obs == (1.0, 1.0)


NORMALISED = [Workload(w.level, w.group_attrs, w.person_attrs, k, True)
              for w in WORKLOADS if not w.is_partition() for k in ((0, 2) if w.level == "person" else (0,))]


def test_normalised_workloads_cover_every_non_partition_type():
    kinds = {(w.level, bool(w.group_attrs), bool(w.person_attrs)) for w in NORMALISED}
    assert kinds == {("group", True, True), ("group", False, True), ("person", True, True), ("person", False, True),
                     ("person", True, False)}
    with pytest.raises(ValueError, match="partition"):
        Workload("group", ("NP",), (), 0, True)


@pytest.mark.parametrize("w", NORMALISED, ids=lambda w: w.id)
def test_normalised_household_unit(w, pairs):
    """One household's rescaled column: L2 ≤ S, attained by a one-person household (its column is
    S·e_c exactly); L1 ≤ S·√c, within a rounding of each of the c entries of it when c persons
    fall in c different cells."""
    S = NORM_SCALE
    l1, l2 = w.sensitivity(DOMAIN, "household")
    c = min(w.counted_persons(M), dom_i(w))
    assert (l1, l2) == pytest.approx((S * math.sqrt(c), S))
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "household", l1, l2, pairs=pairs["household"])
    assert obs[1] == pytest.approx(S)
    assert obs[0] >= l1 - c  # the all-different households of the harness reach S·√c up to the floors


@pytest.mark.parametrize("w", NORMALISED, ids=lambda w: w.id)
def test_normalised_person_unit(w, pairs):
    """√2·S + 2√c: two non-negative unit directions are at most √2 apart, each floor moves a
    column by less than √c. Where NP is a group attribute the household changes cell, its
    columns are orthogonal, and the change is within the floors of √2·S."""
    l1, l2 = w.sensitivity(DOMAIN, "person")
    c = min(w.counted_persons(M), dom_i(w))
    assert l2 == pytest.approx(math.sqrt(2) * NORM_SCALE + 2 * math.sqrt(c)) and l1 == pytest.approx(2 * NORM_SCALE * math.sqrt(c))
    obs = check_sensitivity(lambda d: answer(d, w), DATA, "person", l1, l2, pairs=pairs["person"])
    if "NP" in w.group_attrs:
        assert obs[1] >= math.sqrt(2) * NORM_SCALE - 2 * math.sqrt(c)


def test_the_person_unit_bound_of_a_normalised_column_against_every_small_household():
    """The bound by brute force over every pair of count vectors on 3 cells with at most M persons
    that differ by one person (added to a cell, or the household appearing), both columns
    normalised, the household staying in its group cell (the worst directions are the closest to
    orthogonal: one person in cell 0, then one more in cell 1)."""
    from engine.queries._queries import normalise_columns

    def column(k):
        k = np.asarray(k)
        nz = np.flatnonzero(k)
        out = np.zeros(3)
        out[nz] = normalise_columns(np.zeros(nz.size, dtype=int), k[nz], 1) if nz.size else []
        return out

    c = 3
    bound = math.sqrt(2) * NORM_SCALE + 2 * math.sqrt(c)
    worst = 0.0
    for k in itertools.product(range(M + 1), repeat=3):
        if sum(k) >= M:
            continue
        for j in range(3):
            k2 = list(k)
            k2[j] += 1
            worst = max(worst, float(np.linalg.norm(column(k) - column(k2))))
    assert worst <= bound and worst == pytest.approx(NORM_SCALE)  # 0 -> e_j: the household appears


def test_harness_catches_a_normalised_bound_of_the_wrong_size(pairs):
    """A bound of one household's rescaled norm less one unit is broken by a one-person household,
    and so is the person unit's bound taken from the household unit (a household changes column)."""
    w = Workload("person", ("TEN",), ("AGEB", "REL"), 0, True)
    with pytest.raises(AssertionError, match="violated"):
        check_sensitivity(lambda d: answer(d, w), DATA, "household", w.sensitivity(DOMAIN, "household")[0], NORM_SCALE - 1,
                          pairs=pairs["household"])
    w = Workload("group", ("NP",), ("REL",), 0, True)
    with pytest.raises(AssertionError, match="violated"):
        check_sensitivity(lambda d: answer(d, w), DATA, "person", *w.sensitivity(DOMAIN, "household"), pairs=pairs["person"])
