"""engine.synthesis._symmetric_eigen: LAPACK's single-precision eigendecomposition called without the GIL,
against numpy's double-precision one."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.synthesis._symmetric_eigen import eigh_single


def _symmetric(rng: np.random.Generator, n: int, spread: float = 1.0) -> np.ndarray:
    """A random symmetric positive semi-definite matrix of rank about n/2 and eigenvalues over ``spread`` decades
    (as a whitened prior spread: many directions near 0, a few large)."""
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    lam = np.where(rng.random(n) < 0.5, 0.0, 10.0 ** rng.uniform(-spread, spread, n))
    return (Q * lam) @ Q.T


def _rebuilt(lam: np.ndarray, Vt: np.ndarray) -> np.ndarray:
    V = Vt.T.astype(np.float64)
    return (V * lam.astype(np.float64)) @ V.T


@pytest.mark.parametrize("n", [1, 2, 7, 60, 400])
def test_matches_double_precision(n):
    a = _symmetric(np.random.default_rng(n), n, spread=2.0)
    lam, Vt = eigh_single(a)
    assert lam.dtype == Vt.dtype == np.float32 and Vt.shape == (n, n)
    ref = np.linalg.eigh(a)[0]
    scale = float(np.abs(ref).max())
    assert np.all(np.diff(lam) >= 0)  # ascending, as numpy's
    assert np.abs(lam - ref).max() <= 1e-5 * scale  # single precision's rounding times the size's small growth
    V = Vt.T.astype(np.float64)
    assert np.abs(V.T @ V - np.eye(n)).max() <= 1e-5 * max(n, 10)  # orthonormal rows
    assert np.abs(_rebuilt(lam, Vt) - a).max() <= 1e-5 * scale * max(n, 10) ** 0.5  # reconstructs a


def test_reads_the_lower_triangle_only():
    a = _symmetric(np.random.default_rng(3), 50)
    garbage = a + np.triu(np.random.default_rng(4).normal(size=a.shape) * 100, 1)  # the upper triangle changed
    lam, Vt = eigh_single(garbage)
    ref_lam, ref_vt = eigh_single(a)
    # the same up to BLAS's threading (a garbage upper triangle read would move them by its 100s)
    np.testing.assert_allclose(lam, ref_lam, atol=1e-5)
    np.testing.assert_allclose(_rebuilt(lam, Vt), _rebuilt(ref_lam, ref_vt), atol=1e-4)  # eigenvectors up to sign and null space
    assert np.array_equal(garbage, a + np.triu(np.random.default_rng(4).normal(size=a.shape) * 100, 1))  # input untouched


def test_bad_input():
    assert [x.shape for x in eigh_single(np.zeros((0, 0)))] == [(0,), (0, 0)]
    with pytest.raises(ValueError, match="square"):
        eigh_single(np.zeros((3, 4)))
    bad = np.eye(4)
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        eigh_single(bad)


def test_threads_decompose_independently():
    """Two threads decomposing at once (the Dask worker's two) each get their own matrix's result."""
    mats = [_symmetric(np.random.default_rng(10 + i), 200) for i in range(2)]
    alone = [eigh_single(m) for m in mats]
    out: list = [None, None]

    def run(i: int) -> None:
        for _ in range(5):
            out[i] = eigh_single(mats[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (lam, Vt), (lam0, Vt0) in zip(out, alone):  # equal up to BLAS's threading, which a busy pool may change
        np.testing.assert_allclose(lam, lam0, atol=1e-5)
        np.testing.assert_allclose(_rebuilt(lam, Vt), _rebuilt(lam0, Vt0), atol=1e-4)
