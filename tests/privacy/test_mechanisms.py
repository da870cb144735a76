"""Statistical tests of the noise mechanisms against their exact distributions.

OpenDP samples from OS entropy (no seeds), so every check is a hypothesis test at a small false
alarm rate (α = 1e-6 per check), and each is paired with a *negative control*: the same samples
must be rejected against the distribution a wrong scale / wrong sensitivity would produce, which
shows that the test has the power to catch such a bug.
"""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from engine.privacy._accountant import gaussian_rho, sigma_for_rho
from engine.privacy._measurements import mechanisms as mech

ALPHA = 1e-6


def dgauss_pmf(sigma: float):
    k = int(math.ceil(sigma * 14)) + 2
    x = np.arange(-k, k + 1)
    w = np.exp(-(x.astype(float) ** 2) / (2 * sigma**2))
    return x, w / w.sum()


def dlap_pmf(b: float):
    k = int(math.ceil(b * 40)) + 2
    x = np.arange(-k, k + 1)
    w = np.exp(-np.abs(x) / b)
    return x, w / w.sum()


def moments(x, p):
    var = float(np.sum(x.astype(float) ** 2 * p))
    m4 = float(np.sum(x.astype(float) ** 4 * p))
    return var, m4


def var_z(samples, x, p):
    """z-score of the empirical variance (mean known = 0) against the pmf's exact variance."""
    var, m4 = moments(x, p)
    n = samples.size
    return (np.mean(samples.astype(float) ** 2) - var) / math.sqrt((m4 - var**2) / n)


def chi2_p(samples, x, p, min_expected=20):
    """Chi-square goodness of fit with tails pooled so every bin expects ≥ min_expected."""
    n = samples.size
    exp = p * n
    keep = exp >= min_expected
    lo, hi = x[keep].min(), x[keep].max()
    inner = np.arange(lo, hi + 1)
    obs = np.array([np.sum(samples < lo)] + [np.sum(samples == v) for v in inner] + [np.sum(samples > hi)])
    e = np.array([p[x < lo].sum()] + [p[x == v].sum() for v in inner] + [p[x > hi].sum()]) * n
    m = e > 0
    return stats.chisquare(obs[m], e[m] * obs[m].sum() / e[m].sum()).pvalue


N = 60_000


def test_discrete_gaussian_distribution():
    l2, rho = math.sqrt(2), 1.0  # σ = 1: far from continuous-Gaussian-like variance rounding
    counts = np.arange(N, dtype=np.int64) % 7 + 100
    noisy, sigma = mech.discrete_gaussian(counts, l2, rho)
    assert noisy.dtype == np.int64 and noisy.shape == counts.shape
    assert sigma == sigma_for_rho(l2, rho) and gaussian_rho(l2, sigma) <= 1
    z = noisy - counts
    x, p = dgauss_pmf(sigma)
    assert abs(var_z(z, x, p)) < 5
    assert chi2_p(z, x, p) > ALPHA
    assert abs(z.mean()) < 5 * math.sqrt(moments(x, p)[0] / N)
    # negative controls: sensitivity 1 instead of √2 (σ/√2), or σ·1.15
    for wrong in [sigma / math.sqrt(2), sigma * 1.15]:
        xw, pw = dgauss_pmf(wrong)
        assert abs(var_z(z, xw, pw)) > 5
        assert chi2_p(z, xw, pw) < ALPHA


def test_discrete_gaussian_small_sigma_variance_below_sigma_squared():
    # For σ = 0.5 the discrete Gaussian's variance is clearly below σ² (≈0.2085 vs 0.25)
    noisy, sigma = mech.discrete_gaussian(np.zeros(N, dtype=np.int64), 1.0, 2.0)
    assert sigma == pytest.approx(0.5)
    x, p = dgauss_pmf(sigma)
    assert moments(x, p)[0] < 0.9 * sigma**2
    assert abs(var_z(noisy, x, p)) < 5
    assert chi2_p(noisy, x, p) > ALPHA


def test_discrete_laplace_distribution():
    l1, eps = 3.0, 1.5  # b = 2
    counts = np.full((N // 100, 100), 50, dtype=np.int64)
    noisy, b = mech.discrete_laplace(counts, l1, eps)
    assert b == pytest.approx(2.0) and l1 / b <= eps
    assert noisy.shape == counts.shape and noisy.dtype == np.int64
    z = (noisy - counts).ravel()
    x, p = dlap_pmf(b)
    q = math.exp(-1 / b)
    assert moments(x, p)[0] == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-9)  # closed form
    assert abs(var_z(z, x, p)) < 5
    assert chi2_p(z, x, p) > ALPHA
    for wrong in [b / 1.5, b * 1.2]:  # ε/Δ₁ mixed up with Δ₁ = 2, or 20% too much noise
        xw, pw = dlap_pmf(wrong)
        assert chi2_p(z, xw, pw) < ALPHA


def test_gaussian_float_distribution():
    l2, rho = 2.0, 0.5  # σ = 2
    vals = np.linspace(-3, 3, N)
    noisy, sigma = mech.gaussian(vals, l2, rho)
    assert sigma == pytest.approx(2.0, rel=1e-8) and sigma >= 2.0
    z = noisy - vals
    assert stats.kstest(z, stats.norm(scale=sigma).cdf).pvalue > ALPHA
    assert stats.kstest(z, stats.norm(scale=sigma * 1.1).cdf).pvalue < ALPHA
    assert stats.kstest(z, stats.norm(scale=sigma / math.sqrt(2)).cdf).pvalue < ALPHA


def test_inputs_validated():
    with pytest.raises(ValueError):
        mech.discrete_gaussian(np.array([1.5, 2.0]), 1.0, 0.1)
    with pytest.raises(ValueError):
        mech.discrete_gaussian(np.array([1, 2]), 0.0, 0.1)
    with pytest.raises(ValueError):
        mech.discrete_laplace(np.array([1, 2]), 1.0, -1.0)
    with pytest.raises(ValueError):
        mech.exponential_mechanism([], 1.0, 1.0)
    with pytest.raises(ValueError):
        mech.gaussian(np.array([np.nan]), 1.0, 0.1)
    out, _ = mech.discrete_gaussian(np.array([3.0, 4.0]), 1.0, 1000.0)  # integer-valued floats ok
    assert out.dtype == np.int64


def test_vectors_of_1e5():
    """Whole vectors in one call (no timing assertion: the machine may be shared)."""
    counts = np.random.default_rng(0).integers(0, 1000, size=100_000)
    noisy, sigma = mech.discrete_gaussian(counts, math.sqrt(3), 0.05)
    assert noisy.shape == counts.shape
    assert np.std(noisy - counts) == pytest.approx(sigma, rel=0.03)
    scores = np.random.default_rng(1).random(100_000)
    assert 0 <= mech.exponential_mechanism(scores, 1.0, 1.0) < scores.size


# -- selection ---------------------------------------------------------------------------------------
SCORES = np.array([0.0, 1.0, 2.0, 3.0, 5.0])
DRAWS = 12_000


def em_probs(scores, sens, eps):
    w = np.exp(eps * (scores - scores.max()) / (2 * sens))
    return w / w.sum()


def pf_probs(scores, sens, eps):
    """Exact permute-and-flip probabilities by enumerating all permutations (McKenna & Sheldon 2020)."""
    p = np.exp(eps * (scores - scores.max()) / (2 * sens))
    n = len(scores)
    out = np.zeros(n)
    for perm in itertools.permutations(range(n)):
        reject = 1.0
        for i in perm:
            out[i] += reject * p[i]
            reject *= 1 - p[i]
    return out / math.factorial(n)


def freq(fn, scores, sens, eps):
    c = np.zeros(len(scores), dtype=np.int64)
    for _ in range(DRAWS):
        c[fn(scores, sens, eps)] += 1
    return c


def test_exponential_mechanism_frequencies():
    sens, eps = 2.0, 2.0  # P ∝ exp(s/2)
    c = freq(mech.exponential_mechanism, SCORES, sens, eps)
    assert stats.chisquare(c, DRAWS * em_probs(SCORES, sens, eps)).pvalue > ALPHA
    # negative controls: forgetting the factor 2 in the exponent, or the sensitivity
    assert stats.chisquare(c, DRAWS * em_probs(SCORES, sens / 2, eps)).pvalue < ALPHA
    assert stats.chisquare(c, DRAWS * em_probs(SCORES, sens, eps / 2)).pvalue < ALPHA
    assert stats.chisquare(c, DRAWS * pf_probs(SCORES, sens, eps)).pvalue < ALPHA


def test_permute_and_flip_frequencies():
    sens, eps = 1.0, 1.0
    p = pf_probs(SCORES, sens, eps)
    assert p.sum() == pytest.approx(1.0)
    c = freq(mech.permute_and_flip, SCORES, sens, eps)
    assert stats.chisquare(c, DRAWS * p).pvalue > ALPHA
    assert stats.chisquare(c, DRAWS * em_probs(SCORES, sens, eps)).pvalue < ALPHA
    assert stats.chisquare(c, DRAWS * pf_probs(SCORES, sens / 2, eps)).pvalue < ALPHA


def test_selection_maximises():
    s = np.array([0.0, 0.0, 1e6, 0.0])
    assert mech.exponential_mechanism(s, 1.0, 1.0) == 2
    assert mech.permute_and_flip(s, 1.0, 1.0) == 2
    assert mech.permute_and_flip(-s, 1.0, 1.0) != 2
