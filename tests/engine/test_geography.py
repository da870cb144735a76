"""The one node id: engine.geography.node_key (tuples and keys), its inverse, the level; the
per-node household index."""

from __future__ import annotations

import numpy as np
import pytest

from engine.geography import node_households, node_key, node_level, parse_node_key


@pytest.mark.parametrize("node, key, level", [((), "nation", "nation"), ((6,), "ST=06", "state"),
                                              ((50, 100), "ST=50/PUMA=00100", "puma")])
def test_node_key_round_trip(node, key, level):
    assert node_key(node) == key and parse_node_key(key) == node and node_level(node) == level
    assert node_key(key) == key  # a key names the same node
    assert node_key(list(node)) == key


def test_keys_are_canonical_and_checked():
    assert node_key("ST=6/PUMA=100") == "ST=06/PUMA=00100"
    for bad in ("6", "6/101", "ST=xx", "PUMA=00100", ""):
        with pytest.raises(ValueError, match="not a node key"):
            node_key(bad)
    with pytest.raises(ValueError, match="at most two codes"):
        node_key((1, 2, 3))
    with pytest.raises(TypeError):
        node_key(6)  # type: ignore[arg-type]


def test_node_households_equals_a_mask_per_node():
    """Every node at every depth gets exactly the households a mask would select, in input order."""
    rng = np.random.default_rng(3)
    geo = np.stack([rng.choice([1, 2, 50], 500), rng.choice([100, 200, 300, 400], 500)], axis=1)
    assert list(node_households(geo, 0)) == [()] and np.array_equal(node_households(geo, 0)[()], np.arange(500))
    for depth in (1, 2):
        index = node_households(geo, depth)
        expected = {tuple(int(x) for x in k) for k in np.unique(geo[:, :depth], axis=0)}
        assert set(index) == expected
        for node, rows in index.items():
            assert np.array_equal(rows, np.flatnonzero(np.all(geo[:, :depth] == np.asarray(node), axis=1)))
    assert node_households(np.zeros((0, 2), dtype=np.int64), 2) == {}
