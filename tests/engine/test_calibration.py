"""Raking of household weights (engine.synthesis._calibration) against closed-form and brute-force solutions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from engine.synthesis._calibration import CalibrationError, Margin, rake


def households(rng: np.random.Generator, cells: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    cell = np.sort(rng.integers(0, cells, n))
    cell[:cells] = np.arange(cells)  # every cell has a household
    return np.sort(cell), rng.integers(1, 7, n).astype(float)


def margin(name: str, cell: np.ndarray, contribution: np.ndarray, totals: np.ndarray) -> Margin:
    return Margin(name, cell, contribution, np.asarray(totals, float), tuple(f"cell {i}" for i in range(len(totals))))


def test_household_totals_alone_give_total_over_count():
    rng = np.random.default_rng(1)
    cell, _ = households(rng, 5, 200)
    totals = rng.uniform(1e3, 1e5, 5)
    got = rake([margin("households", cell, np.ones(200), totals)])
    np.testing.assert_allclose(got.weights, (totals / np.bincount(cell))[cell], rtol=1e-12)
    assert got.iterations == 1


def test_household_and_person_totals_match_the_exponential_family_solution():
    """In one cell with household total H and person total P the raking fixed point is
    w_i = exp(a + b NP_i) (the minimiser of the raking distance under both constraints); b solves
    H * E_b[NP] = P, found here by bracketing, a follows from the household total."""
    rng = np.random.default_rng(2)
    size = rng.integers(1, 7, 300).astype(float)
    H, P = 5000.0, 5000.0 * 2.9
    cell = np.zeros(300, dtype=np.int64)

    def persons_minus_target(b: float) -> float:
        e = np.exp(b * (size - size.mean()))
        return H * (size * e).sum() / e.sum() - P

    b = brentq(persons_minus_target, -20, 20, xtol=1e-14)
    e = np.exp(b * (size - size.mean()))
    expected = H * e / e.sum()
    got = rake([margin("households", cell, np.ones(300), [H]), margin("persons", cell, size, [P])], tolerance=1e-12)
    np.testing.assert_allclose(got.weights, expected, rtol=1e-8)


def test_raking_fixed_point_meets_puma_household_and_state_person_totals():
    rng = np.random.default_rng(3)
    puma, size = households(rng, 6, 600)
    state = puma // 3  # PUMAs 0-2 in state 0, 3-5 in state 1
    hh_totals = rng.uniform(2e4, 6e4, 6)
    person_totals = np.array([hh_totals[:3].sum(), hh_totals[3:].sum()]) * np.array([2.3, 2.6])
    margins = [margin("households per PUMA", puma, np.ones(600), hh_totals), margin("persons per state", state, size, person_totals)]
    got = rake(margins)
    np.testing.assert_allclose(np.bincount(puma, weights=got.weights), hh_totals, rtol=1e-8)
    np.testing.assert_allclose(np.bincount(state, weights=got.weights * size), person_totals, rtol=1e-8)
    assert np.all(got.weights > 0) and got.max_relative_error <= 1e-8
    # negative control: the household margin alone does not meet the person totals
    alone = rake(margins[:1]).weights
    assert not np.allclose(np.bincount(state, weights=alone * size), person_totals, rtol=1e-3)


def test_inconsistent_totals_are_refused():
    rng = np.random.default_rng(4)
    puma, _ = households(rng, 4, 100)
    state = puma // 2
    with pytest.raises(CalibrationError, match="cannot meet every total"):
        rake([margin("households per PUMA", puma, np.ones(100), [10.0, 20.0, 30.0, 40.0]),
              margin("households per state", state, np.ones(100), [30.0, 71.0])], max_iterations=200)


def test_persons_fewer_than_households_are_refused():
    size = np.array([1.0, 2.0, 3.0])
    cell = np.zeros(3, dtype=np.int64)
    with pytest.raises(CalibrationError, match="cannot meet every total"):
        rake([margin("households", cell, np.ones(3), [100.0]), margin("persons", cell, size, [90.0])], max_iterations=200)


def test_a_cell_without_households_or_with_a_zero_total_is_refused():
    cell = np.array([0, 0, 2])
    with pytest.raises(CalibrationError, match="cell 1 has a positive total but no released household"):
        rake([margin("households", cell, np.ones(3), [5.0, 5.0, 5.0])])
    with pytest.raises(CalibrationError, match="cell 2 has released households but a total of 0"):
        rake([margin("households", cell, np.ones(3), [5.0, 0.0, 0.0])])
