"""Reading ``.npz`` files: the arrays read whole, no pickled objects, a missing name an error naming
the file. numpy parses each array's header with :func:`ast.literal_eval`; on the interpreters whose
AST constructor is not thread-safe, :mod:`engine._thread_safe_ast` makes every parse in the process
(these and everyone else's) take one lock, so a worker's threads read at once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

__all__ = ["npz_names", "read_npz"]


def read_npz(path: str | os.PathLike[str], names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of ``path`` (those of ``names``, all when None), read into memory; no pickled
    objects. A missing name raises KeyError naming the file."""
    with np.load(path, allow_pickle=False) as z:
        missing = [n for n in names or () if n not in z.files]
        if missing:
            raise KeyError(f"{path}: no array {missing} (it holds {sorted(z.files)})")
        return {n: z[n] for n in (z.files if names is None else names)}


def npz_names(path: str | os.PathLike[str]) -> list[str]:
    """The names of the arrays in ``path``, from the archive's directory alone (no header is parsed)."""
    with np.load(path, allow_pickle=False) as z:
        return list(z.files)
