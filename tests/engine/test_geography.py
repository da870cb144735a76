"""The one node id: engine.geography.node_key (tuples and keys), its inverse, the level."""

from __future__ import annotations

import pytest

from engine.geography import node_key, node_level, parse_node_key


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
