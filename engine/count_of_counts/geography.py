"""From a HierarchicalData geography to the count-of-counts hierarchy, and the sensitivities of
the count-of-counts queries under each privacy unit.

Nodes: ``"nation"``, ``"ST=10"``, ``"ST=10/PUMA=00101"`` (geography codes are public).
"""

from __future__ import annotations

import numpy as np

from engine.count_of_counts.hierarchy import Hierarchy


def node_keys(geo: np.ndarray) -> tuple[list[str], list[str]]:
    """Distinct state keys and PUMA keys (sorted) of a (N_G, 2) [ST, PUMA] geography array."""
    states = np.unique(geo[:, 0])
    pumas = np.unique(geo[:, :2], axis=0)
    return [f"ST={s:02d}" for s in states], [f"ST={s:02d}/PUMA={p:05d}" for s, p in pumas]


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


def hc_l1_sensitivity(K: int, unit: str) -> int:
    """L1 sensitivity of one node's Hc[0..K−1] (cumulative counts of households by size).

    - ``person`` unit (Kuo et al.: add/remove one person of an existing household): one household
      moves from size i to i±1, so exactly one cumulative count changes by 1 → 1.
    - ``household`` unit (add/remove a whole household of size s ≥ 1): Hc[s..K−1] all change by 1
      → at most K−1 cells (Hc[0] counts empty households, which do not exist here).
    Household counts G_v are treated as public (like housing-unit counts), so the last cumulative
    count Hc[K] = G_v is not measured.
    """
    if unit == "person":
        return 1
    if unit == "household":
        return max(int(K) - 1, 1)
    raise ValueError(f"unknown privacy unit {unit!r}")


def hc_l2_sensitivity(K: int, unit: str) -> float:
    """L2 sensitivity of Hc[0..K−1]: every changed cell changes by exactly 1, so √(L1)."""
    return float(np.sqrt(hc_l1_sensitivity(K, unit)))
