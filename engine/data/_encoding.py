"""Vectorised encoding primitives: raw survey codes -> small-integer attribute codes, and the
household attributes derived from the persons of each household (CSR layout).

All functions take numpy arrays and return numpy arrays; no per-row Python.
Missing (blank) raw values are represented by ``BLANK`` (-1).
"""

from __future__ import annotations

import numpy as np

BLANK = -1


def bin_ranges(values: np.ndarray, mins: np.ndarray, maxs: np.ndarray) -> np.ndarray:
    """Index of the inclusive range [mins[k], maxs[k]] holding each value; -1 when none does.

    Ranges must be sorted and disjoint.
    """
    mins = np.asarray(mins)
    maxs = np.asarray(maxs)
    k = np.searchsorted(mins, values, side="right") - 1
    ok = (k >= 0) & (values <= maxs[np.clip(k, 0, len(maxs) - 1)]) & (values != BLANK)
    return np.where(ok, k, -1)


def map_codes(values: np.ndarray, code_groups: list[list[int | None]]) -> np.ndarray:
    """Index of the group holding each raw code (``None`` in a group matches a blank); -1 if none."""
    codes = [c for g in code_groups for c in g if c is not None]
    lo = min([0, *codes])
    hi = max([0, *codes])
    lut = np.full(hi - lo + 1, -1, dtype=np.int64)
    blank_group = -1
    for gi, g in enumerate(code_groups):
        for c in g:
            if c is None:
                blank_group = gi
            else:
                lut[c - lo] = gi
    v = np.asarray(values, dtype=np.int64)
    out = np.full(v.shape, -1, dtype=np.int64)
    inside = (v >= lo) & (v <= hi) & (v != BLANK)
    out[inside] = lut[v[inside] - lo]
    out[v == BLANK] = blank_group
    return out


def segment_any(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per household: does any of its persons satisfy ``mask``?"""
    counts = np.add.reduceat(mask.astype(np.int64), offsets[:-1]) if len(offsets) > 1 else np.zeros(0, np.int64)
    sizes = np.diff(offsets)
    return (counts > 0) & (sizes > 0)


def householder_first_order(household: np.ndarray, order_key: np.ndarray, is_householder: np.ndarray) -> np.ndarray:
    """Permutation sorting persons by household, householder first, then by ``order_key``."""
    return np.lexsort((order_key, ~is_householder, household))


def clip_sizes(offsets: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ``cap`` leading persons of every household.

    Returns (kept-person mask over the input persons, new offsets).
    """
    sizes = np.diff(offsets)
    slot = np.arange(offsets[-1]) - np.repeat(offsets[:-1], sizes)
    keep = slot < cap
    new_sizes = np.minimum(sizes, cap)
    return keep, np.concatenate([[0], np.cumsum(new_sizes)])


def multigenerational(relp: np.ndarray, offsets: np.ndarray, child: list[int], grandchild: list[int], parent: list[int]) -> np.ndarray:
    """PUMS MULTG rule: at least three generations in the household, counted from the householder:
    (child and grandchild) or (parent/parent-in-law and child) or (parent and grandchild)."""
    has_c = segment_any(np.isin(relp, child), offsets)
    has_g = segment_any(np.isin(relp, grandchild), offsets)
    has_p = segment_any(np.isin(relp, parent), offsets)
    multi: np.ndarray = (has_c & has_g) | (has_p & has_c) | (has_p & has_g)
    return multi
