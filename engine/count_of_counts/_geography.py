"""From a HierarchicalData geography to the count-of-counts hierarchy (the sensitivities of what the
pipeline measures live with the measurement: ``engine.privacy._session.size_counts_sensitivity``).

Nodes: ``"nation"``, ``"ST=10"``, ``"ST=10/PUMA=00101"`` (geography codes are public).
"""

from __future__ import annotations

import numpy as np

from engine.count_of_counts._hierarchy import Hierarchy
from engine.data import node_key, unique_rows


def geography_hierarchy(geo: np.ndarray) -> Hierarchy:
    """nation → states → PUMAs, in the breadth-first order :class:`Hierarchy` requires."""
    parent_of: dict[str, str | None] = {node_key(()): None}
    parent_of.update({node_key((s,)): node_key(()) for s in np.unique(geo[:, 0])})
    parent_of.update({node_key((s, p)): node_key((s,)) for s, p in unique_rows(geo[:, :2])})
    return Hierarchy.from_parent_map(parent_of)


def size_histograms(h: Hierarchy, geo: np.ndarray, sizes: np.ndarray, K: int) -> np.ndarray:
    """(N_nodes, K+1) exact household-size histograms H_v[i] (sizes clipped to K) for every node."""
    pumas, of_household = unique_rows(geo[:, :2], return_inverse=True)
    leaf_id = np.array([h.index[node_key((s, p))] for s, p in pumas], dtype=np.int64)[of_household.ravel()]
    H = np.zeros((h.n_nodes, K + 1), dtype=np.int64)
    np.add.at(H, (leaf_id, np.minimum(sizes, K)), 1)
    return h.aggregate_up(H)
