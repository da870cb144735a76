"""The one node id: engine.data._geography.node_key (tuples and keys), its inverse, the level; the
per-node household index; a release's declared geography (engine.data._geography.Geography)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.data._geography import Geography, node_households, node_key, node_level, parse_node_key


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


def test_a_geography_is_sorted_distinct_and_finds_outside_households():
    g = Geography.of([(50, 300), (10, 101), (50, 100), (50, 100)])
    assert g.pumas == ((10, 101), (50, 100), (50, 300)) and g.states == (10, 50)
    assert g.nodes("state") == [(10,), (50,)] and g.nodes("puma") == list(g.pumas)
    geo = np.array([[50, 100], [50, 200], [10, 101], [11, 101]])
    assert g.outside(geo).tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="not in the geography"):
        g.restricted([23])
    with pytest.raises(ValueError, match="at least one PUMA"):
        Geography.of([])
