"""component_kl against brute-force enumeration of every household of a tiny domain."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import ProductMixture, component_kl, mixture_kl_bound

from .conftest import tiny_domain


def _household_probs(mix, k: int) -> np.ndarray:
    """P_k(h) for every household h = (m, group attributes, persons of slots 1..m), enumerated."""
    lay = mix.layout
    size = mix.size_probs[k].double().numpy()
    gp = mix.group_probs[k].double().numpy()
    pp = mix.person_probs[k].double().numpy()
    g_dists = [gp[lay.group_slice(n)] for n in lay.group_names]
    out = []
    for m in range(1, lay.max_size + 1):
        for g in itertools.product(*[range(len(d)) for d in g_dists]):
            pg = size[m - 1] * np.prod([d[v] for d, v in zip(g_dists, g)])
            slot_dists = [[pp[j, lay.person_slice(n)] for n in lay.person_names] for j in range(m)]
            persons = [itertools.product(*[range(len(d)) for d in sd]) for sd in slot_dists]
            for ps in itertools.product(*[list(p) for p in persons]):
                pr = pg
                for sd, person in zip(slot_dists, ps):
                    pr *= np.prod([d[v] for d, v in zip(sd, person)])
                out.append(pr)
    return np.array(out)


def test_component_kl_equals_brute_force_household_kl():
    dom = tiny_domain(M=2)
    with torch.no_grad():
        p = HGEMGenerator(dom, batch_size=3, z_dim=4, hidden=(8,), seed=1, device="cpu")().detach()
        q = HGEMGenerator(dom, batch_size=3, z_dim=4, hidden=(8,), seed=2, device="cpu")().detach()
    got = component_kl(p, q).double().numpy()
    for k in range(3):
        hp, hq = _household_probs(p, k), _household_probs(q, k)
        assert hp.sum() == pytest.approx(1.0) and hq.sum() == pytest.approx(1.0)
        assert got[k] == pytest.approx(float(np.sum(hp * np.log(hp / hq))), rel=1e-4)
    # mean component KL bounds the KL of the uniform mixtures (joint convexity), equality at p == q
    mp = np.mean([_household_probs(p, k) for k in range(3)], axis=0)
    mq = np.mean([_household_probs(q, k) for k in range(3)], axis=0)
    assert float(np.sum(mp * np.log(mp / mq))) <= got.mean() + 1e-9
    assert component_kl(p, p).abs().max() < 1e-6


def test_component_kl_is_differentiable_in_p_only():
    dom = tiny_domain(M=3)
    gp = HGEMGenerator(dom, batch_size=4, z_dim=4, hidden=(8,), seed=1, device="cpu")
    gq = HGEMGenerator(dom, batch_size=4, z_dim=4, hidden=(8,), seed=2, device="cpu")
    component_kl(gp(), gq()).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in gp.named_parameters() if n != "component_logits")
    assert all(p.grad is None for p in gq.parameters())
    with pytest.raises(ValueError):
        component_kl(gp(), HGEMGenerator(dom, batch_size=5, z_dim=4, hidden=(8,), seed=2, device="cpu")())


def test_mixture_kl_bound_with_weights_against_brute_force():
    dom = tiny_domain(M=2)
    with torch.no_grad():
        p = HGEMGenerator(dom, batch_size=3, z_dim=4, hidden=(8,), seed=1, device="cpu")().detach()
        q = HGEMGenerator(dom, batch_size=3, z_dim=4, hidden=(8,), seed=2, device="cpu")().detach()
    wp, wq = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.5, 0.3])
    pw = ProductMixture(p.layout, p.size_probs, p.group_probs, p.person_probs, wp)
    qw = ProductMixture(q.layout, q.size_probs, q.group_probs, q.person_probs, wq)
    hp = np.stack([_household_probs(p, k) for k in range(3)])
    hq = np.stack([_household_probs(q, k) for k in range(3)])
    bound = float(mixture_kl_bound(pw, qw))
    exact_terms = float(np.sum(wp.numpy() * np.log(wp.numpy() / wq.numpy()))) + sum(
        float(wp[k]) * float(np.sum(hp[k] * np.log(hp[k] / hq[k]))) for k in range(3))
    assert bound == pytest.approx(exact_terms, rel=1e-4)
    mp, mq = wp.double().numpy() @ hp, wq.double().numpy() @ hq
    assert float(np.sum(mp * np.log(mp / mq))) <= bound + 1e-9
    # same components, other weights: only the weights' KL remains, and it is exact
    same = ProductMixture(p.layout, p.size_probs, p.group_probs, p.person_probs, wq)
    exact = float(np.sum(mp * np.log(mp / (wq.double().numpy() @ hp))))
    assert exact <= float(mixture_kl_bound(pw, same)) + 1e-9
    assert float(mixture_kl_bound(pw, same)) == pytest.approx(float(np.sum(wp.numpy() * np.log(wp.numpy() / wq.numpy()))), rel=1e-5)
    # uniform weights: the bound is the mean component KL
    assert float(mixture_kl_bound(p, q)) == pytest.approx(float(component_kl(p, q).mean()), rel=1e-6)
