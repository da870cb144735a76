"""The release microdata in parts of whole states, for the stages that read the whole release
(publish, its intervals and count-of-counts table) without holding it in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from engine.domain import Domain
from engine.hierarchical_data import HierarchicalData
from tasks.run_context import state_of_node_file


@dataclass(frozen=True)
class ReleaseParts:
    """The release microdata as parts of whole states, each loaded when it is needed and dropped
    after, so that publishing holds one state's households and persons at a time, however many
    states the release covers. Parts come in release order (their concatenation is the release)."""

    domain: Domain
    loaders: tuple[Callable[[], HierarchicalData], ...]

    @classmethod
    def of(cls, data: HierarchicalData) -> ReleaseParts:
        """An in-memory release, one part per state (in state order; each keeps its rows' order)."""
        if not data.n_households:
            return cls(data.domain, (partial(data.select, np.ones(0, dtype=bool)),))
        return cls(data.domain, tuple(partial(data.select, data.geo[:, 0] == st) for st in np.unique(data.geo[:, 0])))

    @classmethod
    def from_node_files(cls, node_files: list[str]) -> ReleaseParts:
        """A release of PUMA node files (``RunPaths.node_path``), one part per state: its PUMAs'
        files in sorted order, as the release concatenates them."""
        files = sorted(node_files)
        if not files:
            raise ValueError("a release needs at least one node file")
        by_state: dict[str, list[str]] = {}
        for f in files:
            by_state.setdefault(state_of_node_file(f), []).append(f)
        domain = HierarchicalData.from_npz(files[0]).domain
        return cls(domain, tuple(partial(_load, fs) for fs in by_state.values()))

    def __iter__(self) -> Iterator[HierarchicalData]:
        return (load() for load in self.loaders)


def _load(files: list[str]) -> HierarchicalData:
    return HierarchicalData.concat([HierarchicalData.from_npz(f) for f in files])
