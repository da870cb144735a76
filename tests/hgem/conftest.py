"""Tiny domain and a correlated synthetic hierarchical dataset for the H-GEM tests (CPU, fast)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.data._domain import Attribute, Domain
from engine.data._hierarchical_data import HierarchicalData
from tests.engine._support_testdata import attr as _attr


def tiny_domain(M: int = 3) -> Domain:
    return Domain(
        group=(
            _attr("TEN", 3),
            Attribute("NP", tuple(str(i) for i in range(1, M + 1)), tuple(str(i) for i in range(1, M + 1))),
            _attr("BLD", 2),
        ),
        person=(_attr("SEX", 2), _attr("AGE", 4), _attr("RAC", 3)),
        geography=("ST",),
        max_size=M,
    )


def synthetic_data(domain: Domain, n: int, seed: int = 0) -> HierarchicalData:
    """Households whose size depends on TEN and whose persons' AGE depends on slot and BLD."""
    rng = np.random.default_rng(seed)
    M = domain.max_size
    ten = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    size_p = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])[:, :M]
    size_p = size_p / size_p.sum(1, keepdims=True)
    u = rng.random(n)
    m = (u[:, None] > np.cumsum(size_p[ten], 1)).sum(1) + 1
    bld = (rng.random(n) < np.where(m == 1, 0.7, 0.3)).astype(int)
    group = np.stack([ten, m - 1, bld], axis=1)
    off = np.concatenate([[0], np.cumsum(m)])
    n_i = int(off[-1])
    hh = np.repeat(np.arange(n), m)
    slot = np.arange(n_i) - np.repeat(off[:-1], m)
    sex = np.where(slot == 1, 1 - (rng.random(n_i) < 0.5).astype(int) * 0, rng.integers(0, 2, n_i))
    sex = np.where(slot == 0, (rng.random(n_i) < 0.4).astype(int), sex)
    age = np.where(slot >= 2, rng.choice(4, n_i, p=[0.7, 0.2, 0.05, 0.05]), rng.choice(4, n_i, p=[0.05, 0.3, 0.4, 0.25]))
    age = np.where((bld[hh] == 1) & (slot == 0), 3, age)
    rac = np.where(rng.random(n_i) < 0.8, ten[hh] % 3, rng.integers(0, 3, n_i))
    person = np.stack([sex, age, rac], axis=1)
    geo = np.zeros((n, 1), dtype=np.int32)
    return HierarchicalData.from_arrays(domain, geo, group, person, off)


@pytest.fixture(scope="session")
def domain() -> Domain:
    return tiny_domain()


@pytest.fixture(scope="session")
def data(domain) -> HierarchicalData:
    return synthetic_data(domain, 3000, seed=1)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
    yield
