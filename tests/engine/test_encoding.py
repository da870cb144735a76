import numpy as np

from engine.data import _encoding as encoding


def test_bin_ranges_matches_python_reference():
    rng = np.random.default_rng(0)
    mins, maxs = np.array([0, 18, 25, 65]), np.array([17, 24, 64, 99])
    v = rng.integers(-1, 101, 1000)
    got = encoding.bin_ranges(v, mins, maxs)
    ref = [next((k for k, (a, b) in enumerate(zip(mins, maxs)) if a <= x <= b), -1) if x != -1 else -1 for x in v]
    assert got.tolist() == ref


def test_map_codes_with_blank_group():
    groups = [[None], [1, 2], [3]]
    v = np.array([-1, 1, 2, 3, 4, 0])
    assert encoding.map_codes(v, groups).tolist() == [0, 1, 1, 2, -1, -1]


def test_segment_any_and_multigenerational():
    offsets = np.array([0, 3, 5, 6, 9])
    relp = np.array([0, 2, 7, 0, 1, 0, 0, 6, 2])  # hh0: child+grandchild; hh1: spouse; hh2: alone; hh3: parent+child
    assert encoding.segment_any(relp == 1, offsets).tolist() == [False, True, False, False]
    got = encoding.multigenerational(relp, offsets, child=[2, 3, 4], grandchild=[7], parent=[6, 8])
    assert got.tolist() == [True, False, False, True]


def test_clip_sizes():
    offsets = np.array([0, 5, 6, 9])
    keep, new = encoding.clip_sizes(offsets, 2)
    assert keep.tolist() == [1, 1, 0, 0, 0, 1, 1, 1, 0]
    assert new.tolist() == [0, 2, 3, 5]


def test_householder_first_order():
    hh = np.array([0, 0, 0, 1, 1])
    sporder = np.array([1, 2, 3, 1, 2])
    head = np.array([False, True, False, False, True])
    order = encoding.householder_first_order(hh, sporder, head)
    assert order.tolist() == [1, 0, 2, 4, 3]
