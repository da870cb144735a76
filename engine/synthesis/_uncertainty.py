"""Error estimates for released answers, from the published noise alone.

A release is a function of the config, the public inputs, the sampling seed and the stored noisy
measurements; so are its error estimates. Nothing here takes a confidential value: the inputs
are released answers, the noise's mechanism and scale (both published in ``measurements.parquet``),
the fitted posterior (itself a function of the noisy measurements) and a seed.

Two estimators, two methods:

- **Count-of-counts** (:func:`count_of_counts_bootstrap`): the pipeline's estimator (noisy
  household counts merged and made consistent, Hc estimated by isotonic regression, top-down
  consistency) is not linear, so its error is estimated by a *parametric bootstrap*: the released
  histograms are taken as the truth, the size and count measurements are simulated from them with
  the stored mechanism and scale (:func:`simulate_noise`), and the same estimator (an injected
  callable: the task's own post-processing) is rerun on each replicate. The replicates' spread is
  the standard error and their mean minus the released value the bias; the 90 % interval is
  ``released − bias ± z·se`` (:func:`bootstrap_summary`). Assumption: the estimator's error
  around the truth is distributed like its error around the released histograms (plug-in).
- **Synthesis marginals** (:func:`posterior_count_sd`): the noise-aware MAP update
  (``engine.synthesis._map_update``) is smooth, so its error is estimated analytically by the Laplace
  approximation of its posterior. In the answer space a = A q the prior term α·KL(q ‖ p) has
  curvature J⁻¹ with J = Cov_q(A)/α (the exponential family q ∝ p·exp(Aᵀλ/α)) and the Gaussian
  likelihood has precision S⁻¹ = diag(G²/σ²); the posterior covariance of the fitted answers is

      P = (J⁻¹ + S⁻¹)⁻¹ = J (J + S)⁻¹ S = S − S (J + S)⁻¹ S,

  one dense solve in the node's measured cells (no replicate refits: a bootstrap of every PUMA
  fit would cost replicates × the synthesis stage). A count G·a_c then has variance
  G² P_cc + a_c² Var(G), Var(G) the household total's (:func:`total_variance`). Assumptions:
  the posterior is close to Gaussian near its mode, and the prior (public data, or the state
  posterior for a PUMA) is as far from the truth as its own spread says; the sampling of
  households (systematic, each stratum within one household of its expectation) is neglected.
  For the IDE rule (which matches the noisy answers) the sd is the measurement's σ.
  The prior's actual error need not be the spread α says. When the fit's residuals against its
  prior are given (noisy answers minus the prior's answers: post-processing of the noisy
  measurements, the public or already-released prior and the published σ), the prior's error is
  estimated by empirical Bayes in the eigenbasis of the prior's spread relative to the noise,
  S^(-1/2) J S^(-1/2) = V diag(λ) Vᵀ: in direction i the whitened residual has variance
  τ_i·λ_i + 1, with one scale τ per band of λ (:data:`EB_BANDS`; a single τ would be driven by
  the well-measured directions, where the fit follows the measurements whatever the prior's
  error). The MAP estimator's error in direction i then has variance (τ_i λ_i + λ_i²)/(1 + λ_i)²
  (whitened): the prior's error passed through, S W T W S, plus the noise passed through,
  J W S W J, W = (J + S)⁻¹; τ = 1 is the Laplace form λ/(1 + λ).
  A released state answer is the sum of its PUMAs' (each PUMA fit starts from the state
  posterior), so each PUMA fit's linear response to its own noise on the state's workloads
  (:func:`response_count_sd`, a sandwich) is added to the state fit's variance by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike
from scipy.linalg import cholesky, solve_triangular

from engine.count_of_counts import Hierarchy
from engine.queries import Measurement, Support, Workload, centred_gram, outer_in_place
from engine.synthesis._node import MeasureFn
from engine.synthesis._symmetric_eigen import eigh_single

__all__ = [
    "EB_BANDS", "Z90", "CountNoise", "FitErrors", "Intervals", "Recording", "SharedPrior", "SizeNoise", "band_scales", "bootstrap_summary",
    "combine_total", "count_of_counts_bootstrap", "fit_answer_sd", "intervals", "posterior_count_sd", "prior_residual",
    "recording_measure", "response_count_sd", "simulate_at_least", "simulate_noise", "total_variance",
]

Z90 = 1.6448536269514722  # standard normal 95th percentile: a two-sided 90 % interval
BOOTSTRAP_REPLICATES = 200  # the sd estimate's relative error about 1/√(2·200), 5 %, at little cost beside the fit


def simulate_noise(rng: np.random.Generator, mechanism: str, scale: float, shape: int | tuple[int, ...]) -> np.ndarray:
    """Integer noise of the stored mechanism: the discrete Laplace of scale b exactly (the
    difference of two geometric variables), the discrete Gaussian of σ as a rounded normal (its
    variance σ² + 1/12 against at most σ² for the discrete Gaussian: a slight overstatement)."""
    if mechanism == "discrete_laplace":
        p = 1.0 - np.exp(-1.0 / float(scale))
        laplace: np.ndarray = (rng.geometric(p, shape) - rng.geometric(p, shape)).astype(np.float64)
        return laplace
    if mechanism in ("discrete_gaussian", "gaussian"):
        gauss: np.ndarray = np.rint(rng.normal(0.0, float(scale), shape))
        return gauss
    raise ValueError(f"no additive noise for mechanism {mechanism!r}")


@dataclass(frozen=True)
class Intervals:
    """Per released cell: standard error, bias (0 for the analytic form) and the 90 % interval."""

    se: np.ndarray
    bias: np.ndarray
    lo90: np.ndarray
    hi90: np.ndarray


def intervals(released: ArrayLike, se: ArrayLike, bias: ArrayLike = 0.0) -> Intervals:
    """``released − bias ± Z90·se``, the lower end floored at 0 (counts)."""
    r = np.asarray(released, dtype=np.float64)
    se = np.broadcast_to(np.asarray(se, dtype=np.float64), r.shape)
    bias = np.broadcast_to(np.asarray(bias, dtype=np.float64), r.shape)
    centre = r - bias
    return Intervals(np.array(se), np.array(bias), np.maximum(centre - Z90 * se, 0.0), centre + Z90 * se)


def bootstrap_summary(released: ArrayLike, replicates: ArrayLike) -> Intervals:
    """Intervals from replicates (R, …) of an estimator rerun on data simulated from ``released``:
    se = the replicates' standard deviation, bias = their mean − ``released``."""
    reps = np.asarray(replicates, dtype=np.float64)
    if reps.shape[0] < 2:
        raise ValueError("a bootstrap needs at least two replicates")
    r = np.asarray(released, dtype=np.float64)
    return intervals(r, reps.std(axis=0, ddof=1), reps.mean(axis=0) - r)


# -- count-of-counts: parametric bootstrap ---------------------------------------------------
@dataclass(frozen=True)
class SizeNoise:
    """One level's size measurement as published: its form (``histogram``: households of size
    exactly k; ``at_least``: of size ≥ k), mechanism and scale (σ or b) and one entry's variance."""

    form: str
    mechanism: str
    scale: float
    variance: float


@dataclass(frozen=True)
class CountNoise:
    """One level's household-count measurement (``group_counts`` stage) as published."""

    mechanism: str
    scale: float
    variance: float


# estimator(at_least {level: (n, K)}, measured [(values (N,), variances (N,)), …]) -> (N, K) sizes 1..K
CountOfCountsEstimator = Callable[[dict[int, np.ndarray], list[tuple[np.ndarray, np.ndarray]]], np.ndarray]


def simulate_at_least(rng: np.random.Generator, sizes: np.ndarray, noise: SizeNoise) -> tuple[np.ndarray, float]:
    """Households of size ≥ k (and the variance of entry 0, the count) of one simulated size
    measurement of the histograms ``sizes`` (n, K), as ``engine.privacy._session.NoisySizes``."""
    K = sizes.shape[1]
    at_least = np.cumsum(sizes[:, ::-1], axis=1)[:, ::-1].astype(np.float64)
    if noise.form == "histogram":
        noisy = sizes + simulate_noise(rng, noise.mechanism, noise.scale, sizes.shape)
        return np.cumsum(noisy[:, ::-1], axis=1)[:, ::-1], K * noise.variance
    if noise.form == "at_least":
        return at_least + simulate_noise(rng, noise.mechanism, noise.scale, at_least.shape), noise.variance
    raise ValueError(f"unknown size form {noise.form!r}")


def count_of_counts_bootstrap(hierarchy: Hierarchy, released: np.ndarray, sizes: Mapping[int, SizeNoise],
                              counts: Mapping[int, CountNoise], estimator: CountOfCountsEstimator,
                              rng: np.random.Generator, replicates: int = BOOTSTRAP_REPLICATES) -> Intervals:
    """Parametric bootstrap of the count-of-counts estimator (module docstring).

    ``released``: (N, K) released households of size 1..K per node (row = node id of
    ``hierarchy``), the plug-in truth; ``sizes``: {level: the size measurement's noise};
    ``counts``: {level: the household-count measurement's noise} (levels the ``group_counts``
    stage measured); ``estimator``: the pipeline's post-processing of those measurements. Each
    replicate simulates every measurement the run made, in the order the task makes them."""
    h = hierarchy
    H = np.asarray(released, dtype=np.int64)
    G = H.sum(axis=1).astype(np.float64)
    reps = np.empty((int(replicates), *H.shape))
    for r in range(int(replicates)):
        measured = []
        for lv, count in sorted(counts.items()):
            vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
            ids = h.level_range(lv)
            vals[ids] = G[ids] + simulate_noise(rng, count.mechanism, count.scale, ids.size)
            var[ids] = count.variance
            measured.append((vals, var))
        at_least = {}
        for lv, size in sorted(sizes.items()):
            ids = h.level_range(lv)
            at_least[lv], count_var = simulate_at_least(rng, H[ids], size)
            vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
            vals[ids], var[ids] = at_least[lv][:, 0], count_var
            measured.append((vals, var))
        reps[r] = estimator(at_least, measured)
    return bootstrap_summary(H, reps)


# -- synthesis marginals: Laplace approximation of the MAP posterior ---------------------------
@dataclass
class Recording:
    """What :func:`recording_measure` saw, by workload id: each measurement's noise scale σ and
    its noisy answer (the node's own measurements, already charged and stored)."""

    sigmas: dict[str, float] = field(default_factory=dict)
    noisy: dict[str, np.ndarray] = field(default_factory=dict)


def recording_measure(measure: MeasureFn) -> tuple[MeasureFn, Recording]:
    """``measure`` unchanged, recording each workload's σ and noisy answer: what
    :func:`fit_answer_sd` needs after the fit."""
    record = Recording()

    def recorded(w: Workload, rho: Fraction) -> tuple[np.ndarray, float]:
        noisy, sigma = measure(w, rho)
        record.sigmas[w.id] = float(sigma)
        record.noisy[w.id] = np.asarray(noisy, dtype=np.float64)
        return noisy, sigma

    return recorded, record


def total_variance(support: Support, q: np.ndarray, measured: Sequence[tuple[Workload, float]], total_sd: float) -> float:
    """Variance of the household total estimated from the posterior (``engine.synthesis._node.fit_total``, weighted
    least squares in one unknown with the answers A_w q held fixed): 1 / (Σ_w ‖a_w‖²/σ_w² +
    1/total_sd²); 0 when the total was taken as given (``total_sd`` = 0)."""
    if total_sd <= 0 or not measured:
        return 0.0
    den = 1.0 / total_sd**2
    for w, sigma in measured:
        a = support.answer(w, q)
        den += float(a @ a) / sigma**2
    return 1.0 / den


def by_pattern(support: Support, workloads: Sequence[Workload], q: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """The stacked incidence of ``workloads`` on the households' joint patterns
    (``engine.queries._queries.IncidenceCache.joint_patterns``) and ``q`` summed per pattern: every product
    below (A q, A diag(q) Aᵀ, B diag(q) Aᵀ) is the same on patterns, exactly, with far fewer
    columns than households."""
    M, pattern_of = support.cache.joint_patterns(list(workloads))
    return M, np.bincount(pattern_of, weights=np.asarray(q, dtype=np.float64), minlength=M.shape[1])


EB_BANDS = (0.1, 1.0, 10.0, 100.0)  # edges of the bands of λ (prior spread / noise) with one prior-error scale each


def band_scales(lam: np.ndarray, z: np.ndarray, edges: Sequence[float] = EB_BANDS) -> np.ndarray:
    """Per direction, the empirical-Bayes scale τ ≥ 0 of its band of ``lam``: the whitened
    residuals ``z`` have variance τλ + 1, so τ = Σ (z² − 1)λ / Σ λ² over the band (least
    squares), floored at 0; a band of λ ≈ 0 keeps τ = 1 (its residuals carry no information)."""
    band = np.searchsorted(np.asarray(edges), lam)
    tau = np.ones_like(lam)
    for b in np.unique(band):
        i = band == b
        den = float(np.sum(lam[i] ** 2))
        if den > 1e-12:
            tau[i] = max(float(np.sum((z[i] ** 2 - 1.0) * lam[i])) / den, 0.0)
    return tau


def posterior_count_sd(support: Support, q: np.ndarray, fitted: Sequence[tuple[Workload, float]], total: float,
                       prior_strength: float, rule: str = "map", total_var: float = 0.0,
                       residual: np.ndarray | None = None) -> list[np.ndarray]:
    """Standard deviation of the fitted count G·(A_w q)_c of every cell of every workload in
    ``fitted`` ((workload, σ in households) of every measurement the fit used, the count-of-counts
    size marginal included). Without ``residual``: the Laplace approximation of the MAP
    posterior; with it (the noisy answers over G minus the prior's answers, every cell of
    ``fitted`` in order): the MAP estimator's error with the prior's error scaled per band by
    empirical Bayes (module docstring). ``q``: the fitted posterior; ``total``: G;
    ``prior_strength``: α in households (as ``engine.synthesis._node.update_node`` passes it);
    ``total_var``: the variance of G. One array per workload, in ``fitted``'s order."""
    G = max(float(total), 1.0)
    sig = np.concatenate([np.full(w.n_cells(support.data.domain), float(s)) for w, s in fitted])
    A, q = by_pattern(support, [w for w, _ in fitted], q)
    a = A @ q
    s = (sig / G) ** 2
    if rule == "map":
        # a cell no household of positive weight falls in has J's row and column 0: it decouples
        # exactly (P = 0 there; in the eigenbasis a direction of λ = 0, which no band scale sees),
        # so the dense algebra runs on the other cells only (the completed pairs' impossible
        # combinations are a fifth of a state's cells)
        on = np.flatnonzero(A @ (q > 0).astype(np.float64) > 0)
        J = centred_gram(A[on], q, lower=True)  # both solvers below read the lower triangle only
        J /= max(float(prior_strength), 1e-6)
        s_on = s[on]
        P_diag = np.zeros_like(s)
        if residual is None:  # diag of J (J + S)⁻¹ S = S − S (J + S)⁻¹ S, through the Cholesky factor of J + S
            J[np.diag_indices_from(J)] += s_on
            L_inv = solve_triangular(cholesky(J, lower=True), np.eye(J.shape[0]), lower=True)
            P_diag[on] = s_on - s_on * s_on * np.einsum("ij,ij->j", L_inv, L_inv)
        else:  # in the eigenbasis of S^(-1/2) J S^(-1/2)
            r = np.sqrt(s_on)
            outer_in_place(J, r, r, np.divide)  # S^(-1/2) J S^(-1/2), in place
            # in single precision, with the GIL released (engine.synthesis._symmetric_eigen): an error
            # estimate needs no more, and a Dask worker's other thread fits another state meanwhile
            lam32, Vt = eigh_single(J)
            del J
            lam = np.maximum(lam32.astype(np.float64), 0.0)
            z = Vt @ (np.asarray(residual, dtype=np.float64)[on] / r).astype(np.float32)  # Vᵀ x, row i of Vt the i-th eigenvector
            tau = band_scales(lam, z.astype(np.float64))
            np.square(Vt, out=Vt)  # V ∘ V (transposed): the eigenvectors are not needed after the scales
            g = (tau * lam + lam * lam) / (1.0 + lam) ** 2
            P_diag[on] = s_on * (g.astype(np.float32) @ Vt).astype(np.float64)  # Σ_i g_i V_ci²
        var = G * G * np.maximum(P_diag, 0.0)
    else:  # IDE matches the noisy answers: the measurement's own noise
        var = G * G * s
    sd = np.sqrt(var + a * a * float(total_var))
    bounds = np.cumsum([0] + [w.n_cells(support.data.domain) for w, _ in fitted])
    return [sd[b:e] for b, e in zip(bounds[:-1], bounds[1:])]


DENSE_FITTED = 1 << 22  # entries of a fit's pattern incidence densified for the response's product: 32 MB


class SharedPrior:
    """The response products of fits that share one prior p on one support and answer the same
    ``queries`` (a state's PUMA fits: each starts from the state posterior). A MAP fit's
    posterior is p tilted by one factor per pattern of its fitted workloads
    (``engine.synthesis._map_update``: q_h = t_u p_h), so the masses of the (query pattern, fitted
    pattern) pairs are W_q = W_p diag(t), and the response's sparse product is
    B W_q = (B W_p) diag(t): B W_p is taken once per fitted workload list and prior, not once per fit.
    :func:`response_count_sd` checks the tilt and takes the direct products where q is not one.
    B W_p is kept in single precision: the fits' products with it, the largest step of a state's
    PUMA error estimates, are memory-bound, and an error estimate needs no more than single
    precision's seven digits (tests/engine/test_uncertainty.py bounds the difference)."""

    def __init__(self, support: Support, prior: np.ndarray, queries: Sequence[Workload]) -> None:
        p = np.asarray(prior, dtype=np.float64)
        self.support, self.prior, self.queries = support, p / p.sum(), tuple(queries)
        self._products: dict[tuple[Workload, ...], tuple[sp.csr_matrix, np.ndarray]] = {}

    def products(self, fitted: Sequence[Workload]) -> tuple[sp.csr_matrix, np.ndarray]:
        """(B W_p: query cells × fitted patterns, float32; the prior's mass per fitted pattern)."""
        key = tuple(fitted)
        if key not in self._products:
            cache = self.support.cache
            B, _ = cache.joint_patterns(list(self.queries))
            W = cache.pattern_pairs(list(self.queries), list(fitted)).matrix(self.prior)
            self._products[key] = ((B @ W).tocsr().astype(np.float32), np.asarray(W.sum(axis=0)).ravel())
        return self._products[key]

    def tilt(self, fitted: Sequence[Workload], q: np.ndarray) -> np.ndarray | None:
        """t with q_h = t_u p_h on every household h of fitted pattern u, or None where ``q`` is
        not such a tilt of the prior (to rounding)."""
        _, pattern_of = self.support.cache.joint_patterns(list(fitted))
        mass = self.products(fitted)[1]
        t = np.divide(np.bincount(pattern_of, weights=q, minlength=mass.size), mass, out=np.zeros_like(mass), where=mass > 0)
        return t if np.allclose(q, t[pattern_of] * self.prior, rtol=1e-9, atol=1e-15) else None


def response_count_sd(support: Support, q: np.ndarray, fitted: Sequence[tuple[Workload, float]], total: float,
                      prior_strength: float, queries: Sequence[Workload], shared: SharedPrior | None = None) -> list[np.ndarray]:
    """Standard deviation of the counts G·(B q) of other workloads ``queries`` that the fit's
    measurement noise alone moves them by (the linear response of the MAP fit, a sandwich):
    dq = Σ₀ Aᵀ (J + S)⁻¹ dỹ with Σ₀ = (diag q − q qᵀ)/α, so Cov(B q) = C (J+S)⁻¹ S (J+S)⁻¹ Cᵀ,
    C = B Σ₀ Aᵀ. A PUMA fit moves its state's released answers by this much on top of the state
    fit's error (a released state answer is the sum of its PUMAs'). ``shared``: the products of
    the fit's prior (:class:`SharedPrior`, the same ``queries``), when several fits share it.
    One array per query."""
    if not queries or not fitted:
        return [np.zeros(w.n_cells(support.data.domain)) for w in queries]
    if shared is not None and (shared.support is not support or shared.queries != tuple(queries)):
        raise ValueError("the shared prior's products are for another support or other queries")
    G = max(float(total), 1.0)
    alpha = max(float(prior_strength), 1e-6)
    q = np.asarray(q, dtype=np.float64)
    fitted_ws = [w for w, _ in fitted]
    A, _ = support.cache.joint_patterns(fitted_ws)
    # Aᵀ dense where it is small (a PUMA fits tens of cells): the sparse-dense product adds the
    # same products in the same order as the sparse one (B W's row i in stored order) and writes
    # straight into the dense result, without the sparse product's symbolic pass
    At = A.T.toarray() if A.shape[0] * A.shape[1] <= DENSE_FITTED else A.T.tocsr()
    if shared is not None and (t := shared.tilt(fitted_ws, q)) is not None:  # B W_q = (B W_p) diag(t): t onto Aᵀ's rows
        BW, mass = shared.products(fitted_ws)  # float32 (SharedPrior), and so are the factors it multiplies
        qa, b = t * mass, BW @ t.astype(np.float32)
        At = (At * t[:, None]).astype(np.float32) if isinstance(At, np.ndarray) else sp.csr_matrix(At.multiply(t[:, None]), dtype=np.float32)
    else:
        # the fitted and the query workloads grouped separately (each grouping cached with the support,
        # the same for every PUMA of a state): B diag(q) Aᵀ = M_B W M_Aᵀ with W[v, u] the mass of the
        # households of query pattern v and fitted pattern u, so a fit costs one pass over the households
        # and products on patterns instead of the joint patterns of both (nearly one per household)
        B, _ = support.cache.joint_patterns(list(queries))
        W = support.cache.pattern_pairs(list(queries), fitted_ws).matrix(q)
        BW, qa = B @ W, np.asarray(W.sum(axis=0)).ravel()
        b = B @ np.asarray(W.sum(axis=1)).ravel()
    s = (np.concatenate([np.full(w.n_cells(support.data.domain), float(sg)) for w, sg in fitted]) / G) ** 2
    a = A @ qa
    J = centred_gram(A, qa) / alpha
    product = BW @ At
    C = np.asarray(product if isinstance(product, np.ndarray) else product.toarray(), dtype=np.float64) - np.outer(b, a)
    C /= alpha
    J[np.diag_indices_from(J)] += s
    X = np.linalg.solve(J, C.T)  # (J + S)⁻¹ Cᵀ
    sd = G * np.sqrt(np.maximum(np.einsum("ij,i,ij->j", X, s, X), 0.0))
    bounds = np.cumsum([0] + [w.n_cells(support.data.domain) for w in queries])
    return [sd[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class FitErrors:
    """One node fit's error estimates (:func:`fit_answer_sd`): ``answer_sd`` {workload id: sd of
    every cell's fitted count at a fixed total}, ``total_var`` Var(total) and ``response_sd``
    {query id: :func:`response_count_sd`}."""

    answer_sd: dict[str, list[float]]
    total_var: float
    response_sd: dict[str, list[float]]


def prior_residual(support: Support, prior: np.ndarray, workloads: Sequence[Workload], noisy: Sequence[np.ndarray],
                   total: float) -> np.ndarray:
    """The noisy answers over G minus the prior's answers, every cell of ``workloads`` in order."""
    p = np.asarray(prior, dtype=np.float64)
    M, pp = by_pattern(support, workloads, p / max(p.sum(), 1e-300))
    y = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in noisy])
    residual: np.ndarray = y / max(float(total), 1.0) - M @ pp
    return residual


def fit_answer_sd(support: Support, q: np.ndarray, total: float, workloads: Sequence[Workload], record: Recording,
                  *, rule: str, prior_strength: float, total_sd: float = 0.0, size: tuple[np.ndarray, float] | None = None,
                  queries: Sequence[Workload] = (), prior: np.ndarray | None = None,
                  extra: Sequence[Measurement] = (), shared: SharedPrior | None = None) -> FitErrors:
    """The error estimates of one node's synthesis fit (``engine.synthesis._node.synthesize_node``):
    the measured ``workloads`` with their σ and noisy answers as recorded by
    :func:`recording_measure`, and the count-of-counts size marginal (``group:NP|``; ``size``:
    its histogram and σ) fitted with them when given (the released size histogram of a state or
    PUMA is this fit's, so its sd is returned too: sharper than the count-of-counts bootstrap's,
    which covers the size estimate the fit took in); ``prior_strength`` relative to the total, as
    in the release config; ``prior``: the fit's prior weights, whose error is then estimated from
    the residuals (:func:`posterior_count_sd`; without it, the Laplace form). The total's share
    a_c² Var(G) is left to the caller (:func:`combine_total`): a released state answer sums its
    PUMAs', whose totals were fitted separately. ``queries``: workloads on which the fit's
    response to its noise is kept (a PUMA fit's on its state's workloads). Empty when nothing
    was measured. ``extra``: further measurements the fit took in (a state's PUMA sums,
    :func:`engine.synthesis._level_consistency.children_sum`), in its precision but not in the result.
    ``shared``: the response's products of ``prior`` on ``queries`` (:class:`SharedPrior`), kept by
    the caller across the fits that share them."""
    measured = [(w, float(record.sigmas[w.id])) for w in workloads if w.id in record.sigmas]
    if not measured:
        return FitErrors({}, 0.0, {})
    # the fit's own order (engine.synthesis._node.synthesize_node: the size marginal and the other
    # measurements made elsewhere, then the node's), so its joint patterns are the cached ones
    fitted = [(m.workload, float(m.sigma)) for m in extra] + measured
    noisy = [m.noisy_answer for m in extra] + [record.noisy[w.id] for w, _ in measured]
    reported = [w for w, _ in measured]
    if size is not None:
        size_w = Workload("group", (support.data.domain.size_attribute,), ())
        fitted.insert(0, (size_w, float(size[1])))
        noisy.insert(0, np.asarray(size[0], dtype=np.float64))
        reported.append(size_w)
    alpha = max(prior_strength * float(total), 1e-6)
    residual = None
    if rule == "map" and prior is not None:
        residual = prior_residual(support, prior, [w for w, _ in fitted], noisy, total)
    sds = posterior_count_sd(support, q, fitted, total, alpha, rule, residual=residual)
    response = response_count_sd(support, q, fitted, total, alpha, queries, shared) if rule == "map" else []
    sd_of = {w.id: sd for (w, _), sd in zip(fitted, sds)}
    return FitErrors({w.id: sd_of[w.id].tolist() for w in reported}, total_variance(support, q, measured, total_sd),
                     {w.id: sd.tolist() for w, sd in zip(queries, response)})


def combine_total(released: np.ndarray, households: ArrayLike, fit_sd: np.ndarray, total_var: ArrayLike) -> np.ndarray:
    """The sd of released counts G·a_c: the fit's sd at a fixed total and the total's variance,
    G² Var(a_c) + a_c² Var(G), with a_c the released share ``released / households``.
    ``households`` and ``total_var`` broadcast against ``released`` (several nodes' rows at once)."""
    share = np.asarray(released, dtype=np.float64) / np.maximum(np.asarray(households, dtype=np.float64), 1.0)
    return np.sqrt(np.asarray(fit_sd, dtype=np.float64) ** 2 + share * share * np.asarray(total_var, dtype=np.float64))
