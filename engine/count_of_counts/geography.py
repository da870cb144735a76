"""From a HierarchicalData geography to the count-of-counts hierarchy (the sensitivities of what the
pipeline measures live with the measurement: ``engine.privacy.session.size_counts_sensitivity``).

Nodes: ``"nation"``, ``"ST=10"``, ``"ST=10/PUMA=00101"`` (geography codes are public).
"""

from __future__ import annotations

import numpy as np

from engine.count_of_counts.hierarchy import Hierarchy
from engine.geography import node_key


def node_keys(geo: np.ndarray) -> tuple[list[str], list[str]]:
    """Distinct state keys and PUMA keys (sorted) of a (N_G, 2) [ST, PUMA] geography array."""
    states = np.unique(geo[:, 0])
    pumas = np.unique(geo[:, :2], axis=0)
    return [node_key((s,)) for s in states], [node_key((s, p)) for s, p in pumas]


def geography_hierarchy(geo: np.ndarray) -> Hierarchy:
    """nation → states → PUMAs, in the breadth-first order :class:`Hierarchy` requires."""
    states, pumas = node_keys(geo)
    parent_of: dict[str, str | None] = {"nation": None}
    parent_of.update({s: "nation" for s in states})
    parent_of.update({p: p.split("/")[0] for p in pumas})
    return Hierarchy.from_parent_map(parent_of)


def size_histograms(h: Hierarchy, geo: np.ndarray, sizes: np.ndarray, K: int) -> np.ndarray:
    """(N_nodes, K+1) exact household-size histograms H_v[i] (sizes clipped to K) for every node."""
    keys = np.array([f"ST={s:02d}/PUMA={p:05d}" for s, p in geo[:, :2]]) if len(geo) else np.zeros(0, str)
    leaf_id = np.array([h.index[k] for k in keys], dtype=np.int64) if len(keys) else np.zeros(0, np.int64)
    H = np.zeros((h.n_nodes, K + 1), dtype=np.int64)
    np.add.at(H, (leaf_id, np.minimum(sizes, K)), 1)
    return h.aggregate_up(H)
