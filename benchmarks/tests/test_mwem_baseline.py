"""The MWEM baseline of the H-GEM benchmark (benchmarks/baselines/mwem.py): reduced domain,
explicit household histogram, MWEM rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.baselines.mwem import HouseholdHistogram, MWEMConfig, reduce_data, train_mwem
from engine.hgem.answers import exact_normalised_answers
from engine.hgem.workloads import kway_workloads
from tests.hgem.conftest import synthetic_data, tiny_domain


@pytest.fixture(scope="module")
def big():
    return synthetic_data(tiny_domain(M=5), 2000, seed=2)


def test_reduce_data_clip_and_drop(big):
    red, spec = reduce_data(big, max_size=3)
    d = red.domain
    assert d.max_size == 3 and [a.name for a in d.group] == ["TEN", "NP", "BLD"]
    assert [a.name for a in d.person] == ["SEX", "AGE_BIN", "RAC_BIN"]  # SEX is already binary
    assert all(a.size == 2 for a in d.person)
    assert red.n_households == big.n_households  # clip keeps every household
    assert red.sizes.max() == 3 and (red.sizes == np.minimum(big.sizes, 3)).all()
    age = spec.person_attrs.index("AGE")
    assert spec.person_maps[age] == (0, 0, 1, 1)
    dropped, _ = reduce_data(big, max_size=3, size_rule="drop")
    assert dropped.n_households == int((big.sizes <= 3).sum())
    ones, spec2 = reduce_data(big, person_attrs=["AGE"], person_ones={"AGE": [0]}, max_size=3)
    assert spec2.person_maps == ((1, 0, 0, 0),)
    hh_first_age = big.person[big.person_offsets[:-1], big.domain.person_index("AGE")]
    assert np.array_equal(ones.person[ones.person_offsets[:-1], 0], (hh_first_age == 0).astype(int))


def test_histogram_answers_are_exact(big):
    red, _ = reduce_data(big, max_size=3)
    H = HouseholdHistogram(red.domain, device="cpu")
    assert H.n_cells == 3 * 2 * (8 + 64 + 512)  # d_G Σ_m d_I^m
    A = H.from_data(red)
    ws = kway_workloads(red.domain, 3) + kway_workloads(red.domain, 1)
    for w, ex in zip(ws, exact_normalised_answers(red, ws)):
        np.testing.assert_allclose(H.answers(A, w).numpy(), ex, atol=1e-12)
    s = H.sample(A, 30_000, seed=1)
    worst = max(np.abs(a - b).max() for a, b in zip(exact_normalised_answers(s, ws), exact_normalised_answers(red, ws)))
    assert worst < 0.03


def test_predicate_weights_match_cell_predicates(big):
    red, _ = reduce_data(big, max_size=2)
    H = HouseholdHistogram(red.domain, device="cpu")
    w = kway_workloads(red.domain, 2)[5]
    e = torch.randn(w.n_cells(red.domain), dtype=torch.float64)
    g = H.predicate_weights(w, e)
    eye = torch.eye(H.n_cells, dtype=torch.float64)
    direct = torch.stack([(H.linear_answers(eye[i], w) * e).sum() for i in range(0, H.n_cells, 7)])
    torch.testing.assert_close(g[::7], direct)


def test_mwem_improves_error(big):
    red, _ = reduce_data(big, max_size=3)
    ws = kway_workloads(red.domain, 3)
    true = exact_normalised_answers(red, ws)
    H = HouseholdHistogram(red.domain, device="cpu")
    U = H.uniform()
    err = lambda A: np.mean([np.abs(H.answers(A, w).numpy() - t).mean() for w, t in zip(ws, true)])  # noqa: E731
    res = train_mwem(red.domain, ws, true, lambda s, e: int(np.argmax(s)), lambda w: true[ws.index(w)], 1e-3,
                     MWEMConfig(rounds=15, max_update_steps=10, output="average_updates"), device="cpu")
    assert err(res.output) < 0.5 * err(U)
    assert err(res.last) < 0.5 * err(U)
    assert float(res.output.sum()) == pytest.approx(1.0)
    paper = train_mwem(red.domain, ws, true, lambda s, e: int(np.argmax(s)), lambda w: true[ws.index(w)], 1e-3,
                       MWEMConfig(rounds=15, max_update_steps=10), device="cpu")
    assert err(paper.output) < err(U)
