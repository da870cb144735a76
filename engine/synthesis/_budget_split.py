"""The synthesis budget's split between the state and the PUMA level, chosen by the expected error
simulated on the public data: no privacy cost, no confidential input.

Each public state in turn plays the private state, the other public states pooled are its prior.
For every cell c of every workload, with the Gaussian noise σ of a measurement at a level's ρ
(σ_w = L2(w)/√(2ρ_w), the workloads splitting the level's measured ρ evenly as
:func:`engine.synthesis._node.measure_node` does), the update is modelled as the Bayes shrinkage of the
prior towards the measurement, whose mean squared error is

    v = e²σ² / (e² + σ²)        (e: the prior's error in the cell, σ: the measurement's noise)

- state:  e_s = C_s − π·D_s (C the true count, D the node's households or persons, π the prior's
  share), giving v_s;
- PUMA:   its prior is the state posterior scaled to the PUMA: e_p² = (C_p − D_p·C_s/D_s)²
  + (D_p/D_s)²·v_s, giving v_p at the PUMA's σ;
- the released state answer is its PUMAs' sum, which the P PUMA measurements (variance P·σ_p²)
  inform as well: v_s' = 1 / (1/v_s + 1/(P·σ_p²)).

A level's expected error is the mean over nodes and workloads of Σ_c √(2/π)·√v / D (the L1
distance of the normalised marginal, each cell's error taken as Gaussian), and the split minimises
the mean of the state and PUMA levels' errors over the candidate fractions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from engine.data import HierarchicalData, unique_rows
from engine.queries import PrivacyUnit, Workload, counts_by_node

__all__ = ["STATE_FRACTIONS", "SplitChoice", "choose_state_fraction", "expected_errors"]

STATE_FRACTIONS: tuple[Fraction, ...] = tuple(Fraction(k, 10) for k in range(2, 10))  # 0.2 .. 0.9


@dataclass(frozen=True)
class SplitChoice:
    """The chosen fraction of the synthesis ρ spent at the state level (the rest at the PUMAs) and,
    per candidate fraction, the simulated expected error (state, PUMA, their mean)."""

    state_fraction: Fraction
    table: tuple[tuple[Fraction, float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "expected error simulated on the public data (engine.synthesis._budget_split): each public state as the private one, the others as its prior",
            "state_fraction": str(self.state_fraction),
            "candidates": [{"state_fraction": str(f), "expected_l1_state": s, "expected_l1_puma": p, "objective": (s + p) / 2}
                           for f, s, p in self.table],
        }


@dataclass(frozen=True)
class _PlayedState:
    """One workload at one public state playing the private one, everything but the noise: the
    prior's squared error per cell ``e2`` and the state's households or persons ``d``; per PUMA
    its squared deviation from the state's shares ``dev2`` (P, cells), its share of the state's
    denominator ``scale`` and its own ``d_p``."""

    e2: np.ndarray
    d: float
    dev2: np.ndarray
    scale: np.ndarray
    d_p: np.ndarray


def _public_cells(public: HierarchicalData, workloads: Sequence[Workload], unit: PrivacyUnit) -> list[tuple[float, list[_PlayedState]]]:
    """Per workload: its L2 sensitivity and its :class:`_PlayedState` at every public state with
    at least two PUMAs (the part of the simulation that does not depend on ρ, computed once)."""
    geo_state, geo_puma = public.domain.geography[0], public.domain.geography[1]
    states = unique_rows(public.geo[:, :1])
    pumas = unique_rows(public.geo[:, :2])
    puma_state = np.searchsorted(states[:, 0], pumas[:, 0])
    play = np.flatnonzero(np.bincount(puma_state, minlength=len(states)) >= 2)
    if len(states) < 2 or not len(play) or not workloads:
        raise ValueError("the split simulation needs at least two public states, one of them with two PUMAs, and a workload")
    out = []
    for w in workloads:
        c_s, d_s = counts_by_node(public, w, geo_state, states)
        c_p, d_p = counts_by_node(public, w, geo_puma, pumas)
        # a normalised workload's cells (and its sensitivity) back in households, so that they
        # weigh like a count workload's
        unit_scale = w.household_unit
        c_s, c_p = c_s / unit_scale, c_p / unit_scale
        played = []
        for s in play:
            others = np.arange(len(states)) != s
            prior = c_s[others].sum(axis=0) / max(d_s[others].sum(), 1.0)
            mine = puma_state == s
            d = max(float(d_s[s]), 1.0)
            scale = d_p[mine] / d
            played.append(_PlayedState((c_s[s] - prior * d_s[s]) ** 2, d, (c_p[mine] - scale[:, None] * c_s[s]) ** 2, scale,
                                       np.maximum(d_p[mine], 1.0)))
        out.append((w.sensitivity(public.domain, unit)[1] / unit_scale, played))
    return out


def _shrunk(e2: np.ndarray, s2: float) -> np.ndarray:
    """The Bayes shrinkage's mean squared error e²σ²/(e² + σ²) (0 where both are 0)."""
    mse: np.ndarray = np.divide(e2 * s2, e2 + s2, out=np.zeros_like(e2), where=(e2 + s2) > 0)
    return mse


def _expected(cells: list[tuple[float, list[_PlayedState]]], rho_state: float, rho_puma: float) -> tuple[float, float]:
    """:func:`expected_errors` from the public cells of :func:`_public_cells`."""
    s_err, p_err = [], []
    for l2, played in cells:
        var_s = l2**2 / (2 * rho_state / len(cells))
        var_p = l2**2 / (2 * rho_puma / len(cells))
        for st in played:
            v_s = _shrunk(st.e2, var_s)
            v_p = _shrunk(st.dev2 + st.scale[:, None] ** 2 * v_s, var_p)
            v_released = 1.0 / (1.0 / np.maximum(v_s, 1e-300) + 1.0 / (len(st.scale) * var_p))
            s_err.append(math.sqrt(2 / math.pi) * np.sqrt(v_released).sum() / st.d)
            p_err.append(float(np.mean(math.sqrt(2 / math.pi) * np.sqrt(v_p).sum(axis=1) / st.d_p)))
    return float(np.mean(s_err)), float(np.mean(p_err))


def expected_errors(public: HierarchicalData, workloads: Sequence[Workload], unit: PrivacyUnit, rho_state: float, rho_puma: float) -> tuple[float, float]:
    """Expected mean L1 per marginal (state level, PUMA level) when each public state with at least
    two PUMAs is released from the others' prior with ``rho_state`` per state and ``rho_puma`` per
    PUMA spread evenly over ``workloads`` (module docstring)."""
    return _expected(_public_cells(public, workloads, unit), rho_state, rho_puma)


def choose_state_fraction(public: HierarchicalData, workloads: Sequence[Workload], unit: PrivacyUnit, rho_synthesis: float, *,
                          state_measured: float = 1.0, fractions: Sequence[Fraction] = STATE_FRACTIONS) -> SplitChoice:
    """The fraction f of ``rho_synthesis`` (the state and PUMA synthesis stages together, per
    state and per PUMA) for the state level minimising the simulated error; ``state_measured``:
    the part of the state's ρ spent on ``workloads`` (the rest goes to adaptive rounds)."""
    cells = _public_cells(public, workloads, unit)
    table = []
    for f in fractions:
        s, p = _expected(cells, float(f) * rho_synthesis * state_measured, float(1 - f) * rho_synthesis)
        table.append((Fraction(f), s, p))
    best = min(table, key=lambda row: (row[1] + row[2], row[0]))
    return SplitChoice(best[0], tuple(table))
