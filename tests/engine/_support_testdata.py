"""Small random hierarchical datasets for the queries / workload-selection / prior-update tests.

Also holds the brute-force (pure-Python loops) reference answers of H-GEM Table 1 queries, used
only by the tests as an independent check of the vectorised code in ``engine.queries._queries``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from engine.data._domain import Attribute, Domain
from engine.data._hierarchical_data import HierarchicalData
from engine.queries._queries import NORM_SCALE, Workload


def attr(name: str, k: int) -> Attribute:
    return Attribute(name, tuple(str(i) for i in range(k)), tuple(f"{name}={i}" for i in range(k)))


def small_domain(M: int = 4) -> Domain:
    return Domain(
        group=(
            attr("TEN", 3),
            Attribute("NP", tuple(str(i) for i in range(1, M + 1)), tuple(str(i) for i in range(1, M + 1))),
            attr("R18", 2),
        ),
        person=(attr("SEX", 2), attr("AGE", 4), attr("RAC", 3)),
        geography=("ST", "PUMA"),
        max_size=M,
    )


def random_data(domain: Domain, n: int, seed: int = 0, dependence: float = 0.7) -> HierarchicalData:
    """Random households; AGE of persons depends on the household's TEN, RAC is shared within a
    household with probability ``dependence``, R18 depends on NP; sizes 1..M."""
    rng = np.random.default_rng(seed)
    M = domain.max_size
    sizes = rng.integers(1, M + 1, size=n)
    ten = rng.integers(0, 3, size=n)
    r18 = (rng.random(n) < np.clip(0.15 * sizes, 0, 0.9)).astype(int)
    group = np.stack([ten, sizes - 1, r18], axis=1)
    off = np.concatenate([[0], np.cumsum(sizes)])
    n_i = int(off[-1])
    hh = np.repeat(np.arange(n), sizes)
    sex = rng.integers(0, 2, size=n_i)
    age = np.where(rng.random(n_i) < dependence, (ten[hh] + rng.integers(0, 2, n_i)) % 4, rng.integers(0, 4, n_i))
    hh_rac = rng.integers(0, 3, size=n)
    rac = np.where(rng.random(n_i) < dependence, hh_rac[hh], rng.integers(0, 3, n_i))
    person = np.stack([sex, age, rac], axis=1)
    geo = np.stack([rng.integers(1, 3, size=n), rng.integers(100, 103, size=n)], axis=1)
    return HierarchicalData.from_arrays(domain, geo, group, person, off)


def all_workloads(domain: Domain, max_k: int = 3) -> list[Workload]:
    """Every workload kind: group partitions, group "contains", person level (with and without S_G)."""
    g = [a.name for a in domain.group]
    p = [a.name for a in domain.person]
    out = []
    for k in range(1, max_k + 1):
        for kg in range(0, k + 1):
            for sg in itertools.combinations(g, kg):
                for si in itertools.combinations(p, k - kg):
                    out.append(Workload("group", sg, si))
                    if si or sg:
                        out.append(Workload("person", sg, si))
    return [w for w in out if w.attrs]


def brute_force_answer(data: HierarchicalData, w: Workload, weights=None) -> np.ndarray:
    """Table 1 of the H-GEM paper with explicit loops over households and persons."""
    d = data.domain
    shape = w.shape(d)
    out = np.zeros(shape, dtype=np.float64)
    gi = [d.group_index(a) for a in w.group_attrs]
    pi = [d.person_index(a) for a in w.person_attrs]
    for h in range(data.n_households):
        wt = 1.0 if weights is None else float(weights[h])
        yg = tuple(int(data.group[h, j]) for j in gi)
        persons = range(int(data.person_offsets[h]), int(data.person_offsets[h + 1]))
        column: dict[tuple, float] = {}  # this household's entries, cell -> count
        if w.level == "group":
            if not pi:
                out[yg] += wt
                continue
            for r in persons:
                column[yg + tuple(int(data.person[r, j]) for j in pi)] = 1.0
        else:
            for slot, r in enumerate(persons):
                if w.first and slot >= w.first:  # only the household's first w.first persons
                    break
                cell = yg + tuple(int(data.person[r, j]) for j in pi)
                column[cell] = column.get(cell, 0.0) + 1.0
        if w.normalised:  # each entry rescaled to ⌊S·k/‖k‖₂⌋ (Workload.normalised), in exact integers
            norm2 = sum(int(k) ** 2 for k in column.values())
            column = {c: float(math.isqrt(NORM_SCALE**2 * int(k) ** 2 // norm2)) for c, k in column.items()}
        for cell, k in column.items():
            out[cell] += wt * k
    return out.reshape(-1)
