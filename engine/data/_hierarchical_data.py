"""HierarchicalData: households that contain persons, in a columnar CSR layout.

- ``geo``      (N_G, L) int32: geography codes per household, one column per level of
               ``domain.geography`` (for ACS: state FIPS, PUMA code); the nation is implicit.
- ``group``    (N_G, k_G) small ints: household attributes (``domain.group``; includes NP).
- ``person``   (N_I, k_I) small ints: person attributes (``domain.person``), persons of household
               h are rows ``person_offsets[h]:person_offsets[h+1]``, householder first.
- ``person_offsets`` (N_G + 1,) int64, nondecreasing, starts at 0, ends at N_I.

No identifiers are stored: a HierarchicalData holds codes only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from engine.data._arrays import repeat_runs, unique_rows
from engine.data._domain import Domain
from engine.data._npz import read_npz


def _code_dtype(sizes: Iterable[int]) -> np.dtype[np.unsignedinteger]:
    return np.dtype(np.uint8) if max(sizes, default=1) <= 255 else np.dtype(np.uint16)


@dataclass(frozen=True, eq=False)
class HierarchicalData:
    domain: Domain
    geo: np.ndarray
    group: np.ndarray
    person: np.ndarray
    person_offsets: np.ndarray

    def __post_init__(self) -> None:
        d = self.domain
        n_g = self.group.shape[0]
        if self.group.ndim != 2 or self.group.shape[1] != len(d.group):
            raise ValueError(f"group must be (N_G, {len(d.group)}), got {self.group.shape}")
        if self.person.ndim != 2 or self.person.shape[1] != len(d.person):
            raise ValueError(f"person must be (N_I, {len(d.person)}), got {self.person.shape}")
        if self.geo.shape != (n_g, len(d.geography)):
            raise ValueError(f"geo must be ({n_g}, {len(d.geography)}), got {self.geo.shape}")
        off = self.person_offsets
        if off.shape != (n_g + 1,) or off[0] != 0 or off[-1] != self.person.shape[0]:
            raise ValueError("person_offsets must have N_G+1 entries from 0 to N_I")
        sizes = np.diff(off)
        if np.any(sizes < 1) or np.any(sizes > d.max_size):
            raise ValueError(f"every household must have 1..{d.max_size} persons")
        for j, a in enumerate(d.group):
            if n_g and self.group[:, j].max() >= a.size:
                raise ValueError(f"group attribute {a.name} has a code >= {a.size}")
        for j, a in enumerate(d.person):
            if self.person.shape[0] and self.person[:, j].max() >= a.size:
                raise ValueError(f"person attribute {a.name} has a code >= {a.size}")
        np_col = self.group[:, d.group_index(d.size_attribute)]
        if not np.array_equal(np_col.astype(np.int64) + 1, sizes):
            raise ValueError(f"{d.size_attribute} must equal the number of persons of each household")

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def from_arrays(cls, domain: Domain, geo: ArrayLike, group: ArrayLike, person: ArrayLike, person_offsets: ArrayLike) -> HierarchicalData:
        return cls(
            domain,
            np.ascontiguousarray(geo, dtype=np.int32).reshape(-1, len(domain.geography)),
            np.ascontiguousarray(group, dtype=_code_dtype(domain.group_sizes)).reshape(-1, len(domain.group)),
            np.ascontiguousarray(person, dtype=_code_dtype(domain.person_sizes)).reshape(-1, len(domain.person)),
            np.ascontiguousarray(person_offsets, dtype=np.int64),
        )

    @classmethod
    def concat(cls, parts: list[HierarchicalData]) -> HierarchicalData:
        if not parts:
            raise ValueError("concat of no parts")
        d = parts[0].domain
        if any(p.domain != d for p in parts):
            raise ValueError("concat of parts with different domains")
        sizes = np.concatenate([p.sizes for p in parts])
        return cls.from_arrays(
            d,
            np.concatenate([p.geo for p in parts]),
            np.concatenate([p.group for p in parts]),
            np.concatenate([p.person for p in parts]),
            np.concatenate([[0], np.cumsum(sizes)]),
        )

    # -- basic properties ----------------------------------------------------------------
    @property
    def n_households(self) -> int:
        return int(self.group.shape[0])

    @property
    def n_persons(self) -> int:
        return int(self.person.shape[0])

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.person_offsets)

    @cached_property
    def person_household(self) -> np.ndarray:
        """Index of the household of every person, (N_I,) int64 (computed once, read-only)."""
        out: np.ndarray = repeat_runs(np.arange(self.n_households, dtype=np.int64), self.sizes)
        out.flags.writeable = False
        return out

    @cached_property
    def person_slot(self) -> np.ndarray:
        """Position of every person inside its household (0 = first / householder; computed once,
        read-only)."""
        out: np.ndarray = np.arange(self.n_persons, dtype=np.int64) - self.person_offsets[:-1][self.person_household]
        out.flags.writeable = False
        return out

    # -- selection ---------------------------------------------------------------------
    def take(self, households: np.ndarray) -> HierarchicalData:
        """The households at the given indices (with repetition allowed), persons included."""
        households = np.asarray(households, dtype=np.int64)
        sizes = self.sizes[households]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        starts = np.repeat(self.person_offsets[:-1][households], sizes)
        person_rows = starts + (np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], sizes))
        return HierarchicalData(
            self.domain,
            self.geo[households],
            self.group[households],
            self.person[person_rows],
            offsets,
        )

    def select(self, mask: np.ndarray) -> HierarchicalData:
        return self.take(np.flatnonzero(mask))

    def with_geo(self, geo: np.ndarray) -> HierarchicalData:
        return HierarchicalData.from_arrays(self.domain, geo, self.group, self.person, self.person_offsets)

    def nodes(self, level: str) -> list[tuple[int, ...]]:
        """Distinct geography nodes down to ``level`` (tuples of codes of the levels above and at it)."""
        k = self.domain.geography.index(level) + 1
        if self.n_households == 0:
            return []
        return [tuple(int(x) for x in row) for row in unique_rows(self.geo[:, :k])]

    def node_mask(self, node: tuple[int, ...]) -> np.ndarray:
        k = len(node)
        mask: np.ndarray = np.all(self.geo[:, :k] == np.asarray(node, dtype=np.int32), axis=1)
        return mask

    def project(self, group: list[str] | None, person: list[str] | None) -> HierarchicalData:
        """Keep a subset of the attributes (the size attribute is always kept)."""
        d = self.domain
        dom = d.project(group, person)
        gi = [d.group_index(a.name) for a in dom.group]
        pi = [d.person_index(a.name) for a in dom.person]
        return HierarchicalData.from_arrays(dom, self.geo, self.group[:, gi], self.person[:, pi], self.person_offsets)

    # -- persistence (npz; no pickles) -------------------------------------------------
    def to_npz(self, path: str | os.PathLike[str]) -> None:
        import json

        np.savez(
            path,
            domain=np.frombuffer(json.dumps(self.domain.to_dict()).encode(), dtype=np.uint8),
            geo=self.geo,
            group=self.group,
            person=self.person,
            person_offsets=self.person_offsets,
        )

    @classmethod
    def from_npz(cls, path: str | os.PathLike[str]) -> HierarchicalData:
        import json

        z = read_npz(path, ("domain", "geo", "group", "person", "person_offsets"))
        domain = Domain.from_dict(json.loads(z["domain"].tobytes().decode()))
        return cls.from_arrays(domain, z["geo"], z["group"], z["person"], z["person_offsets"])

    def equals(self, other: HierarchicalData) -> bool:
        return (
            self.domain == other.domain
            and np.array_equal(self.geo, other.geo)
            and np.array_equal(self.group, other.group)
            and np.array_equal(self.person, other.person)
            and np.array_equal(self.person_offsets, other.person_offsets)
        )

