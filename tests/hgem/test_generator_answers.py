"""Generator shapes/normalisation and differentiable answers f_q vs Monte-Carlo exact answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.hgem.answers import AnswerPlan, exact_normalised_answers, workload_answers
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import MixtureLayout, ProductMixture, default_device
from engine.hgem.sampling import sample_households
from engine.hgem.workloads import kway_workloads
from engine.queries._queries import Workload


def tiny_gen(domain, seed=3, B=16):
    return HGEMGenerator(domain, batch_size=B, z_dim=8, hidden=(16, 16), seed=seed, device="cpu")


def test_default_device_matches_cuda_availability():
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_shapes_and_per_attribute_normalisation(domain):
    G = tiny_gen(domain)
    mix = G()
    lay = mix.layout
    M = domain.max_size
    assert lay.group_names == ("TEN", "BLD")  # NP is modelled by F_c, not F_G
    assert mix.size_probs.shape == (16, M)
    assert mix.group_probs.shape == (16, 3 + 2)
    assert mix.person_probs.shape == (16, M, 2 + 4 + 3)
    torch.testing.assert_close(mix.size_probs.sum(1), torch.ones(16))
    for name in lay.group_names:
        torch.testing.assert_close(mix.group_probs[:, lay.group_slice(name)].sum(1), torch.ones(16))
    for name in lay.person_names:
        torch.testing.assert_close(mix.person_probs[:, :, lay.person_slice(name)].sum(2), torch.ones(16, M))
    assert (mix.group_probs >= 0).all() and (mix.person_probs >= 0).all()


def test_fixed_latent_batch_is_seeded(domain):
    a, b, c = tiny_gen(domain, seed=5), tiny_gen(domain, seed=5), tiny_gen(domain, seed=6)
    torch.testing.assert_close(a.z, b.z)
    torch.testing.assert_close(a().size_probs, a().size_probs)  # z is fixed across calls
    torch.testing.assert_close(a().person_probs, b().person_probs)
    assert not torch.allclose(a().person_probs, c().person_probs)


def test_partition_and_person_workloads_sum_to_one(domain):
    with torch.no_grad():
        mix = tiny_gen(domain)()
    ws = [Workload("group", ("TEN", "NP")), Workload("group", ("BLD",)), Workload("person", ("NP",), ("AGE",)),
          Workload("person", (), ("SEX", "RAC")), Workload("person", ("TEN", "NP", "BLD"))]
    for w, a in zip(ws, workload_answers(mix, ws)):
        assert a.shape == (w.n_cells(domain),)
        assert float(a.sum()) == pytest.approx(1.0, abs=1e-5)


def _hand_mixture(domain):
    """One component: size 2 for sure, TEN=1, BLD=0; slot 1 SEX=1 w.p. .5, slot 2 SEX=1 w.p. .5."""
    lay = MixtureLayout.from_domain(domain)
    M = domain.max_size
    c = torch.tensor([[0.0, 1.0, 0.0]])
    g = torch.zeros(1, lay.group_width)
    g[0, lay.group_slice("TEN")] = torch.tensor([0.0, 1.0, 0.0])
    g[0, lay.group_slice("BLD")] = torch.tensor([1.0, 0.0])
    p = torch.zeros(1, M, lay.person_width)
    p[0, :, lay.person_slice("SEX")] = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.0, 1.0]])
    p[0, :, lay.person_slice("AGE")] = torch.tensor([0.25] * 4)
    p[0, :, lay.person_slice("RAC")] = torch.tensor([1.0, 0.0, 0.0])
    return ProductMixture(lay, c, g, p)


def test_answers_on_a_hand_computed_mixture(domain):
    mix = _hand_mixture(domain)
    g_sex, p_sex, g_np_sex, p_np = workload_answers(
        mix, [Workload("group", (), ("SEX",)), Workload("person", (), ("SEX",)),
              Workload("group", ("NP",), ("SEX",)), Workload("person", ("NP",))]
    )
    # contains SEX=1: 1 - .5*.5 (slot 3 is beyond the size and must not count)
    torch.testing.assert_close(g_sex, torch.tensor([0.75, 0.75]))
    torch.testing.assert_close(p_sex, torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(g_np_sex, torch.tensor([0.0, 0.0, 0.75, 0.75, 0.0, 0.0]))
    torch.testing.assert_close(p_np, torch.tensor([0.0, 1.0, 0.0]))


def test_answers_agree_with_exact_answers_on_sampled_households(domain):
    """f_q equals the expected normalised exact answer of data sampled from the same model."""
    G = tiny_gen(domain, seed=11, B=24)
    with torch.no_grad():
        mix = G()
    ws = kway_workloads(domain, 2) + kway_workloads(domain, 3)
    plan = AnswerPlan(domain, ws, device="cpu")
    with torch.no_grad():
        f = plan.split(plan.answers(mix).numpy())
    syn = sample_households(mix, 120_000, seed=4)
    ex = exact_normalised_answers(syn, ws)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(f, ex))
    assert worst < 0.01  # MC standard error ≤ ~0.0015 per cell
    # and the model is not trivially uniform: answers really vary across cells
    assert max(float(a.max() - a.min()) for a in f) > 0.05


def test_chunking_does_not_change_answers(domain):
    mix = tiny_gen(domain)()
    ws = kway_workloads(domain, 3)
    big = AnswerPlan(domain, ws, device="cpu").answers(mix)
    small = AnswerPlan(domain, ws, device="cpu", max_elements=64).answers(mix)
    torch.testing.assert_close(big, small)


def test_answers_are_differentiable_in_every_head(domain):
    G = tiny_gen(domain)
    ws = [Workload("group", ("NP", "TEN"), ("AGE",)), Workload("person", ("BLD",), ("SEX",))]
    plan = AnswerPlan(domain, ws, device="cpu")
    plan.answers(G()).pow(2).sum().backward()
    for head in (G.head_size, G.head_group, G.head_person):
        assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_exact_normalised_answers_units(domain, data):
    g, p = exact_normalised_answers(data, [Workload("group", ("TEN",)), Workload("person", (), ("SEX",))])
    assert g.sum() == pytest.approx(1.0) and p.sum() == pytest.approx(1.0)
    (gc,) = exact_normalised_answers(data, [Workload("group", (), ("AGE",))])
    assert gc.sum() > 1.0  # "contains" cells overlap: households with several ages count in several


def test_plan_errors_per_workload(domain):
    ws = [Workload("group", ("TEN",)), Workload("group", ("BLD",))]
    plan = AnswerPlan(domain, ws, device="cpu")
    a = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.9])
    t = torch.tensor([0.2, 0.0, 0.5, 0.4, 0.5])
    torch.testing.assert_close(plan.max_abs_error(a, t), torch.tensor([0.3, 0.4]))
    torch.testing.assert_close(plan.l2_error(a, t), torch.tensor([0.3, 0.5]), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        plan.concat_targets([np.zeros(3)])


def test_weighted_components_answers_and_sampling(domain):
    """A weighted mixture answers the weighted average of its components' answers (group level)
    and the weighted ratio at person level; sampling follows the weights (counts n·w_k ± 1) and
    its exact answers agree with f_q."""
    G = tiny_gen(domain, seed=3, B=3)
    with torch.no_grad():
        base = G()
    w = torch.tensor([0.7, 0.2, 0.1])
    mix = ProductMixture(base.layout, base.size_probs, base.group_probs, base.person_probs, w)
    one = [ProductMixture(base.layout, base.size_probs[k:k + 1], base.group_probs[k:k + 1], base.person_probs[k:k + 1])
           for k in range(3)]
    ws = kway_workloads(domain, 2)
    plan = AnswerPlan(domain, ws, device="cpu")
    with torch.no_grad():
        f = plan.split(plan.answers(mix))
        parts = [plan.split(plan.answers(m)) for m in one]
        sizes = torch.stack([m.expected_size() for m in one])
    for i, wl in enumerate(ws):
        if wl.level == "group":
            ref = sum(w[k] * parts[k][i] for k in range(3))
        else:  # expected matching persons / expected persons
            ref = sum(w[k] * sizes[k] * parts[k][i] for k in range(3)) / (w * sizes).sum()
        torch.testing.assert_close(f[i], ref, rtol=1e-5, atol=1e-6)
    # component counts follow the weights: with point-mass TEN per component they are the TEN counts
    g = base.group_probs.clone()
    g[:, base.layout.group_slice("TEN")] = torch.eye(3)
    marked = ProductMixture(base.layout, base.size_probs, g, base.person_probs, w)
    counts = np.bincount(sample_households(marked, 1001, seed=2).group[:, domain.group_index("TEN")], minlength=3)
    assert np.all(np.abs(counts - 1001 * w.numpy()) <= 1)
    syn = sample_households(mix, 60_000, seed=5)
    ex = exact_normalised_answers(syn, ws)
    assert max(float(np.abs(a.numpy() - b).max()) for a, b in zip(f, ex)) < 0.012


def test_the_answer_plan_refuses_first_persons_and_normalised_workloads(domain):
    """The mixture's answers count every person plainly: a workload measured otherwise would be
    fitted to answers of another statistic."""
    person = domain.person[0].name
    for w in (Workload("person", (), (person,), 2), Workload("person", (), (person,), 0, True),
              Workload("group", (domain.group[1].name,), (person,), 0, True)):
        with pytest.raises(ValueError, match="plain counts of every person"):
            AnswerPlan(domain, [w], device="cpu")
