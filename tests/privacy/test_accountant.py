import math
from fractions import Fraction

import numpy as np
import opendp.prelude as dp
import pytest

from engine.privacy._accountant import (
    as_fraction,
    eps_delta_to_rho,
    epsilon_for_pure_rho,
    exponential_mechanism_rho,
    gaussian_rho,
    parallel,
    permute_and_flip_rho,
    pure_dp_rho,
    rho_to_eps,
    sequential,
    sigma_for_rho,
)

dp.enable_features("contrib")


def test_gaussian_rho_known_values():
    assert gaussian_rho(1, 1) == Fraction(1, 2)
    assert gaussian_rho(2, 4) == Fraction(1, 8)
    assert gaussian_rho(3, Fraction(1, 2)) == 18
    assert isinstance(gaussian_rho(1.0, 2.0), Fraction)
    assert gaussian_rho(0.5, 0.25) == 2
    with pytest.raises(ValueError):
        gaussian_rho(1, 0)


@pytest.mark.parametrize("l2", [1.0, math.sqrt(2), math.sqrt(3), 4.0, 7.0])
@pytest.mark.parametrize("rho", [Fraction(1, 3), Fraction(1, 1000), 0.02, 2.5])
def test_sigma_for_rho_exact_and_tight(l2, rho):
    s = sigma_for_rho(l2, rho)
    r = as_fraction(rho)
    assert gaussian_rho(l2, s) <= r  # never more than planned, exactly
    assert s == pytest.approx(l2 / math.sqrt(2 * float(r)), rel=1e-14)  # and essentially tight


def test_sigma_for_rho_matches_opendp_map():
    for l2, rho in [(1.0, 0.5), (math.sqrt(2), 0.01), (4.0, 1 / 7)]:
        s = sigma_for_rho(l2, rho)
        m = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="f64"), scale=s)
        assert m.map(l2) == pytest.approx(rho, rel=1e-12)


def test_pure_and_selection_costs():
    assert pure_dp_rho(1) == Fraction(1, 2)
    assert pure_dp_rho(Fraction(1, 10)) == Fraction(1, 200)
    assert exponential_mechanism_rho(2) == Fraction(1, 2)
    assert exponential_mechanism_rho(Fraction(1, 2)) == Fraction(1, 32)
    # permute-and-flip is charged with the safe pure-DP bound, not the bounded-range one
    assert permute_and_flip_rho(1) == pure_dp_rho(1) == 4 * exponential_mechanism_rho(1)
    e = epsilon_for_pure_rho(Fraction(1, 3))
    assert pure_dp_rho(e) <= Fraction(1, 3)
    assert e == pytest.approx(math.sqrt(2 / 3), rel=1e-15)


def test_exponential_mechanism_rho_matches_opendp_gumbel():
    # OpenDP's Gumbel report-noisy-max at scale 2Δ/ε is charged ε²/8 in zCDP
    for eps in [0.1, 1.0, 2.0]:
        m = dp.m.make_noisy_max(
            dp.vector_domain(dp.atom_domain(T=float, nan=False)),
            dp.linf_distance(T=float),
            dp.zero_concentrated_divergence(),
            scale=2.0 / eps,
        )
        assert m.map(1.0) == pytest.approx(float(exponential_mechanism_rho(eps)), rel=1e-12)


def test_composition_exact():
    parts = [Fraction(1, 3)] * 3
    assert sequential(parts) == 1
    assert sequential([0.1] * 10) == 1  # floats read as decimals: exact
    assert sum([0.1] * 10) != 1.0  # (whereas float arithmetic is not)
    assert parallel([Fraction(1, 3), Fraction(1, 2), Fraction(1, 5)]) == Fraction(1, 2)
    assert parallel([]) == 0 and sequential([]) == 0


def test_rho_to_eps_simple_known_values():
    assert rho_to_eps(0.5, 1e-5, "simple") == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e5)), rel=1e-15)
    assert rho_to_eps(0, 1e-5, "simple") == 0 and rho_to_eps(0, 1e-5, "cks") == 0


def test_rho_to_eps_cks_matches_opendp():
    # OpenDP's zCDP -> approxDP conversion implements the same CKS20 bound
    for rho in [0.005, 0.125, 0.5, 2.0]:
        sigma = 1.0 / math.sqrt(2 * rho)
        m = dp.m.make_gaussian(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=sigma)
        curve = dp.c.make_zCDP_to_approxDP(m).map(1.0)
        for delta in [1e-5, 1e-10]:
            assert rho_to_eps(rho, delta, "cks") == pytest.approx(curve.epsilon(delta), rel=1e-8)


def test_rho_to_eps_cks_known_value():
    # value of CKS20 Cor. 13 at ρ=1/2, δ=1e-5, reproduced independently by a dense α grid
    alpha = 1 + np.exp(np.linspace(-8, 8, 400001))
    L = math.log(1e5)
    ref = np.min(alpha * 0.5 + (L + (alpha - 1) * np.log1p(-1 / alpha) - np.log(alpha)) / (alpha - 1))
    assert rho_to_eps(0.5, 1e-5, "cks") == pytest.approx(ref, abs=1e-9)
    assert rho_to_eps(0.5, 1e-5, "cks") == pytest.approx(4.7283869849, abs=1e-8)


@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10, 1e-15])
def test_rho_to_eps_monotone_and_cks_below_simple(delta):
    rhos = np.geomspace(1e-6, 50, 60)
    cks = np.array([rho_to_eps(r, delta, "cks") for r in rhos])
    simple = np.array([rho_to_eps(r, delta, "simple") for r in rhos])
    assert np.all(np.diff(simple) > 0)
    assert np.all(np.diff(cks) >= 0)
    pos = cks > 0  # for tiny ρ and large δ, ε = 0 is genuinely valid (TV distance < δ)
    assert np.all(np.diff(cks[pos]) > 0) and pos[rhos >= 1e-3].all()
    assert np.all(cks <= simple)
    # smaller delta costs more epsilon
    assert rho_to_eps(0.3, delta / 10, "cks") > rho_to_eps(0.3, delta, "cks")


@pytest.mark.parametrize("method", ["cks", "simple"])
@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0, 10.0])
@pytest.mark.parametrize("delta", [1e-6, 1e-10])
def test_eps_delta_to_rho_round_trip(method, eps, delta):
    rho = eps_delta_to_rho(eps, delta, method)
    back = rho_to_eps(rho, delta, method)
    assert back <= eps  # never more than asked
    assert back == pytest.approx(eps, rel=1e-9)
    assert rho_to_eps(rho * (1 + 1e-6), delta, method) > eps  # and the largest such rho
    if method == "cks":
        assert rho >= eps_delta_to_rho(eps, delta, "simple")


def test_rho_to_eps_rejects_bad_input():
    with pytest.raises(ValueError):
        rho_to_eps(-1, 1e-5)
    with pytest.raises(ValueError):
        rho_to_eps(1, 0)
    with pytest.raises(ValueError):
        rho_to_eps(1, 1e-5, "rdp")
    with pytest.raises(ValueError):
        eps_delta_to_rho(0, 1e-5)
