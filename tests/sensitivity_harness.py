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
* ``person``: D' = D with one person added to (or removed from) an existing household. The
  household's group attributes that are functions of its persons are re-derived through the
  ``rederive(group_row, persons, domain) -> group_row`` callable. The default
  :func:`rederive_size_only` recomputes NP and keeps all other group attributes — correct for
  domains whose other group attributes are not derived from persons; pass your own callable when
  they are (the engine tests derive a HAS_CHILD attribute that way). Worst cases: a household of
  M−1 persons (all identical / all different as above) is added to the base data, and the neighbour
  has the same household with an M-th person (a copy, a "new" mixed-radix person, random persons).
  Households of size M get no person added (the domain caps size at M). A person may also arrive
  alone and form a new one-person household, or a one-person household may lose its only person
  and disappear: household counts are therefore not invariant under the person unit either.

``check_sensitivity`` returns the maximum observed (L1, L2) change so tests can also assert that a
bound is attained. Randomness here only builds test data (a seeded numpy Generator is fine).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from engine.domain import Domain
from engine.hierarchical_data import HierarchicalData

Rederive = Callable[[np.ndarray, np.ndarray, Domain], np.ndarray]
Pair = tuple[HierarchicalData, HierarchicalData]

__all__ = [
    "check_sensitivity",
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


def _distinct_persons(domain: Domain, m: int, attrs: Sequence[str], rng: np.random.Generator, start: int = 0) -> np.ndarray:
    """m persons whose values on ``attrs`` enumerate dom(attrs) in mixed radix from ``start``
    (pairwise different for the first |dom(attrs)| of them); other attributes random."""
    p = _random_persons(domain, m, rng)
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
) -> list[Pair]:
    """Random and worst-case neighbouring pairs (D, D') of ``data`` under the privacy unit."""
    if unit not in ("household", "person"):
        raise ValueError(f"unit must be 'household' or 'person', got {unit!r}")
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

    # person unit
    sizes = data.sizes
    for _ in range(trials):
        h = int(rng.integers(n))
        start, stop = int(data.person_offsets[h]), int(data.person_offsets[h + 1])
        persons = data.person[start:stop].astype(np.int64)
        if rng.random() < 0.2:  # the person arrives alone (new household) or leaves a one-person one
            if len(persons) == 1:
                keep = np.ones(n, dtype=bool)
                keep[h] = False
                pairs.append((data, data.select(keep)))
            else:
                g, p = random_household(d, 1, rng, rederive)
                pairs.append((data, _with(data, data.geo[h], g, p)))
            continue
        can_add, can_remove = len(persons) < M, len(persons) >= 2
        if not (can_add or can_remove):
            continue
        if can_add and (not can_remove or rng.random() < 0.5):
            new_p = _random_persons(d, 1, rng)
            pos = int(rng.integers(0, len(persons) + 1))
            new_persons = np.insert(persons, pos, new_p[0], axis=0)
        else:
            new_persons = np.delete(persons, int(rng.integers(len(persons))), axis=0)
        new_group = rederive(data.group[h].astype(np.int64), new_persons, d)
        keep = np.ones(n, dtype=bool)
        keep[h] = False
        pairs.append((data, _with(data.select(keep), data.geo[h], new_group, new_persons)))
    assert sizes.max() <= M
    if M >= 2:
        bases = [np.repeat(_random_persons(d, 1, rng), M - 1, axis=0) for _ in range(identical_variants)]
        bases += [_distinct_persons(d, M - 1, fs, rng) for fs in focus_sets]
        for i, p in enumerate(bases):
            g0 = rederive(np.array([rng.integers(0, s) for s in d.group_sizes], dtype=np.int64), p, d)
            before = _with(data, geo0, g0, p)
            fs = focus_sets[i - identical_variants] if i >= identical_variants else None
            additions = [p[:1], _random_persons(d, 1, rng), _random_persons(d, 1, rng)]
            if fs is not None:
                additions.append(_distinct_persons(d, 1, fs, rng, start=M - 1))
            for extra in additions:
                q = np.vstack([p, extra])
                pairs.append((before, _with(data, geo0, rederive(g0, q, d), q)))
    return pairs


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
) -> tuple[float, float]:
    """Assert that ``workload_fn`` moves by at most (l1_bound, l2_bound) between neighbours.

    ``pairs`` may be precomputed with :func:`neighbour_pairs` (to reuse them across workloads);
    otherwise they are built from ``data``. Returns the maximum observed (L1, L2) change.
    Raises ``AssertionError`` naming the offending pair's change when a bound is violated.
    """
    if pairs is None:
        pairs = neighbour_pairs(data, unit, trials=trials, rng=rng, rederive=rederive, focus=focus)
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
