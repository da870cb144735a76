"""Noise mechanisms on OpenDP 0.16 samplers, with sensitivities always passed explicitly.

Every function builds ONE OpenDP measurement over a vector domain per call and applies it to the
whole vector (OpenDP samples in Rust from OS entropy; there are no seeds). Each function also
checks OpenDP's own privacy map: ``measurement.map(sensitivity)`` must not exceed the ρ (or ε) the
caller asked for, so a wrong formula here would fail loudly rather than silently under-noise.

- :func:`discrete_gaussian` — integer counts + N_ℤ(0, σ²) (Canonne, Kamath & Steinke 2020), ρ-zCDP
  with σ from ρ = Δ₂²/(2σ²).
- :func:`discrete_laplace` — integer counts + discrete Laplace (two-sided geometric,
  P(k) ∝ exp(−|k|/b), b = Δ₁/ε; Ghosh, Roughgarden & Sundararajan 2009), ε-DP.
- :func:`gaussian` — float values + Gaussian (OpenDP's exact sampler on a 2^-40 grid), ρ-zCDP.
- :func:`exponential_mechanism` — P(i) ∝ exp(ε·s_i / (2Δ)) via OpenDP ``make_noisy_max`` with Gumbel
  noise of scale 2Δ/ε (Gumbel-max trick ≡ exponential mechanism); ε-DP and ε²/8-zCDP.
- :func:`permute_and_flip` — McKenna & Sheldon 2020 via OpenDP ``make_noisy_max`` with exponential
  noise of scale 2Δ/ε (report-noisy-max with exponential noise is identical to permute-and-flip,
  Ding, Kifer et al. 2021, arXiv:2105.07260); ε-DP, charged ε²/2 in zCDP.

The selection functions maximise the score; Δ is the sensitivity of each score (L∞ over the vector).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import opendp.prelude as dp
from numpy.typing import ArrayLike

from engine.privacy._accountant import Number, as_fraction, sigma_for_rho

dp.enable_features("contrib")

__all__ = [
    "discrete_gaussian",
    "discrete_gaussian_sigma",
    "discrete_laplace",
    "discrete_laplace_scale",
    "gaussian",
    "gaussian_sigma",
    "exponential_mechanism",
    "permute_and_flip",
]

_FLOAT_K = -40  # granularity 2^-40 of OpenDP's float Gaussian sampler


def _as_counts(counts: ArrayLike) -> tuple[np.ndarray, tuple[int, ...]]:
    a = np.asarray(counts)
    if a.dtype.kind in "iu":
        out = a.astype(np.int64)
    elif a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise ValueError("counts must be integer-valued")
        out = a.astype(np.int64)
    elif a.dtype.kind == "b":
        out = a.astype(np.int64)
    else:
        raise TypeError(f"counts must be an integer array, got dtype {a.dtype}")
    return out.ravel(), a.shape


def _check_positive(name: str, x: float) -> float:
    x = float(x)
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{name} must be a positive finite number, got {x!r}")
    return x


def _fit_scale(build: Callable[[float], dp.Measurement], sens: float, budget: float, scale: float,
               ok: Callable[[float], bool]) -> tuple[dp.Measurement, float]:
    """Build the measurement, raising ``scale`` until OpenDP's own map agrees with the budget."""
    for _ in range(60):
        m = build(scale)
        loss: float = m.map(sens)  # type: ignore[no-untyped-call]  # OpenDP's Measurement methods are unannotated
        if ok(loss):
            return m, scale
        scale *= math.sqrt(max(loss / budget, 1.0)) * (1 + 1e-9) if budget > 0 else 2.0
    raise RuntimeError("could not fit a noise scale to OpenDP's privacy map")  # pragma: no cover


# -- counts ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)  # immutable OpenDP measurements, built once per (Δ, budget)
def _dg_measurement(l2: float, rho: Fraction) -> tuple[dp.Measurement, float]:
    sigma = sigma_for_rho(l2, rho)
    space = (dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="f64"))
    build = lambda s: dp.m.make_gaussian(*space, scale=s)  # noqa: E731
    return _fit_scale(build, l2, float(rho), sigma, lambda loss: as_fraction(loss, exact_float=True) <= rho)


def discrete_gaussian_sigma(l2_sensitivity: float, rho: Number) -> float:
    """σ used by :func:`discrete_gaussian`: the smallest float with Δ₂²/(2σ²) ≤ ρ exactly
    (accountant.sigma_for_rho), raised further only if OpenDP's own map disagrees."""
    return _dg_measurement(_check_positive("l2_sensitivity", l2_sensitivity), as_fraction(rho))[1]


def discrete_gaussian(counts: ArrayLike, l2_sensitivity: float, rho: Number) -> tuple[np.ndarray, float]:
    """Add discrete Gaussian noise N_ℤ(0, σ²) to integer counts; returns (noisy int64, σ).

    ρ-zCDP for an L2 sensitivity ``l2_sensitivity`` (CKS20 Thm. 14). Shape is preserved.
    """
    x, shape = _as_counts(counts)
    m, sigma = _dg_measurement(_check_positive("l2_sensitivity", l2_sensitivity), as_fraction(rho))
    if x.size == 0:
        return x.reshape(shape), sigma
    return np.asarray(m(x.tolist()), dtype=np.int64).reshape(shape), sigma


@functools.lru_cache(maxsize=1024)  # immutable OpenDP measurements, built once per (Δ, budget)
def _dl_measurement(l1: float, eps: float) -> tuple[dp.Measurement, float]:
    b = l1 / eps
    while l1 / b > eps:
        b = float(np.nextafter(b, math.inf))
    space = (dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="f64"))
    build = lambda s: dp.m.make_laplace(*space, scale=s)  # noqa: E731
    return _fit_scale(build, l1, eps, b, lambda loss: loss <= eps)


def discrete_laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """b used by :func:`discrete_laplace`: Δ₁/ε, nudged up by ulps so that Δ₁/b ≤ ε in floats."""
    return _dl_measurement(_check_positive("l1_sensitivity", l1_sensitivity), _check_positive("epsilon", epsilon))[1]


def discrete_laplace(counts: ArrayLike, l1_sensitivity: float, epsilon: float) -> tuple[np.ndarray, float]:
    """Add discrete Laplace noise P(k) ∝ exp(−|k|/b), b = Δ₁/ε; returns (noisy int64, b). ε-DP."""
    x, shape = _as_counts(counts)
    m, b = _dl_measurement(_check_positive("l1_sensitivity", l1_sensitivity), _check_positive("epsilon", epsilon))
    if x.size == 0:
        return x.reshape(shape), b
    return np.asarray(m(x.tolist()), dtype=np.int64).reshape(shape), b


# -- real values -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)  # immutable OpenDP measurements, built once per (Δ, budget)
def _gauss_measurement(l2: float, rho: Fraction, n: int) -> tuple[dp.Measurement, float]:
    sigma = sigma_for_rho(l2, rho)
    space = (dp.vector_domain(dp.atom_domain(T=float, nan=False), size=max(int(n), 1)), dp.l2_distance(T=float))
    build = lambda s: dp.m.make_gaussian(*space, scale=s, k=_FLOAT_K)  # noqa: E731
    return _fit_scale(build, l2, float(rho), sigma, lambda loss: as_fraction(loss, exact_float=True) <= rho)


def gaussian_sigma(l2_sensitivity: float, rho: Number, n: int) -> float:
    """σ used by :func:`gaussian` for a vector of ``n`` values: Δ₂/√(2ρ) raised by the tiny
    amount (relative ~1e-9 at n = 10^5) OpenDP's map needs for its 2^-40 discretisation."""
    return _gauss_measurement(_check_positive("l2_sensitivity", l2_sensitivity), as_fraction(rho), n)[1]


def gaussian(values: ArrayLike, l2_sensitivity: float, rho: Number) -> tuple[np.ndarray, float]:
    """Add Gaussian noise N(0, σ²) to float values; returns (noisy float64, σ). ρ-zCDP.

    Uses OpenDP's exact Gaussian sampler on a 2^-40 grid (the vector length is fixed in the
    domain, as OpenDP requires for a non-exact discretisation).
    """
    a = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError("values must be finite")
    m, sigma = _gauss_measurement(_check_positive("l2_sensitivity", l2_sensitivity), as_fraction(rho), a.size)
    if a.size == 0:
        return a.copy(), sigma
    return np.asarray(m(a.ravel().tolist()), dtype=np.float64).reshape(a.shape), sigma


# -- selection -------------------------------------------------------------------------------------
def _scores(scores: ArrayLike) -> list[float]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    if s.size == 0:
        raise ValueError("cannot select from an empty score vector")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    return s.tolist()


@functools.lru_cache(maxsize=256)
def _noisy_max_measurement(kind: str, d: float, e: float) -> dp.Measurement:
    """OpenDP noisy-max measurement (built once per (kind, Δ, ε) and cached: it is immutable)."""
    space = (dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float))
    if kind == "gumbel":
        measure, budget = dp.zero_concentrated_divergence(), e * e / 8.0
    else:
        measure, budget = dp.max_divergence(), e
    build = lambda sc: dp.m.make_noisy_max(*space, measure, scale=sc)  # noqa: E731
    return _fit_scale(build, d, budget, 2.0 * d / e, lambda loss: loss <= budget)[0]


def _noisy_max(scores: ArrayLike, sensitivity: float, epsilon: float, kind: str) -> int:
    s = _scores(scores)
    d = _check_positive("sensitivity", sensitivity)
    e = _check_positive("epsilon", epsilon)
    return int(_noisy_max_measurement(kind, d, e)(s))


def exponential_mechanism(scores: ArrayLike, sensitivity: float, epsilon: float) -> int:
    """Index i chosen with probability ∝ exp(ε·scores[i] / (2Δ)) (McSherry & Talwar 2007).

    OpenDP Gumbel report-noisy-max with scale 2Δ/ε; its zCDP map is checked to be ≤ ε²/8
    (Cesar & Rogers 2021 bounded-range bound). ε-DP.
    """
    return _noisy_max(scores, sensitivity, epsilon, "gumbel")


def permute_and_flip(scores: ArrayLike, sensitivity: float, epsilon: float) -> int:
    """Permute-and-flip (McKenna & Sheldon 2020): visit candidates in random order, accept r with
    probability exp(ε·(scores[r] − max)/(2Δ)).

    Implemented as OpenDP report-noisy-max with exponential noise of scale 2Δ/ε, which has exactly
    the permute-and-flip output distribution (Ding et al. 2021); OpenDP's pure-DP map is checked
    to be ≤ ε. Charge it as ε²/2 in zCDP (accountant.permute_and_flip_rho).
    """
    return _noisy_max(scores, sensitivity, epsilon, "exponential")
