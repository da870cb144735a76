"""The release microdata in parts of whole states, for the stages that read the whole release
(publish, its intervals and count-of-counts table) without holding it in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from engine.data import Domain, HierarchicalData, read_npz
from tasks.run_context import state_of_node_file

# households per part at most (a larger state is a part of its own): bounds the memory of
# publishing, whatever the number of states, while the release gate's fixed cost per part (GX
# builds its metric graph anew for each checkpoint run) stays a few runs at national size
PART_HOUSEHOLDS = 200_000


@dataclass(frozen=True)
class ReleaseParts:
    """The release microdata as parts of whole states, each loaded when it is needed and dropped
    after, so that publishing holds at most one part's households and persons (consecutive states
    up to ``PART_HOUSEHOLDS`` households, or one larger state) however many states the release
    covers. Parts come in release order (their concatenation is the release)."""

    domain: Domain
    loaders: tuple[Callable[[], HierarchicalData], ...]

    @classmethod
    def of(cls, data: HierarchicalData, limit: int = PART_HOUSEHOLDS) -> ReleaseParts:
        """An in-memory release in parts of whole states (in state order; each keeps its rows' order)."""
        if not data.n_households:
            return cls(data.domain, (partial(data.select, np.ones(0, dtype=bool)),))
        states, counts = np.unique(data.geo[:, 0], return_counts=True)
        return cls(data.domain, tuple(partial(data.select, np.isin(data.geo[:, 0], states[g])) for g in _packed(counts.tolist(), limit)))

    @classmethod
    def from_node_files(cls, node_files: list[str], limit: int = PART_HOUSEHOLDS) -> ReleaseParts:
        """A release of PUMA node files (``RunPaths.node_path``) in parts of whole states: their
        PUMAs' files in sorted order, as the release concatenates them."""
        files = sorted(node_files)
        if not files:
            raise ValueError("a release needs at least one node file")
        by_state: dict[str, list[str]] = {}
        for f in files:
            by_state.setdefault(state_of_node_file(f), []).append(f)
        states = list(by_state.values())
        counts = [sum(_households(f) for f in fs) for fs in states]
        domain = HierarchicalData.from_npz(files[0]).domain
        return cls(domain, tuple(partial(_load, [f for i in g for f in states[i]]) for g in _packed(counts, limit)))

    def __iter__(self) -> Iterator[HierarchicalData]:
        return (load() for load in self.loaders)


def _packed(counts: list[int], limit: int) -> list[list[int]]:
    """Consecutive indices, grouped while their counts sum to at most ``limit``."""
    groups: list[list[int]] = []
    total = 0
    for i, c in enumerate(counts):
        if groups and total + c <= limit:
            groups[-1].append(i)
            total += c
        else:
            groups.append([i])
            total = c
    return groups


def _households(node_file: str) -> int:
    return int(read_npz(node_file, ("geo",))["geo"].shape[0])


def _load(files: list[str]) -> HierarchicalData:
    return HierarchicalData.concat([HierarchicalData.from_npz(f) for f in files])
