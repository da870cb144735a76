import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.count_of_counts._isotonic import equal_value_blocks, isotonic_l1, isotonic_l2, isotonic_segments


def l1_bruteforce(y, w, lo=-np.inf, hi=np.inf):
    """O(n V) DP over candidate values (data values clipped into [lo, hi])."""
    v = np.unique(np.clip(y, lo, hi))
    best = np.zeros(v.size)
    for yi, wi in zip(y, w):
        best = np.minimum.accumulate(best) + wi * np.abs(yi - v)
    return best.min()


def pav_reference(y, w):
    """Textbook stack PAV (L2)."""
    vals, wts, cnt = [], [], []
    for yi, wi in zip(y, w):
        vals.append(yi)
        wts.append(wi)
        cnt.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2, c2 = vals.pop(), wts.pop(), cnt.pop()
            v1, w1, c1 = vals.pop(), wts.pop(), cnt.pop()
            vals.append((v1 * w1 + v2 * w2) / (w1 + w2))
            wts.append(w1 + w2)
            cnt.append(c1 + c2)
    return np.repeat(vals, cnt)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-6, 6), min_size=1, max_size=25), st.booleans(), st.integers(0, 10**6))
def test_l1_optimal(ys, weighted, seed):
    rng = np.random.default_rng(seed)
    y = np.array(ys, float)
    w = rng.integers(1, 5, y.size).astype(float) if weighted else np.ones(y.size)
    x = isotonic_l1(y, weights=w if weighted else None)
    assert np.all(np.diff(x) >= 0)
    assert np.isin(x, y).all()  # values among the data: integral for integral data
    assert abs((w * np.abs(x - y)).sum() - l1_bruteforce(y, w)) < 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30), st.integers(0, 10**6))
def test_l2_matches_pav(ys, seed):
    rng = np.random.default_rng(seed)
    y = np.array(ys)
    w = rng.uniform(0.5, 3, y.size)
    assert np.allclose(isotonic_l2(y, w), pav_reference(y, w))


def test_segments_with_bounds():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lens = rng.integers(0, 12, rng.integers(1, 6))
        offs = np.concatenate([[0], np.cumsum(lens)])
        y = rng.integers(-6, 7, offs[-1]).astype(float)
        lo = rng.integers(-3, 1, lens.size)
        hi = lo + rng.integers(0, 5, lens.size)
        x1 = isotonic_segments(y, offs, norm="l1", lower=lo, upper=hi)
        x2 = isotonic_segments(y, offs, norm="l2", lower=lo, upper=hi)
        for k in range(lens.size):
            a, b = offs[k], offs[k + 1]
            if a == b:
                continue
            for x in (x1, x2):
                assert np.all(np.diff(x[a:b]) >= 0) and x[a:b].min() >= lo[k] and x[a:b].max() <= hi[k]
            assert abs(np.abs(x1[a:b] - y[a:b]).sum() - l1_bruteforce(y[a:b], np.ones(b - a), lo[k], hi[k])) < 1e-9
            assert np.allclose(x2[a:b], np.clip(pav_reference(y[a:b], np.ones(b - a)), lo[k], hi[k]))


def test_l1_chunked_large_matches_unchunked():
    rng = np.random.default_rng(1)
    n_seg, L = 60, 9000  # > one chunk
    y = (np.arange(L)[None, :] // 500 + rng.integers(-3, 4, (n_seg, L))).astype(float).ravel()
    offs = np.arange(n_seg + 1) * L
    x = isotonic_segments(y, offs, norm="l1")
    for k in (0, 17, 59):
        a, b = offs[k], offs[k + 1]
        xk = isotonic_l1(y[a:b])
        assert np.abs(x[a:b] - y[a:b]).sum() == np.abs(xk - y[a:b]).sum()


def test_blocks_and_errors():
    s, l = equal_value_blocks(np.array([1, 1, 2, 2, 2, 3]), [0, 3, 6])
    assert s.tolist() == [0, 2, 3, 5] and l.tolist() == [2, 1, 2, 1]
    with pytest.raises(ValueError):
        isotonic_segments(np.zeros(3), [0, 2])
    with pytest.raises(ValueError):
        isotonic_segments(np.zeros(3), [0, 3], norm="l3")
