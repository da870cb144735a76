"""Error estimates (engine.synthesis._uncertainty): the noise simulator against the mechanisms' variances,
the parametric bootstrap against an analytic linear case and by coverage on simulated data with
the pipeline's own count-of-counts estimator, and the Laplace approximation of the MAP
posterior against a brute-force Hessian of the MAP objective."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from scipy.linalg import null_space

from engine.count_of_counts._api import fit_histograms, fit_household_counts
from engine.count_of_counts._geography import geography_hierarchy
from engine.privacy._measurements import MeasurementRecord as Measurement
from engine.queries._measurement import Measurement as Noisy
from engine.queries._queries import Workload, answer
from engine.queries._support import Support
from engine.synthesis._map_update import map_fit
from engine.synthesis._uncertainty import (
    EB_BANDS,
    Z90,
    CountNoise,
    Recording,
    SharedPrior,
    SizeNoise,
    band_scales,
    bootstrap_summary,
    combine_total,
    count_of_counts_bootstrap,
    fit_answer_sd,
    intervals,
    posterior_count_sd,
    prior_residual,
    response_count_sd,
    simulate_at_least,
    simulate_noise,
)
from tests.engine._support_testdata import random_data, small_domain

LEAVES = np.array([[10, 100], [10, 200], [20, 100], [20, 200], [20, 300]])


def _variance(mechanism: str, scale: float) -> float:
    m = Measurement("k", "w", "s", "puma", "n", np.zeros(1), mechanism, scale, 1.0, 0, None, "", 0.0)  # type: ignore[arg-type]
    return m.variance


@pytest.mark.parametrize(("mechanism", "scale"), [("discrete_laplace", 3.0), ("discrete_gaussian", 5.0)])
def test_simulated_noise_has_the_mechanisms_variance(mechanism, scale):
    x = simulate_noise(np.random.default_rng(0), mechanism, scale, 200_000)
    expected = _variance(mechanism, scale) + (1 / 12 if mechanism == "discrete_gaussian" else 0.0)  # rounding
    assert np.all(x == np.rint(x)) and abs(x.mean()) < 0.05
    assert x.var() == pytest.approx(expected, rel=0.02)
    with pytest.raises(ValueError, match="no additive noise"):
        simulate_noise(np.random.default_rng(0), "exponential_mechanism", 1.0, 3)


def test_intervals_and_bootstrap_summary():
    iv = intervals([10.0, 1.0], [2.0, 2.0], bias=[1.0, 0.0])
    assert iv.lo90 == pytest.approx([9 - Z90 * 2, 0.0]) and iv.hi90 == pytest.approx([9 + Z90 * 2, 1 + Z90 * 2])
    reps = np.array([[1.0, 4.0], [3.0, 4.0], [5.0, 4.0]])
    s = bootstrap_summary([2.0, 4.0], reps)
    assert s.se == pytest.approx([2.0, 0.0]) and s.bias == pytest.approx([1.0, 0.0])
    with pytest.raises(ValueError, match="two replicates"):
        bootstrap_summary([1.0], [[1.0]])


def _released(h, seed=0, scale=60):
    """Exact (N, K) size histograms of a small hierarchy: households of size 1..4 per PUMA."""
    rng = np.random.default_rng(seed)
    leaf = rng.poisson(scale * np.array([3.0, 4.0, 2.0, 1.0]), size=(len(LEAVES), 4))
    H = np.zeros((h.n_nodes, 4), dtype=np.int64)
    H[h.leaves()] = leaf
    return h.aggregate_up(H)


def test_bootstrap_of_a_linear_estimator_matches_its_analytic_standard_error():
    """Estimator: the leaves' noisy histograms (differences of the at-least counts) summed up the
    hierarchy. Its standard error is σ√(leaves below the node), its bias 0."""
    h = geography_hierarchy(LEAVES)
    H = _released(h)
    sigma = 4.0

    def linear(at_least, measured):
        leaf = at_least[2] - np.append(at_least[2][:, 1:], np.zeros((len(LEAVES), 1)), axis=1)
        full = np.zeros(H.shape)
        full[h.leaves()] = leaf
        return h.aggregate_up(full)

    sizes = {lv: SizeNoise("histogram", "discrete_gaussian", sigma, sigma**2) for lv in range(3)}
    iv = count_of_counts_bootstrap(h, H, sizes, {}, linear, np.random.default_rng(1), replicates=800)
    n_leaves = h.aggregate_up(h.is_leaf().astype(np.int64))
    analytic = np.sqrt(sigma**2 + 1 / 12) * np.sqrt(n_leaves)[:, None] * np.ones(H.shape)
    assert iv.se == pytest.approx(analytic, rel=0.12)
    assert np.all(np.abs(iv.bias) < 4 * analytic / np.sqrt(800))
    # the interval is centred on the released value minus the bias
    assert (iv.lo90 + iv.hi90) / 2 == pytest.approx(np.maximum(H - iv.bias - Z90 * iv.se, 0) / 2 + (H - iv.bias + Z90 * iv.se) / 2)


def _pipeline_estimator(h, sizes, K=4, consistency="weighted"):
    """The count-of-counts task's post-processing (tasks.count_of_counts) as the bootstrap calls it."""
    variances = [sizes[lv].variance * K for lv in range(3)]  # histogram form: G's entry sums K entries
    return lambda at_least, measured: fit_histograms(h, at_least, fit_household_counts(h, measured)[0], variances, K, consistency)[:, 1:]


def test_bootstrap_intervals_of_the_count_of_counts_estimator_cover_the_truth():
    """Known truth, noise of known σ: the pipeline's estimator on one noisy draw is the 'release';
    the bootstrap from it (noise parameters only) must cover the truth about 90 % of the time."""
    h = geography_hierarchy(LEAVES)
    truth = _released(h, seed=5)
    sigma = 6.0
    sizes = {lv: SizeNoise("histogram", "discrete_gaussian", sigma, sigma**2) for lv in range(3)}
    counts = {2: CountNoise("discrete_gaussian", 3.0, 9.0)}
    estimator = _pipeline_estimator(h, sizes)
    rng = np.random.default_rng(11)
    inside, n = 0, 0
    for _ in range(16):
        # one run: the measurements drawn from the truth, the estimator's output released
        measured, at_least = [], {}
        ids = h.level_range(2)
        vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
        vals[ids], var[ids] = truth.sum(axis=1)[ids] + simulate_noise(rng, "discrete_gaussian", 3.0, ids.size), 9.0
        measured.append((vals, var))
        for lv in range(3):
            ids = h.level_range(lv)
            at_least[lv], cv = simulate_at_least(rng, truth[ids], sizes[lv])
            vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
            vals[ids], var[ids] = at_least[lv][:, 0], cv
            measured.append((vals, var))
        released = estimator(at_least, measured)
        iv = count_of_counts_bootstrap(h, released, sizes, counts, estimator, rng, replicates=40)
        inside += int(((iv.lo90 <= truth) & (truth <= iv.hi90)).sum())
        n += truth.size
    print(f'coverage {inside / n:.3f} of {n} cells')
    assert 0.82 <= inside / n <= 0.98, inside / n


def test_the_bootstrap_takes_no_confidential_input():
    """Its inputs are the released histograms, the published noise parameters, the estimator and
    a seed; the same inputs give the same intervals."""
    params = set(inspect.signature(count_of_counts_bootstrap).parameters)
    assert params == {"hierarchy", "released", "sizes", "counts", "estimator", "rng", "replicates"}
    h = geography_hierarchy(LEAVES)
    H = _released(h)
    sizes = {lv: SizeNoise("at_least", "discrete_laplace", 2.0, _variance("discrete_laplace", 2.0)) for lv in range(3)}
    est = _pipeline_estimator(h, sizes)
    a = count_of_counts_bootstrap(h, H, sizes, {}, est, np.random.default_rng(3), replicates=5)
    b = count_of_counts_bootstrap(h, H, sizes, {}, est, np.random.default_rng(3), replicates=5)
    assert np.array_equal(a.se, b.se) and np.array_equal(a.lo90, b.lo90)


# -- Laplace approximation of the MAP posterior -------------------------------------------------
DOMAIN = small_domain(M=3)
WORKLOADS = [Workload("group", ("NP",), ()), Workload("group", ("TEN", "R18"), ()), Workload("person", (), ("SEX",))]


def _fit(alpha_rel=0.3, sigma=4.0, seed=0):
    public = random_data(DOMAIN, 15, seed=41)
    private = random_data(DOMAIN, 80, seed=42 + seed)
    support = Support.from_data(public)
    G = float(private.n_households)
    rng = np.random.default_rng(seed)
    ms = [Noisy(w, answer(private, w) + rng.normal(0, sigma, w.n_cells(DOMAIN)), sigma) for w in WORKLOADS]
    q = map_fit(support, support.weights, ms, G, prior_strength=alpha_rel * G).weights
    return support, q, G, alpha_rel * G, sigma


def test_laplace_sd_equals_the_inverse_hessian_of_the_map_objective():
    """Brute force: the Hessian of α KL(q‖p) + Σ ‖G A q − ỹ‖²/(2σ²) on the simplex's tangent
    space, inverted; the fitted counts' covariance G² A H⁻¹ Aᵀ."""
    support, q, G, alpha, sigma = _fit()
    A = np.vstack([support.incidence(w).toarray() for w in WORKLOADS])
    live = q > 1e-12
    A, qq = A[:, live], q[live]
    H = alpha * np.diag(1 / qq) + G * G * A.T @ A / sigma**2
    U = null_space(np.ones((1, qq.size)))  # the simplex's tangent directions
    cov_q = U @ np.linalg.inv(U.T @ H @ U) @ U.T
    brute = np.sqrt(np.diag(G * G * A @ cov_q @ A.T))
    sd = np.concatenate(posterior_count_sd(support, q, [(w, sigma) for w in WORKLOADS], G, alpha))
    assert sd == pytest.approx(brute, rel=1e-5, abs=1e-6)


def test_laplace_sd_limits():
    """A prior of no weight leaves the measurement's σ on a partition's cells (the fit matches the
    noisy answers) less the total's direction (at a fixed total the n cells sum to G: σ²(1 − 1/n));
    a dominating prior leaves almost no posterior spread."""
    support, q, G, _, sigma = _fit()
    fitted = [(WORKLOADS[0], sigma)]
    weak = posterior_count_sd(support, q, fitted, G, 1e-6)[0]
    strong = posterior_count_sd(support, q, fitted, G, 1e9)[0]
    assert weak == pytest.approx(np.full(3, sigma * np.sqrt(1 - 1 / 3)), rel=1e-3)
    assert np.all(strong < 0.01 * sigma)
    assert posterior_count_sd(support, q, fitted, G, 1.0, rule="ide")[0] == pytest.approx(np.full(3, sigma))
    with_total = posterior_count_sd(support, q, fitted, G, 1e-6, total_var=sigma**2 * 3)[0]  # the sum's own variance, 3σ²
    assert np.sum(with_total**2) > np.sum(weak**2)


def test_fit_answer_sd_and_the_total():
    support, q, G, _, sigma = _fit()
    record = Recording({w.id: sigma for w in WORKLOADS}, {w.id: np.zeros(w.n_cells(DOMAIN)) for w in WORKLOADS})
    e = fit_answer_sd(support, q, G, WORKLOADS, record, rule="map", prior_strength=0.3, total_sd=5.0,
                      size=(np.zeros(3), 7.0), queries=[Workload("group", ("R18",), ())])
    assert set(e.response_sd) == {"group:R18|"} and len(e.response_sd["group:R18|"]) == 2
    assert set(e.answer_sd) == {w.id for w in WORKLOADS}  # the size marginal's id is group:NP|, also measured here
    direct = posterior_count_sd(support, q, [(w, sigma) for w in WORKLOADS] + [(WORKLOADS[0], 7.0)], G, 0.3 * G)
    assert e.answer_sd[WORKLOADS[1].id] == pytest.approx(direct[1])
    assert 0 < e.total_var < 25.0  # the workloads add information to the count's own
    assert fit_answer_sd(support, q, G, WORKLOADS, record, rule="map", prior_strength=0.3).total_var == 0.0  # total given
    empty = fit_answer_sd(support, q, G, WORKLOADS, Recording(), rule="map", prior_strength=0.3)
    assert (empty.answer_sd, empty.total_var, empty.response_sd) == ({}, 0.0, {})
    # with the prior given, the same call estimates the prior's error from the residuals: other sds
    laplace = fit_answer_sd(support, q, G, WORKLOADS, record, rule="map", prior_strength=0.3)
    with_prior = fit_answer_sd(support, q, G, WORKLOADS, record, rule="map", prior_strength=0.3, prior=support.weights)
    assert set(with_prior.answer_sd) == set(laplace.answer_sd)
    assert all(np.all(np.asarray(v) >= 0) for v in with_prior.answer_sd.values())
    assert any(not np.allclose(with_prior.answer_sd[k], laplace.answer_sd[k]) for k in laplace.answer_sd)
    assert combine_total(np.array([50.0, 0.0]), 100.0, np.array([3.0, 1.0]), 16.0) == pytest.approx([np.sqrt(9 + 4), 1.0])


@pytest.mark.parametrize("empty_cells", [False, True])
def test_eb_sd_equals_the_linearised_estimator_error(empty_cells):
    """Brute force, dense: the MAP answers â = S W a_p + J W ỹ (W = (J + S)⁻¹) err by
    S W (a_p − a) + J W (ỹ − a), so with prior error covariance T their covariance is
    S W T W S + J W S W J; T = S^½ V diag(τλ) Vᵀ S^½ with V, λ the eigenvectors and values of
    S^(-½) J S^(-½) and τ the band scales of the whitened residual. With ``empty_cells`` the
    posterior has no weight on one tenure's households: cells only they fall in have J's row 0
    (set aside by posterior_count_sd, kept here)."""
    support, q, G, alpha, sigma = _fit()
    if empty_cells:
        q = np.where(support.data.group[:, DOMAIN.group_index("TEN")] == 0, 0.0, q)
        q /= q.sum()
        assert np.any(support.answer(WORKLOADS[1], q) == 0)
    A = np.vstack([support.incidence(w).toarray() for w in WORKLOADS])
    a = A @ q
    J = (A * q[None, :]) @ A.T / alpha - np.outer(a, a) / alpha
    s = np.full(a.size, (sigma / G) ** 2)
    S, R = np.diag(s), np.diag(np.sqrt(s))
    W = np.linalg.inv(J + S)
    lam, V = np.linalg.eigh(J / np.outer(np.sqrt(s), np.sqrt(s)))
    lam = np.maximum(lam, 0.0)
    for seed in range(3):
        residual = np.random.default_rng(seed).normal(0, 3 * sigma / G, a.size)
        tau = band_scales(lam, V.T @ (residual / np.sqrt(s)))
        T = R @ V @ np.diag(tau * lam) @ V.T @ R
        brute = G * np.sqrt(np.diag(S @ W @ T @ W @ S + J @ W @ S @ W @ J))
        got = np.concatenate(posterior_count_sd(support, q, [(w, sigma) for w in WORKLOADS], G, alpha, residual=residual))
        # the eigendecomposition is single precision (engine.synthesis._symmetric_eigen): its rounding, scaled by
        # the largest eigenvalue over the small ones' gaps, reaches a few 1e-5 of an sd
        assert got == pytest.approx(brute, rel=2e-4, abs=1e-4)
    # τ = 1 everywhere is the Laplace form: diag of S W J W S + J W S W J = J W S
    laplace = np.concatenate(posterior_count_sd(support, q, [(w, sigma) for w in WORKLOADS], G, alpha))
    assert laplace == pytest.approx(G * np.sqrt(np.maximum(np.diag(S @ W @ J @ W @ S + J @ W @ S @ W @ J), 0)), rel=1e-6, abs=1e-6)


def test_band_scales_recover_the_prior_error_scale_per_band():
    """Statistical: whitened residuals of variance τ_b λ + 1 give back each band's τ_b."""
    rng = np.random.default_rng(5)
    ranges = [(0.2, 0.9), (2, 9), (20, 90), (200, 900)]
    assert list(np.searchsorted(EB_BANDS, [hi for _, hi in ranges])) == [1, 2, 3, 4]  # one band each
    lam = np.concatenate([rng.uniform(lo, hi, 4000) for lo, hi in ranges])
    true = np.repeat([3.0, 0.5, 0.0, 2.0], 4000)
    z = rng.normal(0, np.sqrt(true * lam + 1))
    got = band_scales(lam, z)
    for b, t in enumerate([3.0, 0.5, 0.0, 2.0]):
        assert got[b * 4000] == pytest.approx(t, abs=0.25 if b == 0 else 0.1)
    assert np.all(band_scales(np.zeros(5), np.ones(5)) == 1.0)  # no information: τ = 1


EB_WORKLOADS = [*WORKLOADS, Workload("group", ("TEN", "NP"), ()), Workload("person", (), ("AGE", "RAC")),
                Workload("person", (), ("SEX", "AGE"))]


def _eb_node(rng, tilt: float, n: int = 400, sigma: float = 15.0, alpha_rel: float = 0.3):
    """A private node resampled from the public support (``tilt`` > 0: households of the first
    tenure over-drawn, a prior biased in proportion to the cells), measured, MAP-fitted; returns
    the fitted counts, the truth, and the node's sd with the estimated and with the Laplace error model."""
    public = random_data(DOMAIN, 300, seed=41)
    support = Support.from_data(public)
    w = np.exp(tilt * (public.group[:, 0] == 0))
    private = public.take(rng.choice(public.n_households, n, p=w / w.sum()))
    G, alpha = float(n), alpha_rel * n
    truth = [answer(private, wl).astype(float) for wl in EB_WORKLOADS]
    noisy = [t + rng.normal(0, sigma, t.size) for t in truth]
    q = map_fit(support, support.weights, [Noisy(wl, y, sigma) for wl, y in zip(EB_WORKLOADS, noisy)], G, prior_strength=alpha).weights
    fitted = [(wl, sigma) for wl in EB_WORKLOADS]
    residual = prior_residual(support, support.weights, EB_WORKLOADS, noisy, G)
    est = np.concatenate(posterior_count_sd(support, q, fitted, G, alpha, residual=residual))
    lap = np.concatenate(posterior_count_sd(support, q, fitted, G, alpha))
    return G * np.concatenate([support.answer(wl, q) for wl in EB_WORKLOADS]), np.concatenate(truth), est, lap


@pytest.mark.parametrize("tilt", [0.0, 1.0])
def test_prior_error_intervals_cover_90_percent(tilt):
    """Statistical: nodes drawn from the prior itself (its true error is a sample's, τ = α/n = 0.3
    of what α says) and from a tilted prior (further off than α says): the intervals with the
    estimated error model cover about 90 % of the true counts in both; the Laplace form's, which
    takes the prior as far off as α says, are too wide in the first and too narrow in the second."""
    rng = np.random.default_rng(7 + int(tilt))
    inside_est = inside_lap = cells = 0
    for _ in range(30):
        fit, truth, est, lap = _eb_node(rng, tilt)
        inside_est += int(np.sum(np.abs(fit - truth) <= Z90 * est))
        inside_lap += int(np.sum(np.abs(fit - truth) <= Z90 * lap))
        cells += truth.size
    assert 0.85 <= inside_est / cells <= 0.95, (inside_est / cells, inside_lap / cells)
    if tilt == 0.0:  # a prior closer than α says: the Laplace form's intervals are too wide
        assert inside_lap > inside_est
    else:  # further off than α says: too narrow
        assert inside_lap < inside_est


def test_response_sd_equals_the_finite_difference_jacobian_of_the_map_fit():
    """How much the fit's noise moves other workloads' counts: the sandwich of
    :func:`response_count_sd` against the MAP fit's Jacobian in the noisy answers, by finite
    differences of ``map_fit`` itself."""
    public = random_data(DOMAIN, 15, seed=41)
    private = random_data(DOMAIN, 80, seed=42)
    support = Support.from_data(public)
    G, sigma, alpha = float(private.n_households), 4.0, 0.3 * private.n_households
    fitted = WORKLOADS[:2]
    queries = [Workload("group", ("TEN",), ()), Workload("person", (), ("AGE",))]
    y = [answer(private, w).astype(float) for w in fitted]

    def fit(ys):
        q = map_fit(support, support.weights, [Noisy(w, v, sigma) for w, v in zip(fitted, ys)], G,
                          prior_strength=alpha, tol=1e-14).weights
        return G * np.concatenate([support.answer(w, q) for w in queries])

    q0 = fit(y)
    q = map_fit(support, support.weights, [Noisy(w, v, sigma) for w, v in zip(fitted, y)], G,
                      prior_strength=alpha, tol=1e-14).weights
    jac, h = [], 1e-3
    for i, v in enumerate(y):
        for c in range(v.size):
            ys = [u.copy() for u in y]
            ys[i][c] += h
            jac.append((fit(ys) - q0) / h)
    brute = sigma * np.sqrt(np.sum(np.array(jac) ** 2, axis=0))
    got = np.concatenate(response_count_sd(support, q, [(w, sigma) for w in fitted], G, alpha, queries))
    assert got == pytest.approx(brute, rel=2e-2, abs=1e-3)
    assert [a.size for a in response_count_sd(support, q, [], G, alpha, queries)] == [3, 4]


def test_response_sd_is_the_same_with_the_fitted_incidence_dense_or_sparse(monkeypatch):
    """The product (B W) Aᵀ with Aᵀ densified (a small fit's) adds the same products in the same
    order as the sparse product: the estimates agree bit for bit."""
    import engine.synthesis._uncertainty as uncertainty
    public = random_data(DOMAIN, 40, seed=43)
    support = Support.from_data(public)
    q = np.random.default_rng(44).random(public.n_households)
    q /= q.sum()
    fitted = [(w, 3.0) for w in WORKLOADS[:2]]
    queries = [Workload("group", ("TEN",), ()), Workload("person", (), ("AGE",)), *WORKLOADS[2:]]
    dense = response_count_sd(support, q, fitted, 40.0, 12.0, queries)
    monkeypatch.setattr(uncertainty, "DENSE_FITTED", 0)
    sparse = response_count_sd(support, q, fitted, 40.0, 12.0, queries)
    for d, s in zip(dense, sparse):
        np.testing.assert_array_equal(d, s)
    assert any(np.any(d > 0) for d in dense)


def test_response_sd_from_a_shared_prior_equals_the_direct_products(monkeypatch):
    """Fits that share a prior (a state's PUMAs) take the response's sparse product of the prior
    once (:class:`SharedPrior`): for MAP fits from that prior, tilts of it per fitted pattern, the
    estimates equal the direct products' to single precision (the shared products are float32),
    with the fitted incidence dense or sparse; a posterior that is not such a tilt takes the direct
    products, with the same result as without the shared products."""
    import engine.synthesis._uncertainty as uncertainty
    public = random_data(DOMAIN, 60, seed=45)
    private = random_data(DOMAIN, 90, seed=46)
    support = Support.from_data(public)
    rng = np.random.default_rng(47)
    prior = rng.random(public.n_households) + 0.05
    G, sigma, alpha = float(private.n_households), 3.0, 0.2 * private.n_households
    queries = [Workload("group", ("TEN",), ()), Workload("person", (), ("AGE",)), *WORKLOADS[2:]]
    shared = SharedPrior(support, prior, queries)
    for fitted_ws in (WORKLOADS[:2], WORKLOADS[1:3]):
        measured = [Noisy(w, answer(private, w) + rng.normal(0, sigma, w.n_cells(DOMAIN)), sigma) for w in fitted_ws]
        q = map_fit(support, prior, measured, G, prior_strength=alpha).weights
        fitted = [(w, sigma) for w in fitted_ws]
        assert shared.tilt(fitted_ws, q) is not None
        direct = response_count_sd(support, q, fitted, G, alpha, queries)
        via = response_count_sd(support, q, fitted, G, alpha, queries, shared)
        for d, v in zip(direct, via, strict=True):
            np.testing.assert_allclose(v, d, rtol=1e-6, atol=1e-9)
            assert v.dtype == np.float64
        with monkeypatch.context() as m:  # the fitted incidence kept sparse (a large fit's)
            m.setattr(uncertainty, "DENSE_FITTED", 0)
            for d, v in zip(direct, response_count_sd(support, q, fitted, G, alpha, queries, shared), strict=True):
                np.testing.assert_allclose(v, d, rtol=1e-6, atol=1e-9)
        assert any(np.any(d > 0) for d in direct)
        other = rng.random(public.n_households)
        other /= other.sum()  # not a tilt of the prior per fitted pattern
        assert shared.tilt(fitted_ws, other) is None
        for d, v in zip(response_count_sd(support, other, fitted, G, alpha, queries),
                        response_count_sd(support, other, fitted, G, alpha, queries, shared), strict=True):
            np.testing.assert_array_equal(v, d)
    with pytest.raises(ValueError, match="other queries"):
        response_count_sd(support, q, fitted, G, alpha, queries[:1], shared)
