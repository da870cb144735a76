"""Integer-array steps the engine shares, each equal to the numpy call it replaces.

:func:`repeat_runs` (``np.repeat``): ``np.repeat`` holds the GIL for its whole copy. A Dask worker
runs two tasks in one process, so while one thread repeats a long array (a state's joint
incidence, millions of entries) the other waits, whatever it was doing. :func:`repeat_runs` gives
the same array from steps that release the GIL: each non-empty run's first entry gets the step
from the run before it, and a cumulative sum spreads the steps.

:func:`sorted_counts` (``np.unique`` with counts) and :func:`unique_rows` (``np.unique`` along
rows): :func:`sorted_counts` sorts stably, which merges the natural runs of keys that arrive
household after household (numpy's quicksort does not use them); :func:`unique_rows` makes a row of
small non-negative codes one integer key instead of numpy's record view compared field by field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["repeat_runs", "sorted_counts", "unique_rows"]


def repeat_runs(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``np.repeat(values, lengths)`` for integer ``values`` (one per run) and non-negative
    ``lengths``, in ``values``' integer type. Exact: the steps and their sums wrap around in that
    type, and each sum is one of the values, which the type holds."""
    values, lengths = np.asarray(values), np.asarray(lengths)
    if values.ndim != 1 or lengths.shape != values.shape or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"repeat_runs takes one integer value per run: values {values.dtype} {values.shape}, lengths {lengths.shape}")
    if lengths.size and int(lengths.min()) < 0:
        raise ValueError("run lengths must be non-negative counts")
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if ends.size else 0
    out = np.zeros(total, dtype=values.dtype)
    if total:
        nonempty = np.flatnonzero(lengths)
        kept = values[nonempty]
        out[ends[nonempty[1:]] - lengths[nonempty[1:]]] = np.diff(kept)
        out[0] = kept[0]
        np.cumsum(out, out=out)
    return out


def sorted_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_counts=True)`` for a 1-D array of integer ``keys``, which it sorts
    in place (give a fresh array)."""
    keys.sort(kind="stable")
    if keys.size == 0:
        return keys, np.zeros(0, dtype=np.int64)
    first = np.empty(keys.size, dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return keys[starts], np.diff(starts, append=keys.size)


def unique_rows(rows: np.ndarray, return_inverse: bool = False, return_counts: bool = False) -> Any:
    """``np.unique(rows, axis=0, ...)`` for a 2-D array of non-negative integer codes (geography
    keys): the distinct rows in lexicographic order, with the 1-D inverse and the counts when asked,
    through one mixed-radix integer key per row."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer) or (rows.size and int(rows.min()) < 0):
        raise ValueError(f"unique_rows takes a 2-D array of non-negative integer codes, got {rows.dtype} {rows.shape}")
    radix = [int(rows[:, j].max(initial=0)) + 1 for j in range(rows.shape[1])]
    if float(np.prod(radix, dtype=np.float64)) >= 2.0**62:  # no one integer key: numpy's record view
        out, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    else:
        key = np.zeros(rows.shape[0], dtype=np.int64)
        for j, r in enumerate(radix):
            key *= r
            key += rows[:, j]
        uniq, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        out = np.empty((uniq.size, rows.shape[1]), dtype=rows.dtype)
        for j in range(rows.shape[1] - 1, -1, -1):
            uniq, out[:, j] = np.divmod(uniq, radix[j])
    if not (return_inverse or return_counts):
        return out
    return (out, *([inverse.reshape(-1)] if return_inverse else []), *([counts] if return_counts else []))
