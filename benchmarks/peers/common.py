"""Shared pieces of the peer mechanisms: mbi import with JAX configured, the zCDP → (ε, δ)
conversion and the exponential mechanism of the reference code.

Sources (private-pgm, github.com/ryan112358/private-pgm @ 4d2b3c5):
  ``mechanisms/cdp2adp.py`` — Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential
  Privacy" (NeurIPS 2020), Proposition 1.3 bound, code © 2020 IBM / T. Steinke, Apache-2.0;
  ``mechanisms/mechanism.py`` — ``Mechanism.exponential_mechanism``.
Noise is numpy's continuous Gaussian, as in the reference (benchmark only, never a release path).
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
from scipy.special import softmax


def import_mbi():
    """Import mbi 2.0.0 with JAX's persistent compilation cache off (mbi advises it: it compiles
    many small programs) and its float32 warning silenced (N ≈ 10⁴ here, well below the 10⁵ it
    warns about)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        import mbi
    return mbi


# -- cdp2adp.py (Steinke), ported unchanged in substance --------------------------------------------
def cdp_delta(rho: float, eps: float) -> float:
    """δ such that ρ-zCDP implies (ε, δ)-DP (CKS20, Prop. 1.3 optimised over α)."""
    assert rho >= 0 and eps >= 0
    if rho == 0:
        return 0.0
    amin, amax = 1.01, (eps + 1) / (2 * rho) + 2
    for _ in range(1000):
        alpha = (amin + amax) / 2
        derivative = (2 * alpha - 1) * rho - eps + math.log1p(-1.0 / alpha)
        if derivative < 0:
            amin = alpha
        else:
            amax = alpha
    delta = math.exp((alpha - 1) * (alpha * rho - eps) + alpha * math.log1p(-1 / alpha)) / (alpha - 1.0)
    return min(delta, 1.0)


def cdp_rho(eps: float, delta: float) -> float:
    """The largest ρ such that ρ-zCDP implies (ε, δ)-DP (bisection on :func:`cdp_delta`)."""
    assert eps >= 0 and delta > 0
    if delta >= 1:
        return 0.0
    lo, hi = 0.0, eps + 1
    for _ in range(1000):
        rho = (lo + hi) / 2
        if cdp_delta(rho, eps) <= delta:
            lo = rho
        else:
            hi = rho
    return lo


# -- mechanism.py: exponential mechanism ------------------------------------------------------------
def exponential_mechanism(qualities: dict, epsilon: float, sensitivity: float, rng: np.random.Generator):
    """Sample a key with probability ∝ exp(ε q / (2 Δ)) (``Mechanism.exponential_mechanism``).
    As a zCDP mechanism it costs ε²/8 (bounded range, Cesar & Rogers 2021), as AIM accounts it."""
    keys = list(qualities)
    q = np.array([qualities[k] for k in keys], dtype=np.float64)
    p = softmax(0.5 * epsilon / sensitivity * (q - q.max()))
    return keys[rng.choice(p.size, p=p)]
