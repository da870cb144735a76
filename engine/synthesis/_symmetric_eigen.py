"""The eigendecomposition of a dense symmetric matrix in single precision, with the GIL released.

A state's interval estimate (``engine.synthesis._uncertainty.posterior_count_sd``) decomposes the
whitened prior spread of its measured cells, a dense matrix of a few thousand rows: the largest dense
step of a state. LAPACK's single-precision divide and conquer (``ssyevd``) takes about half the time
of the double-precision one there, and an error estimate needs no more than single precision
(``tests/engine/test_symmetric_eigen.py`` and ``tests/engine/test_uncertainty.py`` bound the
difference). numpy's ``eigh`` is no faster on float32 input, and scipy.linalg's wrappers hold the
GIL for the whole call, which would stop the Dask worker's other thread (fitting another state)
for as long. So the routine is called through scipy's table of LAPACK functions
(``scipy.linalg.cython_lapack``, a public interface) by ctypes, whose calls of foreign functions
release the GIL.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
from scipy.linalg import cython_lapack

__all__ = ["eigh_single"]

_INT = ctypes.POINTER(ctypes.c_int)
_PTR = ctypes.c_void_p
# ssyevd(jobz, uplo, n, a, lda, w, work, lwork, iwork, liwork, info), scipy.linalg.cython_lapack's signature
_SSYEVD_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, _INT, _PTR, _INT, _PTR, _PTR, _INT, _PTR, _INT, _INT)


def _lapack_function(name: str, prototype: type) -> Callable[..., None]:
    """The function ``name`` of scipy's LAPACK table (a capsule named by its C signature) as a ctypes
    function of ``prototype``; Python's capsule API through prototypes of its own, so that the shared
    ``ctypes.pythonapi`` functions' types are left as they are."""
    capsule = cython_lapack.__pyx_capi__[name]
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
    function: Callable[..., None] = prototype(get_pointer(capsule, get_name(capsule)))
    return function


_ssyevd = _lapack_function("ssyevd", _SSYEVD_TYPE)


def eigh_single(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of the symmetric matrix whose lower triangle and
    diagonal are ``a``'s (square, finite; its upper triangle is not read), in single precision:
    ``(lam, Vt)``, both float32, row i of ``Vt`` the unit eigenvector of ``lam[i]``. The input is
    copied; ``Vt`` is the copy, overwritten (one n × n float32 array besides LAPACK's workspace)."""
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"eigh_single needs a square matrix, not one of shape {a.shape}")
    n = a.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.float32), np.zeros((0, 0), dtype=np.float32)
    min_work = 1 + 6 * n + 2 * n * n  # ssyevd's workspace for eigenvectors, in floats
    if min_work > np.iinfo(np.int32).max:
        raise ValueError(f"eigh_single: {n} rows need a workspace beyond LAPACK's 32-bit sizes")
    vt = np.array(a, dtype=np.float32, order="C")
    if not np.isfinite(vt).all():
        raise ValueError("eigh_single needs a finite matrix")
    # the C-ordered array is, to Fortran, its transpose: the lower triangle asked for is Fortran's
    # upper ("U"), and the eigenvectors LAPACK writes as Fortran columns are the C rows. The
    # workspaces are ssyevd's documented sizes for eigenvectors, which are also its optimal ones
    w = np.empty(n, dtype=np.float32)
    work, iwork = np.empty(min_work, dtype=np.float32), np.empty(3 + 5 * n, dtype=np.int32)
    size, lwork, liwork, info = ctypes.c_int(n), ctypes.c_int(work.size), ctypes.c_int(iwork.size), ctypes.c_int(0)
    _ssyevd(b"V", b"U", ctypes.byref(size), vt.ctypes.data, ctypes.byref(size), w.ctypes.data, work.ctypes.data,
            ctypes.byref(lwork), iwork.ctypes.data, ctypes.byref(liwork), ctypes.byref(info))
    if info.value < 0:
        raise ValueError(f"ssyevd: argument {-info.value} is invalid")
    if info.value > 0:
        raise np.linalg.LinAlgError(f"ssyevd did not converge ({info.value} eigenvalues)")
    return w, vt
