"""Geography nodes and their keys: nation ⊃ state ⊃ PUMA.

A node is a tuple of geography codes from the top: ``()`` the nation, ``(50,)`` a state,
``(50, 100)`` a PUMA. Its key, :func:`node_key`, is the one string every layer names a node by:
measurement keys, ledger charges, measurement records, file names, the count-of-counts hierarchy
and table, the release's ``geography_node`` column: ``"nation"``, ``"ST=50"``,
``"ST=50/PUMA=00100"``. Geography codes are public (PUMA definitions are published by the Census
Bureau).

:class:`Geography` is a release's set of nodes. It is declared — the states a release covers and
each one's published PUMA list (``schemas.geography``) — and never read off the confidential rows:
a node set taken from the rows would drop a PUMA whose only household a neighbour removes, a
difference visible with certainty in every table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from engine.data._arrays import unique_rows

Node = tuple[int, ...]
LEVELS = ("nation", "state", "puma")


def node_key(node: Node | str) -> str:
    """``()`` → ``"nation"``, ``(50,)`` → ``"ST=50"``, ``(50, 100)`` → ``"ST=50/PUMA=00100"``.

    A key given as a string is checked (:func:`parse_node_key`) and returned in canonical form."""
    if isinstance(node, str):
        return node_key(parse_node_key(node))
    node = tuple(int(x) for x in node)
    if len(node) == 0:
        return "nation"
    if len(node) == 1:
        return f"ST={node[0]:02d}"
    if len(node) == 2:
        return f"ST={node[0]:02d}/PUMA={node[1]:05d}"
    raise ValueError(f"a node has at most two codes (state, PUMA), got {node}")


def parse_node_key(key: str) -> Node:
    """The inverse of :func:`node_key`."""
    if key == "nation":
        return ()
    parts = key.split("/")
    try:
        if len(parts) == 1 and parts[0].startswith("ST="):
            return (int(parts[0][3:]),)
        if len(parts) == 2 and parts[0].startswith("ST=") and parts[1].startswith("PUMA="):
            return (int(parts[0][3:]), int(parts[1][5:]))
    except ValueError:
        pass
    raise ValueError(f"not a node key: {key!r} (expected 'nation', 'ST=xx' or 'ST=xx/PUMA=xxxxx')")


def node_level(node: Node) -> str:
    """``"nation"``, ``"state"`` or ``"puma"``."""
    return LEVELS[len(node)]


def node_households(geo: np.ndarray, depth: int) -> dict[Node, np.ndarray]:
    """{node: the indices of its households, in input order} for every node ``depth`` levels
    down of the households' geography codes ``geo`` (n, ≥ depth), by one sort: a mask per node
    would cost nodes × households, quadratic at national size. Depth 0: the nation, every household."""
    geo = np.asarray(geo)
    if depth == 0:
        return {(): np.arange(len(geo), dtype=np.int64)}
    if len(geo) == 0:
        return {}
    keys, inverse = unique_rows(geo[:, :depth], return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(inverse, minlength=len(keys)))))
    return {tuple(int(x) for x in k): order[bounds[i]:bounds[i + 1]] for i, k in enumerate(keys)}


PUMA_CODES = 100_000  # PUMA codes are five digits: (ST, PUMA) packs into ST * PUMA_CODES + PUMA


@dataclass(frozen=True, init=False)
class Geography:
    """A release's declared geography: its PUMAs as (ST, PUMA) pairs, sorted and distinct; the
    states are those of the PUMAs, the nation is their union.

    Held as one string, the PUMAs' codes ST·PUMA_CODES + PUMA sorted and comma-separated: a run's
    context carries the geography to every task, and Prefect and Dask walk a task's arguments
    element by element (to find futures in them, to hash them): a nation's pairs would be thousands
    of elements to walk for every task, one string is one."""

    codes: str

    def __init__(self, pumas: Iterable[tuple[int, int]]) -> None:
        pairs = [(int(s), int(p)) for s, p in pumas]
        if not pairs:
            raise ValueError("a geography needs at least one PUMA")
        if any(not 0 <= p < PUMA_CODES for _, p in pairs):
            raise ValueError(f"PUMA codes have at most five digits, got {pairs}")
        object.__setattr__(self, "codes", ",".join(str(c) for c in sorted({s * PUMA_CODES + p for s, p in pairs})))

    @classmethod
    def of(cls, pumas: Iterable[tuple[int, int]]) -> Geography:
        return cls(pumas)

    @cached_property
    def pumas(self) -> tuple[tuple[int, int], ...]:
        """The PUMAs as (ST, PUMA) pairs, sorted."""
        return tuple(divmod(int(c), PUMA_CODES) for c in self.codes.split(","))

    @property
    def states(self) -> tuple[int, ...]:
        return tuple(sorted({s for s, _ in self.pumas}))

    def nodes(self, level: Literal["state", "puma"]) -> list[Node]:
        """The nodes of ``level``, sorted."""
        if level == "state":
            return [(s,) for s in self.states]
        if level == "puma":
            return list(self.pumas)
        raise ValueError(f"unknown level {level!r}: state or puma")

    def leaves(self) -> np.ndarray:
        """The PUMAs as an (n, 2) int64 array (:func:`engine.count_of_counts._geography.geography_hierarchy`)."""
        return np.array(self.pumas, dtype=np.int64).reshape(-1, 2)

    def outside(self, geo: np.ndarray) -> np.ndarray:
        """Per household of ``geo`` (n, ≥ 2: ST, PUMA), whether its PUMA is not declared: ``(n,)`` bool."""
        geo = np.asarray(geo, dtype=np.int64)
        if len(geo) == 0:
            return np.zeros(0, dtype=bool)
        packed = geo[:, 0] * PUMA_CODES + geo[:, 1]
        declared = self.leaves()
        return ~np.isin(packed, declared[:, 0] * PUMA_CODES + declared[:, 1])

    def restricted(self, states: Iterable[int]) -> Geography:
        """The PUMAs of ``states`` only; every state must be declared here."""
        wanted = {int(s) for s in states}
        missing = sorted(wanted - set(self.states))
        if missing:
            raise ValueError(f"states {missing} are not in the geography (states {list(self.states)})")
        return Geography(tuple(p for p in self.pumas if p[0] in wanted))
