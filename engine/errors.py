"""One error base class for everything dprelease refuses on purpose, with the command line's
exit code: 2 bad input, config or release contents (a gate refused); 3 a privacy refusal (the
budget would be exceeded, an exact statistic was asked for that is not a declared invariant);
4 stored measurements fail their integrity check. Other exceptions are bugs (exit 1, traceback).
Each subclass also derives from the built-in type callers caught before (``ValueError``, ...).

Privacy invariants are checked by raising one of these, never by ``assert`` (``python -O`` strips
asserts)."""

from __future__ import annotations

__all__ = ["DPReleaseError", "EXIT_BAD_INPUT", "EXIT_INTEGRITY", "EXIT_PRIVACY", "PrivacyInvariantError"]

EXIT_BAD_INPUT = 2
EXIT_PRIVACY = 3
EXIT_INTEGRITY = 4


class DPReleaseError(Exception):
    """Base of dprelease's deliberate refusals; ``exit_code`` is what ``dprelease`` exits with."""

    exit_code: int = EXIT_BAD_INPUT


class PrivacyInvariantError(DPReleaseError, RuntimeError):
    """A privacy invariant does not hold: a charge at a node of another geography level than the
    one charged (parallel composition would not apply), a noise scale other than the one charged,
    a node total that is neither measured nor a declared invariant. The run stops before anything
    is released."""

    exit_code = EXIT_PRIVACY
