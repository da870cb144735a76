"""engine.data's integer-array steps against the numpy calls they replace."""

import numpy as np
import pytest

from engine.data import repeat_runs, sorted_counts, unique_rows


@pytest.mark.parametrize("lengths", [[], [0], [3], [2, 0, 3], [0, 0, 2, 0], [0, 1, 0, 0, 4, 0, 0], [1] * 7])
def test_repeat_runs_is_numpys_repeat(lengths):
    values = np.arange(len(lengths), dtype=np.int64) * 7 - 5
    got = repeat_runs(values, np.array(lengths, dtype=np.int64))
    want = np.repeat(values, lengths)
    assert got.dtype == values.dtype and np.array_equal(got, want)


def test_repeat_runs_on_random_runs_and_the_extremes_of_the_type():
    rng = np.random.default_rng(3)
    for dtype in (np.int32, np.int64, np.uint8, np.uint32):
        info = np.iinfo(dtype)
        for _ in range(20):
            n = int(rng.integers(1, 200))
            lengths = (rng.integers(0, 4, n) * rng.integers(0, 2, 1)).astype(rng.choice([np.int32, np.int64, np.uint8]))
            values = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)  # steps that overflow and wrap back
            assert np.array_equal(repeat_runs(values, lengths), np.repeat(values, lengths))


def test_repeat_runs_refuses_what_repeat_would_not_mean():
    with pytest.raises(ValueError, match="non-negative"):
        repeat_runs(np.arange(3), np.array([1, -1, 2]))
    with pytest.raises(ValueError, match="one integer value per run"):
        repeat_runs(np.arange(3.0), np.array([1, 1, 2]))
    with pytest.raises(ValueError, match="one integer value per run"):
        repeat_runs(np.arange(2), np.array([1, 1, 2]))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.uint8])
def test_sorted_counts_is_numpys_unique_with_counts(dtype):
    rng = np.random.default_rng(11)
    households = np.repeat(np.arange(400), rng.integers(0, 6, 400))
    household_major = households * 50 + rng.integers(0, 5, households.size)  # a household's persons share cells
    for keys in (np.zeros(0, dtype=dtype), np.array([3], dtype=dtype), rng.integers(0, 30, 500).astype(dtype), household_major.astype(dtype)):
        want_u, want_c = np.unique(keys, return_counts=True)
        got_u, got_c = sorted_counts(keys.copy())
        assert got_u.dtype == keys.dtype and got_c.dtype == want_c.dtype
        assert np.array_equal(got_u, want_u) and np.array_equal(got_c, want_c)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.uint8])
def test_unique_rows_is_numpys_unique_along_rows(dtype):
    rng = np.random.default_rng(5)
    for shape, high in (((0, 2), 5), ((1, 3), 5), ((300, 1), 9), ((500, 2), 40), ((700, 3), 4)):
        rows = rng.integers(0, high, shape).astype(dtype)
        want = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
        got = unique_rows(rows, return_inverse=True, return_counts=True)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w.reshape(g.shape)) and g.ndim == (2 if g is got[0] else 1)
        assert np.array_equal(unique_rows(rows), want[0])
        assert all(np.array_equal(g, w) for g, w in zip(unique_rows(rows, return_counts=True), np.unique(rows, axis=0, return_counts=True)))


def test_unique_rows_of_codes_too_wide_for_one_key_falls_back_to_numpy():
    rows = np.array([[2**40, 2**30], [1, 2], [2**40, 2**30], [0, 7]], dtype=np.int64)
    assert np.array_equal(unique_rows(rows), np.unique(rows, axis=0))


def test_unique_rows_refuses_negative_or_non_integer_codes():
    for rows in (np.array([[1, -2]]), np.array([[1.0, 2.0]]), np.arange(4)):
        with pytest.raises(ValueError, match="non-negative integer codes"):
            unique_rows(rows)
