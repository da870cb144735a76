"""Household weights calibrated to public totals (the config's ``weights.totals``), added to the
release tables as ``WEIGHT``.

Post-processing only: the weights are a function of the released households (their PUMA, state
and size) and of the public totals file, never of confidential data. Every household gets a
weight by raking (``engine.synthesis``) to the households per PUMA, and to the persons per PUMA
and the households and persons per state where the file gives them; a person's weight is their
household's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.synthesis import Margin, rake
from schemas.release_schema import weight_field
from schemas.weight_totals import WeightTotals, WeightTotalsError

METHOD = ("raking (generalized iterative proportional fitting) of household weights starting at 1 to the public totals; "
          "the fixed point is the weight vector closest to 1 in the raking distance that meets every total; "
          "a person's weight is their household's")


def _cells(keys: pd.MultiIndex | pd.Index, table: pd.DataFrame, totals: WeightTotals, level: str) -> tuple[np.ndarray, pd.DataFrame]:
    """The cell of every household (the released nodes, sorted) and the totals of those cells."""
    nodes = keys.unique().sort_values()
    missing = nodes.difference(table.index)
    if len(missing):
        node = missing[0]
        name = f"ST {node[0]:02d} PUMA {node[1]:05d}" if level == "PUMA" else f"ST {node:02d}"
        raise WeightTotalsError(f"{totals.path}: no row for {name}, a released {level} "
                                f"({len(missing)} released {level}s have none); expected one row per released {level}")
    return nodes.get_indexer(keys), table.loc[nodes]


def _node_names(nodes: pd.Index) -> tuple[str, ...]:
    return tuple(f"ST={n[0]:02d}/PUMA={n[1]:05d}" if isinstance(n, tuple) else f"ST={n:02d}" for n in nodes)


def calibrate(st: np.ndarray, puma: np.ndarray, size: np.ndarray, totals: WeightTotals) -> tuple[np.ndarray, dict]:
    """Every released household's weight (households given by their state, PUMA and size codes,
    in release order: all a weight depends on) and the manifest's weights entry."""
    st, puma, size = np.asarray(st, dtype=np.int64), np.asarray(puma, dtype=np.int64), np.asarray(size, dtype=float)
    ones = np.ones(len(size))
    puma_cell, puma_totals = _cells(pd.MultiIndex.from_arrays([st, puma]), totals.puma, totals, "PUMA")
    names = _node_names(puma_totals.index)
    margins = [Margin("households per PUMA", puma_cell, ones, puma_totals.households.to_numpy(), names)]
    if totals.has_persons:
        margins.append(Margin("persons per PUMA", puma_cell, size, puma_totals.persons.to_numpy(), names))
    if len(totals.state):
        state_cell, state_totals = _cells(pd.Index(st), totals.state, totals, "state")
        names = _node_names(state_totals.index)
        margins.append(Margin("households per state", state_cell, ones, state_totals.households.to_numpy(), names))
        if totals.has_persons:
            margins.append(Margin("persons per state", state_cell, size, state_totals.persons.to_numpy(), names))
    result = rake(margins)
    entry = {
        "weighted": True,
        "column": weight_field().name,
        "method": METHOD,
        "margins": [{"name": m.name, "cells": len(m.totals)} for m in margins],
        "sweeps": result.iterations,
        "max_relative_error": result.max_relative_error,
        "totals_file": totals.path.name,
    }
    return result.weights, entry


def weight_keys(households: pa.Table, size_attribute: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(state, PUMA, size) of every household of a release table: what :func:`calibrate` reads."""
    return tuple(np.asarray(households.column(c).to_numpy(zero_copy_only=False)).astype(np.int64)  # type: ignore[return-value]
                 for c in ("ST", "PUMA", size_attribute))


def with_weights(households: pa.Table, persons: pa.Table, weights: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """The tables with ``WEIGHT`` appended: ``weights`` per household row; a person's is their household's."""
    serial = pd.Index(households.column("SERIALNO").to_numpy(zero_copy_only=False))
    of_person = serial.get_indexer(persons.column("SERIALNO").to_numpy(zero_copy_only=False))
    field = weight_field()
    return (households.append_column(field, pa.array(weights, pa.float64())),
            persons.append_column(field, pa.array(weights[of_person], pa.float64())))
