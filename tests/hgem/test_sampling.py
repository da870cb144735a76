"""Two-stage sampling into HierarchicalData."""

from __future__ import annotations

import numpy as np
import torch

from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import MixtureLayout, ProductMixture
from engine.hgem.sampling import sample_households
from engine.hierarchical_data import HierarchicalData


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
