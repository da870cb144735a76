"""A public geography hierarchy (nation -> state -> PUMA, any depth) as parent pointers.

Nodes are numbered 0..N-1 in breadth-first order: all nodes of level 0, then level 1, ...,
and inside a level grouped by parent (children of one node are contiguous).  Level l
nodes are therefore the id range ``level_range(l)``.  Leaves may sit at any level.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

__all__ = ["Hierarchy"]

_Key = TypeVar("_Key", bound=Hashable)  # node labels (Mapping is invariant in its key type)


@dataclass(eq=False, init=False)
class Hierarchy:
    parent: np.ndarray  # (N,) int64, -1 for roots
    keys: list[Hashable]  # node labels, keys[i] labels node i (the node ids 0..N-1 unless given)

    def __init__(self, parent: np.ndarray, keys: Sequence[Hashable] | None = None) -> None:
        p = np.asarray(parent, dtype=np.int64)
        self.parent = p
        n = p.size
        if np.any((p < -1) | (p >= n)):
            raise ValueError("parent ids out of range")
        level = np.zeros(n, dtype=np.int64)
        nonroot = p >= 0
        if np.any(p[nonroot] >= np.arange(n)[nonroot]):
            raise ValueError("nodes must be in breadth-first order (parent id < child id); use from_parent_map")
        for v in np.flatnonzero(nonroot):  # ids are topologically sorted
            level[v] = level[p[v]] + 1
        if np.any(np.diff(level) < 0):
            raise ValueError("nodes must be ordered by level")
        for lv in range(1, int(level.max(initial=0)) + 1):
            pl = p[level == lv]
            if np.any(np.diff(pl) < 0):
                raise ValueError("children of one parent must be contiguous and ordered by parent")
        self.level = level
        self.keys = list(range(n)) if keys is None else list(keys)
        if len(self.keys) != n:
            raise ValueError("keys must label every node")
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.n_children = np.bincount(p[nonroot], minlength=n).astype(np.int64)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def from_parent_map(cls, parent_of: Mapping[_Key, _Key | None]) -> Hierarchy:
        """From ``{node_key: parent_key or None}``; keys are kept in insertion order within
        each parent."""
        keys = list(parent_of)
        pos = {k: i for i, k in enumerate(keys)}
        depth: dict[_Key, int] = {}

        def d(k: _Key) -> int:
            if k not in depth:
                pk = parent_of[k]
                if pk is not None and pk not in pos:
                    raise ValueError(f"parent {pk!r} of {k!r} is not a node")
                depth[k] = 0 if pk is None else d(pk) + 1
            return depth[k]

        for k in keys:
            d(k)
        order: list[_Key] = []
        by_level: dict[int, list[_Key]] = {}
        for k in keys:
            by_level.setdefault(depth[k], []).append(k)
        new_id: dict[_Key, int] = {}
        parent_key = {k: pk for k, pk in parent_of.items() if pk is not None}
        for lv in sorted(by_level):
            ks = by_level[lv]
            if lv > 0:
                ks = sorted(ks, key=lambda k: (new_id[parent_key[k]], pos[k]))
            for k in ks:
                new_id[k] = len(order)
                order.append(k)
        parent = np.array([new_id[parent_key[k]] if k in parent_key else -1 for k in order], dtype=np.int64)
        return cls(parent, order)

    @classmethod
    def from_levels(cls, level_parents: Sequence[Sequence[int]], keys: Sequence[Hashable] | None = None) -> Hierarchy:
        """``level_parents[l][i]`` = index (within level l-1) of the parent of the i-th node of
        level l; ``level_parents[0]`` is ignored except for its length (the roots).
        Level l's nodes must be given grouped by parent in nondecreasing order."""
        parent = []
        base_prev = 0
        base = 0
        for lv, level_lp in enumerate(level_parents):
            lp = np.asarray(level_lp, dtype=np.int64)
            parent.append(np.full(lp.size, -1, np.int64) if lv == 0 else lp + base_prev)
            base_prev, base = base, base + lp.size
        return cls(np.concatenate(parent) if parent else np.zeros(0, np.int64), keys)

    # -- queries ------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return int(self.parent.size)

    @property
    def n_levels(self) -> int:
        return int(self.level.max(initial=-1)) + 1

    def level_range(self, lv: int) -> np.ndarray:
        return np.flatnonzero(self.level == lv)

    def nodes_at(self, lv: int) -> np.ndarray:
        return self.level_range(lv)

    def is_leaf(self) -> np.ndarray:
        return np.equal(self.n_children, 0)

    def leaves(self) -> np.ndarray:
        return np.flatnonzero(self.n_children == 0)

    def aggregate_up(self, values: np.ndarray) -> np.ndarray:
        """Given per-node rows whose leaf rows are set (other rows ignored), return rows
        where every internal node holds the sum of its leaves (bottom-up, vectorised per
        level).  ``values``: (N, ...)."""
        out = np.array(values, copy=True)
        internal = self.n_children > 0
        out[internal] = 0
        for lv in range(self.n_levels - 1, 0, -1):
            ids = self.level_range(lv)
            if ids.size == 0:
                continue
            par = self.parent[ids]  # nondecreasing: children of one parent are contiguous
            starts = np.flatnonzero(np.concatenate(([True], par[1:] != par[:-1])))
            out[par[starts]] = np.add.reduceat(out[ids], starts, axis=0)
        return out
