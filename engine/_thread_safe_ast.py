"""One :func:`ast.parse` at a time in a process, on the interpreters whose AST constructor needs it.

CPython 3.11.0–3.11.7 and 3.12.0–3.12.1 keep the AST constructor's recursion depth in state that
all of a process's threads share (python/cpython#106905, fixed in 3.11.8 and 3.12.2): when a
garbage collection inside one thread's parse lets another thread parse, one of them fails with
``SystemError: AST constructor recursion depth mismatch``. Parsing is everywhere in a run: numpy
reads every ``.npy`` header of an ``.npz`` with :func:`ast.literal_eval`, Python 3.11 parses source
lines to draw a traceback's carets, dask parses config values, pyarrow column metadata; and a Dask
worker runs two tasks at a time. A lock around the pipeline's own ``.npz`` reads only was not
enough (the other thread's parse was someone else's), so on those interpreters :func:`install`
wraps ``ast.parse`` itself — the function every one of those callers goes through — in one
process-wide lock. A header parse takes microseconds, so the lock costs nothing measurable; on a
fixed interpreter nothing is installed.
"""

from __future__ import annotations

import ast
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install", "interpreter_needs_it", "installed"]

_ONE_AT_A_TIME = threading.RLock()  # re-entrant: a parse's garbage collection may run a finaliser that parses


def interpreter_needs_it(version: tuple[int, ...] | None = None) -> bool:
    """Whether the interpreter ``version`` (this one's when None) has the shared recursion depth."""
    v = tuple(sys.version_info[:3] if version is None else version[:3])
    return (3, 11) <= v < (3, 11, 8) or (3, 12) <= v < (3, 12, 2)


def installed() -> bool:
    """Whether this process's ``ast.parse`` takes the lock."""
    return bool(getattr(ast.parse, "_one_at_a_time", False))


def _locked(parse: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(parse)
    def parse_one_at_a_time(*args: Any, **kwargs: Any) -> Any:
        with _ONE_AT_A_TIME:
            return parse(*args, **kwargs)

    parse_one_at_a_time._one_at_a_time = True  # type: ignore[attr-defined]
    return parse_one_at_a_time


def install() -> bool:
    """Wrap ``ast.parse`` in the process-wide lock where the interpreter needs it (once; importing
    :mod:`engine` calls this, so every process that runs the pipeline's code has it). Returns
    whether the lock is in place."""
    if interpreter_needs_it() and not installed():
        ast.parse = _locked(ast.parse)
    return installed()
