"""Two-stage sampling into HierarchicalData."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.data._hierarchical_data import HierarchicalData
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import MixtureLayout, ProductMixture
from engine.hgem.sampling import sample_households


def test_sampled_data_is_valid_and_reproducible(domain):
    G = HGEMGenerator(domain, batch_size=8, z_dim=4, hidden=(8,), seed=1, device="cpu")
    mix = G()
    a = sample_households(mix, 500, seed=3, geo=(36,))
    b = sample_households(mix, 500, seed=3, geo=(36,))
    c = sample_households(mix, 500, seed=4, geo=(36,))
    assert isinstance(a, HierarchicalData) and a.n_households == 500
    # re-run the constructor checks explicitly (sizes 1..M, NP == size, codes in range)
    HierarchicalData(a.domain, a.geo, a.group, a.person, a.person_offsets)
    assert a.equals(b) and not a.equals(c)
    assert (a.geo == 36).all()
    assert set(np.unique(a.sizes)) <= set(range(1, domain.max_size + 1))


def test_slots_follow_their_own_heads(domain):
    """Slot 1 (householder) is drawn from F_I,1, slot 2 from F_I,2; sizes from F_c."""
    lay = MixtureLayout.from_domain(domain)
    M = domain.max_size
    c = torch.tensor([[0.0, 0.5, 0.5]])
    g = torch.zeros(1, lay.group_width)
    g[0, lay.group_slice("TEN")] = torch.tensor([0.0, 0.0, 1.0])
    g[0, lay.group_slice("BLD")] = torch.tensor([0.5, 0.5])
    p = torch.full((1, M, lay.person_width), 0.0)
    p[0, :, lay.person_slice("SEX")] = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    p[0, :, lay.person_slice("AGE")] = torch.tensor([[0, 0, 0, 1.0], [1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    p[0, :, lay.person_slice("RAC")] = torch.tensor([1 / 3] * 3)
    data = sample_households(ProductMixture(lay, c, g, p), 2000, seed=0)
    slot = data.person_slot
    sex, age = data.person[:, 0], data.person[:, 1]
    assert set(np.unique(data.sizes)) == {2, 3}
    assert (sex[slot == 0] == 1).all() and (age[slot == 0] == 3).all()
    assert (sex[slot == 1] == 0).all() and (age[slot == 1] == 0).all()
    assert (age[slot == 2] == 1).all()
    assert (data.group[:, 0] == 2).all()
    assert abs((data.sizes == 3).mean() - 0.5) < 0.05
    assert abs(data.group[:, 2].mean() - 0.5) < 0.05


def test_components_are_allocated_in_balance(domain):
    """Component k puts all mass on TEN = k: the TEN counts are the component counts, which must
    differ by at most one (a multinomial allocation would spread them by about √(n/B))."""
    lay = MixtureLayout.from_domain(domain)
    M = domain.max_size
    B = 3
    c = torch.full((B, M), 1.0 / M)
    g = torch.zeros(B, lay.group_width)
    g[:, lay.group_slice("TEN")] = torch.eye(3)
    g[:, lay.group_slice("BLD")] = 0.5
    p = torch.zeros(B, M, lay.person_width)
    for name in lay.person_names:
        p[:, :, lay.person_slice(name)] = 1.0 / (lay.person_slice(name).stop - lay.person_slice(name).start)
    mix = ProductMixture(lay, c, g, p)
    ten = domain.group_index("TEN")
    spreads = []
    for seed in range(20):
        data = sample_households(mix, 1001, seed=seed)
        counts = np.bincount(data.group[:, ten], minlength=3)
        assert counts.sum() == 1001 and counts.max() - counts.min() <= 1
        spreads.append(counts)
    # the remainder goes to different components in different draws, and the order is shuffled
    assert len({tuple(s) for s in spreads}) > 1
    assert not np.all(np.diff(data.group[:, ten].astype(int)) >= 0)


def test_stratified_uniforms_cover_every_stratum_and_are_marginally_uniform():
    from scipy import stats

    from engine.hgem.sampling import stratified_uniforms

    labels = torch.tensor([3, 0, 3, 1, 3, 0, 3, 3, 1, 0, 2])
    gen = torch.Generator().manual_seed(0)
    firsts = []
    for _ in range(2000):
        u = stratified_uniforms(labels, gen)
        assert ((u >= 0) & (u < 1)).all()
        for lab in labels.unique():
            v = u[labels == lab]
            assert sorted((v * len(v)).floor().long().tolist()) == list(range(len(v)))
        firsts.append(float(u[0]))
    # the stratum each row lands in is random, so every row is U(0, 1)
    assert stats.kstest(firsts, "uniform").pvalue > 1e-3


def test_each_household_is_a_draw_from_the_mixture(domain):
    """Low-variance sampling changes only the dependence between households: household 0 of a
    small sample, over many seeds, follows the mixture's marginals (chi-square)."""
    from scipy import stats

    G = HGEMGenerator(domain, batch_size=2, z_dim=4, hidden=(8,), seed=5, device="cpu")
    with torch.no_grad():
        mix = G()
    lay = mix.layout
    ten = domain.group_index("TEN")
    expected_ten = mix.group_probs[:, lay.group_slice("TEN")].double().mean(0).numpy()
    expected_size = mix.size_probs.double().mean(0).numpy()
    expected_ten, expected_size = expected_ten / expected_ten.sum(), expected_size / expected_size.sum()
    draws = [sample_households(mix, 3, seed=s) for s in range(3000)]
    got_ten = np.bincount([d.group[0, ten] for d in draws], minlength=3)
    got_size = np.bincount([d.sizes[0] - 1 for d in draws], minlength=domain.max_size)
    assert stats.chisquare(got_ten, expected_ten * len(draws)).pvalue > 1e-3
    assert stats.chisquare(got_size, expected_size * len(draws)).pvalue > 1e-3


def test_extra_households_follow_the_sorted_components(domain):
    """60 near point-mass components (size × TEN), 40 households: every component gets 0 or 1, and
    the systematic draw along component_order keeps each modal size, and each (size, TEN), within
    one of its expected count in every draw (a random order spreads them hypergeometrically)."""
    from engine.hgem.sampling import component_order

    lay = MixtureLayout.from_domain(domain)
    M = domain.max_size
    rng = np.random.default_rng(0)
    size = np.repeat(np.arange(M), 60 // M)
    ten = np.tile(np.arange(3), 60 // 3)
    rng.shuffle(size)
    c = torch.full((60, M), 1e-7)
    c[torch.arange(60), torch.as_tensor(size)] = 1.0
    c = c / c.sum(1, keepdim=True)
    g = torch.full((60, lay.group_width), 0.5)
    g[:, lay.group_slice("TEN")] = 1e-7
    g[torch.arange(60), lay.group_slice("TEN").start + torch.as_tensor(ten)] = 1.0 - 2e-7
    p = torch.zeros(60, M, lay.person_width)
    for name in lay.person_names:
        sl = lay.person_slice(name)
        p[:, :, sl] = 1.0 / (sl.stop - sl.start)
    mix = ProductMixture(lay, c, g, p)
    order = component_order(mix).numpy()
    keys = list(zip(size[order], ten[order]))
    assert keys == sorted(keys)  # lexicographic: size first, then TEN
    for seed in range(30):
        data = sample_households(mix, 40, seed=seed)
        n_size = np.bincount(data.sizes - 1, minlength=M)
        assert np.all(np.abs(n_size - 40 / M) < 1), n_size


# -- household structure (one householder per household, derived household attributes) ---------
REL = ("H", "S", "C", "G")  # householder, spouse, child, group-quarters resident


def structured_domain(M: int = 4):
    from engine.data._domain import Attribute, Domain
    from tests.engine._support_testdata import attr

    return Domain(
        group=(Attribute("NP", tuple(str(i) for i in range(1, M + 1)), tuple(str(i) for i in range(1, M + 1))),
               attr("HH_SEX", 2), attr("KIDS", 2), attr("TEN", 3)),
        person=(Attribute("REL", REL, REL), attr("SEX", 2), attr("AGE", 3)),
        geography=("ST",), max_size=M,
    )


def structure(gq_households: bool = False):
    from engine.hgem.sampling import AnyPerson, HouseholdStructure

    return HouseholdStructure("REL", "H", ("G",), gq_households, (("HH_SEX", "SEX"),), (AnyPerson("KIDS", "AGE", ("0",)),))


def random_mixture(domain, B: int = 3, seed: int = 0) -> ProductMixture:
    """B components with random (Dirichlet) distributions: every code has positive probability."""
    lay = MixtureLayout.from_domain(domain)
    g = torch.Generator().manual_seed(seed)
    M = domain.max_size

    def dirichlet(*shape):
        x = -torch.log(torch.rand(*shape, generator=g, dtype=torch.float64))
        return (x / x.sum(-1, keepdim=True)).to(torch.float32)

    group = torch.cat([dirichlet(B, s) for s in lay.group_sizes], 1)
    person = torch.cat([dirichlet(B, M, s) for s in lay.person_sizes], 2)
    return ProductMixture(lay, dirichlet(B, M), group, person)


def householders(data: HierarchicalData, gq_heads: bool) -> np.ndarray:
    """Householders per household, counted as the release gate counts them."""
    rel = data.person[:, 0]
    hh = np.repeat(np.arange(data.n_households), data.sizes)
    heads = np.bincount(hh[rel == REL.index("H")], minlength=data.n_households)
    gq = np.bincount(hh[rel == REL.index("G")], minlength=data.n_households)
    return heads + (gq * (data.sizes == 1) if gq_heads else 0)


@pytest.mark.parametrize("gq_households", [False, True])
def test_exactly_one_householder_per_household(gq_households):
    dom = structured_domain()
    data = sample_households(random_mixture(dom), 4000, seed=1, structure=structure(gq_households))
    assert (householders(data, gq_heads=gq_households) == 1).all()
    rel, slot = data.person[:, 0], data.person_slot
    assert (rel[slot > 0] != REL.index("H")).all() and (rel[slot > 0] != REL.index("G")).all()
    single_gq = (rel[slot == 0] == REL.index("G"))
    if gq_households:  # one-person group-quarters households keep their share, never in larger ones
        assert single_gq.any() and (data.sizes[single_gq] == 1).all()
    else:
        assert not single_gq.any()
    # without the structure the paper's sampler gives households with 0 or several householders
    plain = sample_households(random_mixture(dom), 4000, seed=1)
    assert (householders(plain, gq_heads=gq_households) != 1).any()


def test_later_slots_follow_their_distribution_without_the_householder():
    """Slot j ≥ 2's relationship counts against n Σ_k w_k P_k(m ≥ j) q_kj(c), q_kj the slot
    distribution with H and G removed and renormalised (chi-square per slot)."""
    from scipy.stats import chisquare

    dom = structured_domain()
    mix = random_mixture(dom, B=3, seed=5)
    n = 20000
    data = sample_households(mix, n, seed=2, structure=structure())
    rel, slot = data.person[:, 0], data.person_slot
    lay = mix.layout
    w = (mix.component_weights / mix.component_weights.sum()).double()
    at_least = 1 - torch.cumsum(mix.size_probs.double(), 1) + mix.size_probs.double()  # P_k(m ≥ j)
    q = mix.person_probs[:, :, lay.person_slice("REL")].double().clone()
    q[:, :, [REL.index("H"), REL.index("G")]] = 0
    q = q / q.sum(-1, keepdim=True)
    for j in range(1, dom.max_size):
        expected = (n * (w[:, None] * at_least[:, j:j + 1] * q[:, j]).sum(0)).numpy()
        got = np.bincount(rel[slot == j], minlength=len(REL))
        allowed = [REL.index("S"), REL.index("C")]
        assert got[[REL.index("H"), REL.index("G")]].sum() == 0
        stat = chisquare(got[allowed], expected[allowed] * got[allowed].sum() / expected[allowed].sum())
        assert stat.pvalue > 1e-3, (j, got, expected)
        assert abs(got[allowed].sum() - expected[allowed].sum()) < 5 * np.sqrt(expected[allowed].sum())
    # and a wrong reference (the unconditioned slot distribution) is rejected
    raw = mix.person_probs[:, 1, lay.person_slice("REL")].double()
    wrong = (n * (w[:, None] * at_least[:, 1:2] * raw).sum(0)).numpy()[[1, 2]]
    got = np.bincount(rel[slot == 1], minlength=len(REL))[[1, 2]]
    assert chisquare(got, wrong * got.sum() / wrong.sum()).pvalue < 1e-3


def test_householder_attributes_and_indicators_are_derived_from_the_persons():
    dom = structured_domain()
    data = sample_households(random_mixture(dom, seed=3), 3000, seed=4, structure=structure())
    first = data.person_offsets[:-1]
    assert np.array_equal(data.group[:, dom.group_index("HH_SEX")], data.person[first, dom.person_index("SEX")])
    hh = np.repeat(np.arange(data.n_households), data.sizes)
    kids = np.bincount(hh[data.person[:, dom.person_index("AGE")] == 0], minlength=data.n_households) > 0
    assert np.array_equal(data.group[:, dom.group_index("KIDS")], kids.astype(data.group.dtype))
    assert 0 < kids.mean() < 1


def test_a_slot_with_no_allowed_mass_draws_uniformly_among_allowed_codes():
    dom = structured_domain(M=2)
    mix = random_mixture(dom, B=1)
    lay = mix.layout
    p = mix.person_probs.clone()
    p[:, :, lay.person_slice("REL")] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # every slot: householder only
    c = torch.tensor([[0.0, 1.0]])
    data = sample_households(ProductMixture(lay, c, mix.group_probs, p), 2000, seed=0, structure=structure())
    rel, slot = data.person[:, 0], data.person_slot
    assert (rel[slot == 0] == 0).all()
    assert set(np.unique(rel[slot == 1])) == {1, 2} and abs((rel[slot == 1] == 1).mean() - 0.5) < 0.05


def test_structure_codes_are_checked():
    from engine.hgem.sampling import HouseholdStructure

    dom = structured_domain()
    with pytest.raises(ValueError, match="not a code"):
        sample_households(random_mixture(dom), 10, structure=HouseholdStructure("REL", "X"))
    with pytest.raises(ValueError, match="go together"):
        HouseholdStructure("REL", None)
