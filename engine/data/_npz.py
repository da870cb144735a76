"""Reading ``.npz`` files from the threads of one process.

numpy parses each array's header with :func:`ast.literal_eval`, and CPython 3.11's AST constructor
keeps its recursion depth in state shared by the process's threads: two threads parsing at once can
fail with ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). A Dask
worker runs two tasks at a time, each reading measurements, posteriors and supports, so every
``.npz`` the pipeline reads is read whole, under one lock, by :func:`read_npz`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["npz_names", "read_npz"]

_HEADERS = threading.Lock()


def read_npz(path: str | os.PathLike[str], names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of ``path`` (those of ``names``, all when None), read into memory under a
    process-wide lock; no pickled objects. A missing name raises KeyError naming the file."""
    with _HEADERS, np.load(path, allow_pickle=False) as z:
        missing = [n for n in names or () if n not in z.files]
        if missing:
            raise KeyError(f"{path}: no array {missing} (it holds {sorted(z.files)})")
        return {n: z[n] for n in (z.files if names is None else names)}


def npz_names(path: str | os.PathLike[str]) -> list[str]:
    """The names of the arrays in ``path``, from the archive's directory alone (no header is
    parsed, so no lock is needed)."""
    with np.load(path, allow_pickle=False) as z:
        return list(z.files)
