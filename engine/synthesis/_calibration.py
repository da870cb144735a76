"""Calibration of household weights to public totals by raking (multiplicative calibration).

The released microdata are a synthetic sample: each household stands for itself. A user who has
public totals (for example the published ACS estimates of households and persons per PUMA) can
give every household a weight so that the weighted microdata reproduce those totals. Raking
(generalized iterative proportional fitting) cycles through the margins and, in each cell, multiplies
the weight of every household by ``exp(lambda * x)`` (``x``: what the household adds to the cell,
1 for a household count, its persons for a person count), ``lambda`` chosen so that the cell meets
its total (for a household count this is the factor ``total / weighted sum``). Its fixed point is
the weight vector closest to the starting weights in the raking distance
(``sum w log(w/d) - w + d``) that meets every margin: weights stay positive, and households that
agree on every margin's cell and contribution get the same weight.

Post-processing only: the inputs are the released households (their cells and sizes) and public
totals, never confidential data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import DPReleaseError


class CalibrationError(DPReleaseError, ValueError):
    """The public totals cannot be met by weighting the released households."""


@dataclass(frozen=True)
class Margin:
    """One set of public totals over disjoint cells of households.

    ``cell``: per household, the index of its cell (``-1``: the household is in no cell of this
    margin); ``contribution``: what one household adds to its cell's total (1 for a household
    count, its number of persons for a person count); ``totals``: the public total per cell;
    ``names``: each cell's name, for messages."""

    name: str
    cell: np.ndarray
    contribution: np.ndarray
    totals: np.ndarray
    names: tuple[str, ...]

    def weighted_sums(self, weights: np.ndarray) -> np.ndarray:
        inside = self.cell >= 0
        return np.bincount(self.cell[inside], weights=(weights * self.contribution)[inside], minlength=len(self.totals))

    def relative_error(self, weights: np.ndarray) -> float:
        return float(np.max(np.abs(self.weighted_sums(weights) - self.totals) / np.maximum(self.totals, 1.0), initial=0.0))


@dataclass(frozen=True)
class Calibration:
    weights: np.ndarray
    iterations: int
    max_relative_error: float


def _check(margin: Margin, n: int) -> None:
    if margin.cell.shape != (n,) or margin.contribution.shape != (n,):
        raise ValueError(f"margin {margin.name}: cell and contribution need one entry per household")
    if len(margin.names) != len(margin.totals):
        raise ValueError(f"margin {margin.name}: one name per total")
    if not np.all(np.isfinite(margin.totals)) or np.any(margin.totals < 0):
        raise CalibrationError(f"margin {margin.name}: every total must be a finite number >= 0")
    if np.any(margin.contribution <= 0):
        raise ValueError(f"margin {margin.name}: every household must contribute a positive amount")
    present = np.bincount(margin.cell[margin.cell >= 0], minlength=len(margin.totals)) > 0
    empty = np.flatnonzero(~present & (margin.totals > 0))
    if len(empty):
        raise CalibrationError(f"margin {margin.name}: {margin.names[empty[0]]} has a positive total but no released household"
                               f" ({len(empty)} such cells)")
    zero = np.flatnonzero(present & (margin.totals == 0))
    if len(zero):
        raise CalibrationError(f"margin {margin.name}: {margin.names[zero[0]]} has released households but a total of 0"
                               f" ({len(zero)} such cells); a weight must be positive")


def _cell_factors(margin: Margin, weights: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """Per household of the margin, ``exp(lambda_c x)`` with each cell's ``lambda_c`` solving
    ``log sum_c w x exp(lambda_c x) = log total_c`` by Newton's method on all cells at once (the
    left side is convex and increasing in lambda with slope between the cell's smallest and largest
    x, so the steps are bounded; with x constant one step is exact)."""
    cell, x, w = margin.cell[inside], margin.contribution[inside], weights[inside]
    k = len(margin.totals)
    live = np.bincount(cell, minlength=k) > 0  # _check: exactly the cells with a positive total
    target = np.log(np.where(live, margin.totals, 1.0))
    lam = np.zeros(k)
    for _ in range(100):
        wx = w * x * np.exp(lam[cell] * x)
        s1 = np.bincount(cell, weights=wx, minlength=k)
        s2 = np.bincount(cell, weights=wx * x, minlength=k)
        step = np.where(live, (np.log(np.where(live, s1, 1.0)) - target) * s1 / np.where(live, s2, 1.0), 0.0)
        lam -= step
        if np.max(np.abs(step) * x.max(initial=1.0), initial=0.0) < 1e-14:
            break
    factors: np.ndarray = np.exp(lam[cell] * x)
    return factors


def rake(margins: list[Margin], tolerance: float = 1e-8, max_iterations: int = 1000) -> Calibration:
    """Weights (one per household, starting at 1) that meet every margin to ``tolerance``
    (relative: ``|weighted sum - total| / max(total, 1)``). Raises :class:`CalibrationError` when
    a cell cannot be met (a total without households, households with a zero total) or when the
    margins do not agree within ``max_iterations`` sweeps (inconsistent totals: a state's total
    that is not its PUMAs' sum, fewer persons than households)."""
    if not margins:
        raise ValueError("raking needs at least one margin")
    n = len(margins[0].cell)
    for m in margins:
        _check(m, n)
    weights = np.ones(n)
    error = max(m.relative_error(weights) for m in margins)
    for sweep in range(1, max_iterations + 1):
        for m in margins:
            inside = m.cell >= 0
            weights[inside] *= _cell_factors(m, weights, inside)
        error = max(m.relative_error(weights) for m in margins)
        if error <= tolerance:
            return Calibration(weights, sweep, error)
    worst = max(margins, key=lambda m: m.relative_error(weights))
    raise CalibrationError(
        f"the weights cannot meet every total: after {max_iterations} raking sweeps margin {worst.name} is still off by "
        f"{error:.2g} (relative); the totals disagree (a state's total must equal the sum of its PUMAs', and a cell's "
        "persons must lie between its households times the smallest and the largest released household size)")
