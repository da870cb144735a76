"""Reusable sensitivity checks: build neighbouring HierarchicalData and measure how far a workload
moves, asserting the declared L1 / L2 bounds.

Neighbouring relations (design/hierarchical_queries.md, "Privacy unit"):

* ``household``: D' = D plus one whole household (≤ M persons); removal is the same pair read
  backwards, and random removals are tried too. Worst cases added: a household of M persons that
  are all identical (several random rows), and households of M persons that are "all different"
  on a chosen set of person attributes (mixed-radix enumeration of that set, so the first
  min(M, |dom|) persons have pairwise different values there) — by default one such household for
  every subset of ≤ 3 person attributes, which attains c = min(M, |dom S_I|) for any workload
  with |S_I| ≤ 3.
* ``person``: D' = D with one person added to (or removed from) an existing household, as the
  ingestion (``schemas.ingestion``) encodes it under the rules passed (``oversize``,
  ``group_quarters``). The household's group attributes that are functions of its persons are
  re-derived through the ``rederive(group_row, persons, domain) -> group_row`` callable. The
  default :func:`rederive_size_only` recomputes NP and keeps all other group attributes — correct
  for domains whose other group attributes are not derived from persons; pass your own callable
  when they are (the engine tests derive a HAS_CHILD attribute that way). The first person of a
  household is its householder. Raw neighbours and what the encoded data see:
  a person joins a household of s < M persons (s + 1); one joins a household at the cap M, or
  above it (the kept persons are the same M) — ``clip`` keeps the first M by person number, so
  the newcomer replaces the last kept person or is not kept, ``exclude`` drops the household of M
  (and leaves one already above M excluded: no change); a non-householder leaves; the householder
  leaves, or a second householder joins — the unit is excluded whole; a person arrives alone (a
  new one-person household) or a one-person household loses its only person; under
  ``group_quarters: single_person_households`` a group-quarters person arrives as a one-person
  household (under ``exclude`` that neighbour changes nothing). Worst cases: households of M − 1
  and of M persons (all identical / all different as above, the others' attributes constant) gain
  a newcomer right after the householder and last — a copy, random persons, copies of the
  householder but for one attribute (so a derived attribute such as "any child" flips while the
  persons stay in one cell), and persons in a new cell of the focus set differing from the
  householder elsewhere — or lose their householder.
  Household counts are therefore not invariant under the person unit either.
  The household unit's pairs serve every rule: an oversize household is clipped to M persons or
  dropped, a group-quarters person dropped or a one-person household — one household of ≤ M.

``check_sensitivity`` returns the maximum observed (L1, L2) change so tests can also assert that a
bound is attained. Randomness here only builds test data (a seeded numpy Generator is fine).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from engine.data._domain import Domain
from engine.data._hierarchical_data import HierarchicalData

Rederive = Callable[[np.ndarray, np.ndarray, Domain], np.ndarray]
Pair = tuple[HierarchicalData, HierarchicalData]

__all__ = [
    "check_sensitivity",
    "join_household",
    "neighbour_pairs",
    "rederive_size_only",
    "household_data",
    "random_household",
]


def rederive_size_only(group_row: np.ndarray, persons: np.ndarray, domain: Domain) -> np.ndarray:
    """Recompute the size attribute (NP code = #persons − 1); keep every other group attribute."""
    out = np.array(group_row, dtype=np.int64, copy=True)
    out[domain.group_index(domain.size_attribute)] = len(persons) - 1
    return out


def household_data(domain: Domain, geo_row, group_row, persons) -> HierarchicalData:
    """A HierarchicalData holding exactly one household."""
    persons = np.asarray(persons, dtype=np.int64).reshape(-1, len(domain.person))
    return HierarchicalData.from_arrays(
        domain,
        np.asarray(geo_row, dtype=np.int64).reshape(1, -1),
        np.asarray(group_row, dtype=np.int64).reshape(1, -1),
        persons,
        np.array([0, len(persons)], dtype=np.int64),
    )


def _random_persons(domain: Domain, m: int, rng: np.random.Generator) -> np.ndarray:
    return np.column_stack([rng.integers(0, s, size=m) for s in domain.person_sizes]).astype(np.int64)


def random_household(domain: Domain, m: int, rng: np.random.Generator, rederive: Rederive) -> tuple[np.ndarray, np.ndarray]:
    """(group_row, persons) of a random household of m persons, derived attributes re-derived."""
    persons = _random_persons(domain, m, rng)
    group = np.array([rng.integers(0, s) for s in domain.group_sizes], dtype=np.int64)
    return rederive(group, persons, domain), persons


def _constant_persons(domain: Domain, m: int, k: int) -> np.ndarray:
    """m identical persons, every attribute at value k (modulo its size)."""
    return np.tile(np.array([k % s for s in domain.person_sizes], dtype=np.int64), (m, 1))


def _distinct_persons(domain: Domain, m: int, attrs: Sequence[str], rng: np.random.Generator, start: int = 0,
                      constant: int | None = None) -> np.ndarray:
    """m persons whose values on ``attrs`` enumerate dom(attrs) in mixed radix from ``start``
    (pairwise different for the first |dom(attrs)| of them); other attributes random, or all at
    value ``constant`` (modulo their size)."""
    p = _random_persons(domain, m, rng) if constant is None else _constant_persons(domain, m, constant)
    sizes = [domain.person_attribute(a).size for a in attrs]
    n = int(np.prod(sizes))
    idx = (np.arange(start, start + m) % n).astype(np.int64)
    cols = np.unravel_index(idx, sizes)
    for a, c in zip(attrs, cols):
        p[:, domain.person_index(a)] = c
    return p


def _focus_sets(domain: Domain, focus: Iterable[Sequence[str]] | None) -> list[tuple[str, ...]]:
    if focus is not None:
        return [tuple(f) for f in focus]
    names = [a.name for a in domain.person]
    return [c for k in range(1, min(3, len(names)) + 1) for c in itertools.combinations(names, k)]


def _with(base: HierarchicalData, geo_row, group_row, persons) -> HierarchicalData:
    return HierarchicalData.concat([base, household_data(base.domain, geo_row, group_row, persons)])


def neighbour_pairs(
    data: HierarchicalData,
    unit: str,
    *,
    trials: int = 50,
    rng: np.random.Generator | None = None,
    rederive: Rederive = rederive_size_only,
    focus: Iterable[Sequence[str]] | None = None,
    identical_variants: int = 3,
    oversize: str = "clip",
    group_quarters: str = "exclude",
) -> list[Pair]:
    """Random and worst-case neighbouring pairs (D, D') of ``data`` under the privacy unit and
    the ingestion rules (``schemas.ingestion.HouseholdRules``: ``oversize``, ``group_quarters``;
    under the person unit a housing unit without exactly one householder is excluded)."""
    if unit not in ("household", "person"):
        raise ValueError(f"unit must be 'household' or 'person', got {unit!r}")
    if oversize not in ("clip", "exclude") or group_quarters not in ("exclude", "single_person_households"):
        raise ValueError(f"unknown ingestion rules oversize={oversize!r}, group_quarters={group_quarters!r}")
    rng = np.random.default_rng() if rng is None else rng
    d = data.domain
    M = d.max_size
    n = data.n_households
    if n == 0:
        raise ValueError("need a non-empty dataset")
    pairs: list[Pair] = []
    geo0 = data.geo[0]
    focus_sets = _focus_sets(d, focus)

    if unit == "household":
        for _ in range(trials):
            if rng.random() < 0.5:
                h = int(rng.integers(n))
                keep = np.ones(n, dtype=bool)
                keep[h] = False
                pairs.append((data, data.select(keep)))
            else:
                g, p = random_household(d, int(rng.integers(1, M + 1)), rng, rederive)
                pairs.append((data, _with(data, data.geo[rng.integers(n)], g, p)))
        worst_persons = [np.repeat(_random_persons(d, 1, rng), M, axis=0) for _ in range(identical_variants)]
        worst_persons += [_distinct_persons(d, M, fs, rng) for fs in focus_sets]
        for p in worst_persons:
            g = rederive(np.array([rng.integers(0, s) for s in d.group_sizes], dtype=np.int64), p, d)
            pairs.append((data, _with(data, geo0, g, p)))
        return pairs

    # person unit: each raw neighbour, then what the ingestion rules make of it (join_household)
    assert data.sizes.max() <= M

    def replaced(h: int, persons: np.ndarray | None) -> HierarchicalData:
        """``data`` with household h's persons replaced (None: the household excluded)."""
        keep = np.ones(n, dtype=bool)
        keep[h] = False
        rest = data.select(keep)
        if persons is None:
            return rest
        return _with(rest, data.geo[h], rederive(data.group[h].astype(np.int64), persons, d), persons)

    for _ in range(trials):
        h = int(rng.integers(n))
        start, stop = int(data.person_offsets[h]), int(data.person_offsets[h + 1])
        persons = data.person[start:stop].astype(np.int64)
        r = rng.random()
        if r < 0.15:  # the person arrives alone (new household) or leaves a one-person one
            if len(persons) == 1:
                pairs.append((data, replaced(h, None)))
            else:
                g, p = random_household(d, 1, rng, rederive)
                pairs.append((data, _with(data, data.geo[h], g, p)))
        elif r < 0.25:  # the householder leaves, or a second one joins: the unit is excluded
            pairs.append((data, replaced(h, None)))
        elif r < 0.6 and len(persons) >= 2:  # a person other than the householder leaves
            pairs.append((data, replaced(h, np.delete(persons, int(rng.integers(1, len(persons))), axis=0))))
        else:  # a person joins, after the householder
            pos = int(rng.integers(1, len(persons) + 1))
            pairs.append((data, replaced(h, join_household(persons, _random_persons(d, 1, rng)[0], pos, M, oversize))))
    if group_quarters == "single_person_households":  # a group-quarters person: a one-person household
        g, p = random_household(d, 1, rng, rederive)
        pairs.append((data, _with(data, geo0, g, p)))
    # worst cases: households of M − 1 and of M persons (all identical / all different as above,
    # the others' values held constant) gain a newcomer right after the householder or last — a
    # copy, random persons, the householder's copy but for one attribute, persons in a new cell of
    # the focus set differing from the householder elsewhere — or lose their householder
    width = max(d.person_sizes)
    bases = [_constant_persons(d, m, k) for m in (M - 1, M) if m >= 1 for k in range(identical_variants)]
    focus_bases = [(fs, _distinct_persons(d, m, fs, rng, constant=k)) for m in (M - 1, M) if m >= 1
                   for fs in focus_sets for k in range(2)]
    for fs, p in [(None, p) for p in bases] + focus_bases:
        g0 = rederive(np.array([rng.integers(0, s) for s in d.group_sizes], dtype=np.int64), p, d)
        before = _with(data, geo0, g0, p)
        pairs.append((before, data))  # the householder leaves: the unit is excluded
        newcomers = [p[0], _random_persons(d, 1, rng)[0], _random_persons(d, 1, rng)[0]]
        for j, size in enumerate(d.person_sizes):  # the householder's copy but for one attribute
            for k in range(1, size):
                q = p[0].copy()
                q[j] = (q[j] + k) % size
                newcomers.append(q)
        if fs is not None:
            nxt = _distinct_persons(d, 1, fs, rng, start=len(p))[0]
            focus_idx = [d.person_index(a) for a in fs]
            for k in range(1, width):
                q = (p[0] + k) % np.asarray(d.person_sizes)
                q[focus_idx] = nxt[focus_idx]
                newcomers.append(q)
        for extra in newcomers:
            for pos in sorted({1, len(p)}):
                q = join_household(p, extra, pos, M, oversize)
                pairs.append((before, data if q is None else _with(data, geo0, rederive(g0, q, d), q)))
    return pairs


def join_household(persons: np.ndarray, newcomer: np.ndarray, pos: int, M: int, oversize: str) -> np.ndarray | None:
    """The encoded household after ``newcomer`` joins the raw one whose kept persons are
    ``persons`` (householder first), at person-number position ``pos`` ≥ 1, under the ingestion's
    oversize rule (``schemas.ingestion.encode_person_table``): below the cap it gains the person;
    at the cap M (or above it: the kept persons are the same) ``clip`` keeps the first M — the
    newcomer replaces the last kept person, or is not kept — and ``exclude`` drops the household
    (None). Under ``exclude`` a raw household already above M stays excluded: no change, no pair."""
    if pos < 1:
        raise ValueError("the householder stays first: a newcomer joins after them")
    if len(persons) < M:
        return np.insert(persons, pos, newcomer, axis=0)
    if oversize == "exclude":
        return None
    if oversize != "clip":
        raise ValueError(f"unknown oversize rule {oversize!r}")
    return np.insert(persons, pos, newcomer, axis=0)[:M]


def check_sensitivity(
    workload_fn: Callable[[HierarchicalData], np.ndarray],
    data: HierarchicalData,
    unit: str,
    l1_bound: float,
    l2_bound: float,
    *,
    trials: int = 50,
    rng: np.random.Generator | None = None,
    rederive: Rederive = rederive_size_only,
    focus: Iterable[Sequence[str]] | None = None,
    pairs: Sequence[Pair] | None = None,
    tol: float = 1e-9,
    oversize: str = "clip",
    group_quarters: str = "exclude",
) -> tuple[float, float]:
    """Assert that ``workload_fn`` moves by at most (l1_bound, l2_bound) between neighbours.

    ``pairs`` may be precomputed with :func:`neighbour_pairs` (to reuse them across workloads);
    otherwise they are built from ``data``. Returns the maximum observed (L1, L2) change.
    Raises ``AssertionError`` naming the offending pair's change when a bound is violated.
    """
    if pairs is None:
        pairs = neighbour_pairs(data, unit, trials=trials, rng=rng, rederive=rederive, focus=focus, oversize=oversize,
                                group_quarters=group_quarters)
    cache: dict[int, np.ndarray] = {}

    def ans(x: HierarchicalData) -> np.ndarray:
        k = id(x)
        if k not in cache:
            cache[k] = np.asarray(workload_fn(x), dtype=np.float64).ravel()
        return cache[k]

    max_l1 = max_l2 = 0.0
    for i, (a, b) in enumerate(pairs):
        diff = ans(b) - ans(a)
        l1 = float(np.abs(diff).sum())
        l2 = float(math.sqrt(float(np.dot(diff, diff))))
        if l1 > l1_bound + tol or l2 > l2_bound + tol:
            raise AssertionError(
                f"sensitivity bound violated ({unit} unit, pair {i}): observed L1={l1}, L2={l2}; "
                f"declared L1={l1_bound}, L2={l2_bound}; changed cells {np.flatnonzero(diff).tolist()}"
            )
        max_l1, max_l2 = max(max_l1, l1), max(max_l2, l2)
    return max_l1, max_l2
