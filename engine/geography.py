"""Geography nodes and their keys: nation ⊃ state ⊃ PUMA.

A node is a tuple of geography codes from the top: ``()`` the nation, ``(50,)`` a state,
``(50, 100)`` a PUMA. Its key, :func:`node_key`, is the one string every layer names a node by:
measurement keys, ledger charges, measurement records, file names, the count-of-counts hierarchy
and table, the release's ``geography_node`` column: ``"nation"``, ``"ST=50"``,
``"ST=50/PUMA=00100"``. Geography codes are public (PUMA definitions are published by the Census
Bureau).
"""

from __future__ import annotations

import numpy as np

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
    keys, inverse = np.unique(geo[:, :depth], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(inverse, minlength=len(keys)))))
    return {tuple(int(x) for x in k): order[bounds[i]:bounds[i + 1]] for i, k in enumerate(keys)}
