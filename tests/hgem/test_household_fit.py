"""Household pretraining (one component per public household) and frozen-network rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.hgem.answers import AnswerPlan, exact_normalised_answers
from engine.hgem.config import make_generator
from engine.hgem.mixture import HouseholdCells, household_log_likelihood
from engine.hgem.pretrain import pretrain_households
from engine.hgem.settings import HGEMSettings
from engine.hgem.train import score_select, train_hgem
from engine.hgem.workloads import kway_workloads

from .conftest import synthetic_data

CFG = dict(max_update_steps=30, lr=3e-3, z_dim=16, hidden=(64, 64))


def test_household_log_likelihood_against_a_direct_product(domain):
    data = synthetic_data(domain, 40, seed=3)
    G = make_generator(domain, HGEMSettings(batch_size=40, **CFG), 0, "cpu")
    with torch.no_grad():
        mix = G()
    got = household_log_likelihood(mix, HouseholdCells(G.layout, data, "cpu")).double().numpy()
    lay = G.layout
    off = data.person_offsets
    for k in range(40):  # component k, household k: one factor per value, read off directly
        m = off[k + 1] - off[k]
        p = float(mix.size_probs[k, m - 1])
        for a in lay.group_names:
            p *= float(mix.group_probs[k, lay.group_slice(a)][data.group[k, domain.group_index(a)]])
        for j in range(m):
            for a in lay.person_names:
                p *= float(mix.person_probs[k, j, lay.person_slice(a)][data.person[off[k] + j, domain.person_index(a)]])
        assert got[k] == pytest.approx(np.log(p), rel=1e-5)


def test_household_pretraining_reproduces_the_public_answers(domain):
    public = synthetic_data(domain, 300, seed=5)
    G = make_generator(domain, HGEMSettings(batch_size=300, **CFG), 0, "cpu")
    hist = pretrain_households(G, public, steps=3000, lr=1e-2, target=0.99)
    assert len(hist) < 3000 and hist[-1] < 0.2 * hist[0]  # stopped at the target
    ws = kway_workloads(domain, 2) + kway_workloads(domain, 3)
    plan = AnswerPlan(domain, ws, device="cpu")
    with torch.no_grad():
        ans = plan.answers(G()).double().numpy()
    err = np.abs(ans - np.concatenate(exact_normalised_answers(public, ws)))
    assert err.mean() < 5e-3 and err.max() < 0.05  # the mixture is (nearly) the public households
    assert G.component_logits.requires_grad and torch.all(G.component_logits == 0)  # weights untouched


def test_household_pretraining_needs_one_component_per_household(domain):
    public = synthetic_data(domain, 50, seed=5)
    G = make_generator(domain, HGEMSettings(batch_size=49, **CFG), 0, "cpu")
    with pytest.raises(ValueError, match="one component per public household"):
        pretrain_households(G, public)


def test_frozen_network_moves_only_the_component_weights(domain, data):
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    cfg = HGEMSettings(rounds=4, batch_size=32, network_lr_scale=0.0, **CFG)
    G = make_generator(domain, cfg, 0, "cpu")
    before = {n: p.detach().clone() for n, p in G.named_parameters()}
    train_hgem(domain, ws, score_select(true, lambda s, e: int(np.argmax(s)), 1.0), lambda w: true[ws.index(w)], cfg,
               prior_households=50.0, generator=G)
    for name, p in G.named_parameters():
        assert p.requires_grad  # restored after the rounds
        moved = not torch.equal(p.detach(), before[name])
        assert moved == (name == "component_logits"), name
