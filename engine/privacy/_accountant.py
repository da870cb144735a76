"""ρ-zero-concentrated-DP accounting with exact rational arithmetic.

All privacy costs are expressed in ρ-zCDP (Bun & Steinke, "Concentrated Differential Privacy:
Simplifications, Extensions, and Lower Bounds", TCC 2016 — "BS16"). Costs that the ledger adds up
are :class:`fractions.Fraction` so that sequential composition (a sum) and parallel composition (a
max) are exact: a thousand charges of ``ρ/1000`` add up to exactly ``ρ``, never to ``ρ·(1+1e-16)``.

Costs of the mechanisms used by dprelease
-----------------------------------------
* Gaussian mechanism, L2 sensitivity Δ, noise standard deviation σ: ρ = Δ²/(2σ²)  (BS16 Prop. 1.6).
* Discrete Gaussian N_ℤ(0, σ²) on integer queries, L2 sensitivity Δ: the same ρ = Δ²/(2σ²)
  (Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020 —
  "CKS20", Theorem 14 / Proposition 5 for the 1-d case).
* Any ε-DP mechanism (discrete Laplace, permute-and-flip, …): ρ = ε²/2 (BS16 Prop. 1.4).
* Exponential mechanism with privacy parameter ε (selection probability ∝ exp(ε·q/(2Δ))): it is
  ε-*bounded range* and hence ρ = ε²/8-zCDP (Cesar & Rogers, "Bounding, Concentrating, and
  Truncating: Unifying Privacy Loss Composition for Data Analytics", ALT 2021, Lemma 3.2;
  also Durfee & Rogers 2019). OpenDP 0.16 charges its Gumbel report-noisy-max (which *is* the
  exponential mechanism) exactly this: ``make_noisy_max(..., zero_concentrated_divergence(),
  scale=2Δ/ε).map(Δ) == ε²/8``.
* Permute-and-flip (McKenna & Sheldon, NeurIPS 2020) with parameter ε is ε-DP (their Thm. 1).
  We are not aware of a published proof that it is ε-bounded range, and OpenDP 0.16 only offers
  its equivalent (report-noisy-max with exponential noise, Ding et al. 2021, arXiv:2105.07260)
  under ``MaxDivergence``. We therefore charge the safe pure-DP conversion ρ = ε²/2, *not* ε²/8.

Composition: sequential composition adds ρ (BS16 Lemma 2.3); mechanisms applied to disjoint
parts of the data (disjoint geographic nodes of one level) compose in parallel: the cost is the
maximum over the parts.

Conversion to (ε, δ)-DP
-----------------------
* ``"simple"``: ε = ρ + 2·√(ρ·log(1/δ))  (BS16 Prop. 1.3).
* ``"cks"``: the tighter CKS20 Corollary 13:
  ε(δ) = inf_{α>1}  αρ + ( log(1/δ) + (α−1)·log(1−1/α) − log α ) / (α−1),
  minimised numerically. Every α>1 gives a valid ε, so an imprecise minimiser can only make the
  result (slightly) conservative, never unsafe. It is always ≤ the simple bound.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from fractions import Fraction
from numbers import Rational
from typing import Literal

import numpy as np

Number = int | float | Fraction | str
ConversionMethod = Literal["cks", "simple"]

__all__ = [
    "as_fraction",
    "gaussian_rho",
    "sigma_for_rho",
    "pure_dp_rho",
    "exponential_mechanism_rho",
    "permute_and_flip_rho",
    "epsilon_for_pure_rho",
    "sequential",
    "parallel",
    "rho_to_eps",
    "eps_delta_to_rho",
]


def as_fraction(x: Number, *, exact_float: bool = False) -> Fraction:
    """Convert a number to a Fraction.

    Floats are converted through their shortest decimal representation (``Fraction(str(x))``,
    so ``0.2 -> 1/5``), unless ``exact_float`` is set, in which case the exact binary value is
    used (``Fraction(0.2) == 3602879701896397/18014398509481984``) — use that when the float *is*
    the quantity (e.g. the σ actually handed to a sampler). Strings such as ``"1/3"`` are parsed.
    """
    if isinstance(x, Fraction):
        return x
    if isinstance(x, bool):
        raise TypeError("booleans are not privacy parameters")
    if isinstance(x, (int, np.integer)):
        return Fraction(int(x))
    if isinstance(x, Rational):
        return Fraction(x.numerator, x.denominator)
    if isinstance(x, (float, np.floating)):
        xf = float(x)
        if not math.isfinite(xf):
            raise ValueError(f"privacy parameter must be finite, got {x!r}")
        return Fraction(xf) if exact_float else Fraction(repr(xf))
    if isinstance(x, str):
        return Fraction(x)
    raise TypeError(f"cannot convert {type(x).__name__} {x!r} to a Fraction")


def _positive(name: str, x: Fraction) -> None:
    if x <= 0:
        raise ValueError(f"{name} must be > 0, got {x}")


# -- costs of single mechanisms -------------------------------------------------------------
def gaussian_rho(l2_sensitivity: Number, sigma: Number) -> Fraction:
    """ρ = Δ²/(2σ²) of the (continuous or discrete) Gaussian mechanism.

    Continuous: BS16 Prop. 1.6. Discrete Gaussian N_ℤ(0, σ²) on integer-valued queries:
    CKS20 Theorem 14. Floats are taken at their exact binary value (they are the parameters
    actually used), so the result is the exact cost of exactly these parameters.
    """
    d = as_fraction(l2_sensitivity, exact_float=True)
    s = as_fraction(sigma, exact_float=True)
    if d < 0:
        raise ValueError(f"sensitivity must be >= 0, got {d}")
    _positive("sigma", s)
    return d * d / (2 * s * s)


def sigma_for_rho(l2_sensitivity: Number, rho: Number) -> float:
    """The smallest float σ (up to a few ulps) with Δ²/(2σ²) ≤ ρ, checked exactly.

    Starts from σ = Δ/√(2ρ) and steps up one ulp at a time until the exact rational cost of the
    float σ does not exceed ρ, so rounding can never make a measurement cost more than planned.
    """
    r = as_fraction(rho)
    _positive("rho", r)
    d = float(l2_sensitivity)
    if not d > 0:
        raise ValueError(f"l2_sensitivity must be > 0, got {l2_sensitivity!r}")
    sigma = d / math.sqrt(2.0 * float(r))
    while gaussian_rho(d, sigma) > r:
        sigma = float(np.nextafter(sigma, math.inf))
    return sigma


def pure_dp_rho(epsilon: Number) -> Fraction:
    """ρ = ε²/2: every ε-DP mechanism is (ε²/2)-zCDP (Theorem: BS16 Proposition 1.4)."""
    e = as_fraction(epsilon, exact_float=True)
    if e < 0:
        raise ValueError(f"epsilon must be >= 0, got {e}")
    return e * e / 2


def exponential_mechanism_rho(epsilon: Number) -> Fraction:
    """ρ = ε²/8 for the exponential mechanism (selection ∝ exp(ε q / 2Δ)).

    Theorem: an ε-bounded-range mechanism is (ε²/8)-zCDP (Cesar & Rogers, "Bounding,
    Concentrating, and Truncating", ALT 2021, Lemma 3.2; bounded range defined in Durfee &
    Rogers, NeurIPS 2019, Definition 3.1).

    Condition (what the caller must guarantee): for neighbouring D, D' the log-probability ratio of
    candidate r is ε/(2Δ)·(q(D,r) − q(D',r)) minus a constant, so the mechanism is ε-BR exactly
    when max_r − min_r of the score differences q(D,r) − q(D',r) is at most 2Δ — implied by
    |q(D,r) − q(D',r)| ≤ Δ for every candidate r, i.e. Δ a true sensitivity of every score.
    ``tests/privacy/test_bounded_range.py`` checks this for the scores the pipeline builds
    (``engine.privacy._session.max_abs_error_scores`` with ``engine.hgem.privacy.score_sensitivity``),
    and ``tests/engine/test_adaptive.py`` for the adaptive rounds' L1 scores
    (``PrivateSession.select_worst_fit``).
    Do NOT use this for permute-and-flip, see :func:`permute_and_flip_rho`.
    """
    e = as_fraction(epsilon, exact_float=True)
    if e < 0:
        raise ValueError(f"epsilon must be >= 0, got {e}")
    return e * e / 8


def epsilon_for_exponential_rho(rho: Number) -> float:
    """The largest float ε (up to a few ulps) with ε²/8 ≤ ρ exactly (inverse of
    :func:`exponential_mechanism_rho`): the selection ε of a round given its ρ share."""
    return _largest_epsilon(rho, 8.0, exponential_mechanism_rho)


def permute_and_flip_rho(epsilon: Number) -> Fraction:
    """ρ = ε²/2 for permute-and-flip (McKenna & Sheldon 2020): ε-DP ⇒ ε²/2-zCDP (BS16 Prop. 1.4).

    The tighter ε²/8 bounded-range bound is deliberately not used (no proof that PF is ε-BR is
    known to us; OpenDP 0.16 likewise only certifies its exponential-noise RNM under pure DP).
    """
    return pure_dp_rho(epsilon)


def epsilon_for_pure_rho(rho: Number) -> float:
    """The largest float ε (up to a few ulps) with ε²/2 ≤ ρ exactly (inverse of pure_dp_rho)."""
    return _largest_epsilon(rho, 2.0, pure_dp_rho)


def _largest_epsilon(rho: Number, c: float, to_rho: Callable[[float], Fraction]) -> float:
    """The largest float ε with ``to_rho(ε)`` = ε²/c ≤ ρ exactly: √(cρ) in floats, stepped down by
    ulps until the exact charge fits."""
    r = as_fraction(rho)
    _positive("rho", r)
    eps = math.sqrt(c * float(r))
    while to_rho(eps) > r:
        eps = float(np.nextafter(eps, 0.0))
    return eps


# -- composition ------------------------------------------------------------------------------
def sequential(rhos: Iterable[Number]) -> Fraction:
    """Sequential composition: the exact sum of the costs (BS16 Lemma 2.3)."""
    return sum((as_fraction(r) for r in rhos), Fraction(0))


def parallel(rhos: Iterable[Number]) -> Fraction:
    """Parallel composition over disjoint parts of the data: the maximum cost (0 if none).

    Theorem: McSherry, "Privacy Integrated Queries", SIGMOD 2009, Theorem 4 (pure DP); the proof
    carries over to ρ-zCDP unchanged (BS16 Definition 1.1 bounds the Rényi divergence of one pair of
    neighbours; with independent noise per part, a neighbour that changes one part leaves the
    others' output distributions equal, so the divergence is that of the changed part). In
    dprelease the parts are the geographic nodes of one level: one household (household unit) or
    one person, alone or within a household (person unit), lies in exactly one node.
    """
    return max((as_fraction(r) for r in rhos), default=Fraction(0))


# -- conversion to (ε, δ) ---------------------------------------------------------------------
def _cks_objective(alpha: np.ndarray, rho: float, log_inv_delta: float) -> np.ndarray:
    am1 = alpha - 1.0
    out: np.ndarray = alpha * rho + (log_inv_delta + am1 * np.log1p(-1.0 / alpha) - np.log(alpha)) / am1
    return out


def rho_to_eps(rho: Number, delta: float, method: ConversionMethod = "cks") -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP.

    ``simple``: ρ + 2√(ρ log(1/δ)) (BS16 Prop. 1.3).
    ``cks``: CKS20 Corollary 13, ε = inf_{α>1} αρ + (log(1/δ) + (α−1)log(1−1/α) − log α)/(α−1),
    minimised over a log-spaced grid of α−1 followed by golden-section refinement; the value
    returned is the objective at an actual α, hence always a valid ε. Clipped at 0.
    """
    r = float(as_fraction(rho))
    if r < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if r == 0.0:
        return 0.0
    L = math.log(1.0 / delta)
    if method == "simple":
        return r + 2.0 * math.sqrt(r * L)
    if method != "cks":
        raise ValueError(f"unknown conversion method {method!r}; use 'cks' or 'simple'")
    # α − 1 = exp(t); the optimum is near α ≈ 1 + √(L/ρ).
    t = np.linspace(-25.0, 60.0, 2001)
    vals = _cks_objective(1.0 + np.exp(t), r, L)
    i = int(np.nanargmin(vals))
    lo, hi = t[max(i - 1, 0)], t[min(i + 1, len(t) - 1)]
    best = float(vals[i])
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    for _ in range(100):
        c, d = b - g * (b - a), a + g * (b - a)
        fc = float(_cks_objective(np.array([1.0 + math.exp(c)]), r, L)[0])
        fd = float(_cks_objective(np.array([1.0 + math.exp(d)]), r, L)[0])
        best = min(best, fc, fd)
        if fc < fd:
            b = d
        else:
            a = c
        if b - a < 1e-12:
            break
    return max(0.0, best)


@functools.lru_cache(maxsize=256)  # a pure function of its arguments; each task re-derives its context's plan with it
def eps_delta_to_rho(epsilon: float, delta: float, method: ConversionMethod = "cks") -> float:
    """The largest ρ (to ~1e-13 relative) with ``rho_to_eps(ρ, δ, method) ≤ ε``.

    Closed form for ``simple`` (√ρ = √(L+ε) − √L, L = log 1/δ, then checked); bisection on the
    monotone map ρ ↦ ε(ρ) for ``cks``. The result always satisfies rho_to_eps(result) ≤ ε.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    L = math.log(1.0 / delta)
    if method == "simple":
        rho = (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2
        while rho > 0 and rho_to_eps(rho, delta, "simple") > epsilon:
            rho = float(np.nextafter(rho, 0.0))
        return rho
    if method != "cks":
        raise ValueError(f"unknown conversion method {method!r}; use 'cks' or 'simple'")
    lo = (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2 * (1 - 1e-12)  # simple is conservative
    hi = max(epsilon, 2 * lo)
    while rho_to_eps(hi, delta, "cks") <= epsilon:
        hi *= 2.0
    if rho_to_eps(lo, delta, "cks") > epsilon:
        lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if rho_to_eps(mid, delta, "cks") <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return lo
