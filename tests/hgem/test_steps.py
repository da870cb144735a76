"""Step loops (eager and CUDA-graph replays), the fused per-attribute softmax, and that a GPU run
with CUDA graphs computes what the eager run computes. The CUDA tests run where a GPU is visible
(the device machine); CI has none and skips them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.hgem.answers import AnswerPlan, exact_normalised_answers
from engine.hgem.config import make_generator
from engine.hgem.generator import SegmentSoftmax
from engine.hgem.pretrain import fit_answers
from engine.hgem.settings import HGEMSettings
from engine.hgem.steps import AdamSteps, GraphedEval, make_adam, set_lr
from engine.hgem.train import score_select, train_hgem
from engine.hgem.workloads import kway_workloads

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CFG = dict(max_update_steps=25, lr=3e-3, batch_size=64, z_dim=16, hidden=(64, 64))


@pytest.mark.parametrize("sizes", [(3, 1, 4, 2), (5,), (1, 1), (2, 7, 3)])
def test_segment_softmax_equals_a_softmax_per_segment(sizes):
    torch.manual_seed(0)
    x = torch.randn(4, 3, sum(sizes), dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 3, sum(sizes), dtype=torch.float64)
    ref = torch.cat([torch.softmax(p, -1) for p in torch.split(x, list(sizes), -1)], -1)
    got = SegmentSoftmax(sizes).to(torch.float64)(x)
    torch.testing.assert_close(got, ref)
    (g_ref,) = torch.autograd.grad((ref * up).sum(), x)
    (g_got,) = torch.autograd.grad((got * up).sum(), x)
    torch.testing.assert_close(g_got, g_ref)


def test_segment_softmax_without_segments_is_identity():
    x = torch.randn(2, 0)
    assert SegmentSoftmax(()).forward(x) is x


def _quadratic(device):
    p = torch.nn.Parameter(torch.tensor([3.0, -2.0], device=device))
    target = torch.tensor([1.0, 1.0], device=device)

    def evaluate():
        loss = ((p - target) ** 2).sum()
        return loss, loss.detach().reshape(1)

    return p, evaluate


def test_eager_steps_stop_where_told_and_at_max_steps():
    p, evaluate = _quadratic("cpu")
    seen = []

    def stop(i, stats):
        seen.append((i, float(stats[0])))
        return stats[0] < 1.0

    runner = AdamSteps(make_adam([p], 0.1, "cpu"), graphs=False)
    steps = runner.run(evaluate, lambda loss: loss, stop, max_steps=500)
    assert [i for i, _ in seen] == list(range(steps + 1))
    assert seen[-1][1] < 1.0 and all(v >= 1.0 for _, v in seen[:-1])
    p2, evaluate2 = _quadratic("cpu")
    assert AdamSteps(make_adam([p2], 0.1, "cpu"), graphs=False).run(evaluate2, lambda l: l, lambda i, s: False, 7) == 7


def test_set_lr_reaches_the_optimizer():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = make_adam([p], 0.1, "cpu")
    set_lr(opt, 0.25)
    p.grad = torch.ones(1)
    opt.step()
    assert float(p.detach()) == pytest.approx(-0.25)  # Adam's first step moves by lr


def test_graphs_need_a_capturable_optimizer():
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="capturable"):
        AdamSteps(torch.optim.Adam([p], lr=0.1), graphs=True)


@cuda
def test_graphed_steps_follow_the_eager_trajectory():
    runs = {}
    for graphs in (False, True):
        p, evaluate = _quadratic("cuda")
        trace = []
        runner = AdamSteps(make_adam([p], 0.05, "cuda"), graphs=graphs)
        total = 0
        for _ in range(3):  # several rounds: warm-up, then one capture per round
            total += runner.run(evaluate, lambda loss: loss, lambda i, s, trace=trace: trace.append(float(s[0])) or i >= 9, 50)
        runs[graphs] = (total, trace, p.detach().cpu())
    assert runs[True][0] == runs[False][0] == 27
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-5)
    torch.testing.assert_close(runs[True][2], runs[False][2])


@cuda
def test_graphed_eval_reads_parameters_in_place():
    p = torch.nn.Parameter(torch.arange(3.0, device="cuda"))
    ev = GraphedEval(lambda: (p * 2).sum().reshape(1), graphs=True)
    assert float(ev()[0]) == 6.0
    with torch.no_grad():
        p.add_(1.0)
    assert float(ev()[0]) == 12.0


@cuda
@pytest.mark.parametrize("update", ["gem", "map"])
def test_cuda_graph_training_matches_eager_training(domain, data, update):
    ws = kway_workloads(domain, 3)
    true = exact_normalised_answers(data, ws)
    sel = lambda s, e: int(np.argmax(s))  # noqa: E731
    meas = lambda w: true[ws.index(w)]  # noqa: E731
    out = {}
    for graphs in (False, True):
        cfg = HGEMSettings(rounds=6, update=update, cuda_graphs=graphs, **CFG)
        G = make_generator(domain, cfg, 0, "cuda")
        res = train_hgem(domain, ws, score_select(true, sel, 1.0), meas, cfg, prior_households=50.0, generator=G)
        plan = AnswerPlan(domain, ws, device="cuda")
        with torch.no_grad():
            out[graphs] = ([(r.workload, r.steps) for r in res.history], plan.answers(res.generator()).cpu())
    assert out[True][0] == out[False][0]  # same selections and the same number of steps each round
    torch.testing.assert_close(out[True][1], out[False][1], atol=2e-4, rtol=1e-3)


@cuda
def test_cuda_graph_fit_matches_eager_fit_with_decay_and_plateau(domain, data):
    """Same trajectory under the cosine decay (set_lr reaches the replays), and the plateau rule
    stops both. (Over hundreds of steps the two drift apart: GPU atomics make the last bits of
    every step differ, so the stopping step itself is compared only on the CPU path.)"""
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    out = {}
    for graphs in (False, True):
        G = make_generator(domain, HGEMSettings(**CFG), 0, "cuda")
        out[graphs] = np.array(fit_answers(G, ws, true, 100, lr=3e-3, decay=True, cuda_graphs=graphs))
    assert len(out[True]) == len(out[False]) == 100
    np.testing.assert_allclose(out[True], out[False], rtol=1e-2)
    for graphs in (False, True):
        G = make_generator(domain, HGEMSettings(**CFG), 0, "cuda")
        assert len(fit_answers(G, ws, true, 2000, lr=3e-3, rel_tol=0.05, window=20, cuda_graphs=graphs)) < 2000


def test_fit_answers_stopping_rules(domain, data):
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    G = make_generator(domain, HGEMSettings(**CFG), 0, "cpu")
    hist = fit_answers(G, ws, true, 2000, lr=3e-3, rel_tol=0.05, window=20)
    assert 0 < len(hist) < 2000 and len(hist) % 20 == 0
    best = [min(hist[k : k + 20]) for k in range(0, len(hist), 20)]
    assert best[-1] > min(best[:-1]) * 0.95  # the last window did not improve by 5 %
    assert all(best[k] <= min(best[:k]) * 0.95 for k in range(1, len(best) - 1))  # every earlier one did
    assert fit_answers(make_generator(domain, HGEMSettings(**CFG), 0, "cpu"), ws, true, 15, tol=1.0) == []  # errors < 1
    assert len(fit_answers(make_generator(domain, HGEMSettings(**CFG), 0, "cpu"), ws, true, 15, tol=1e-9)) == 15


def test_fit_answers_reports_progress_every_few_hundred_steps(domain, data):
    """A long public fit on CPU says where it is: ``progress(step, loss)`` every PROGRESS_EVERY steps,
    with the loss of that step (the history's entry), and never when the fit is shorter."""
    from engine.hgem.pretrain import PROGRESS_EVERY

    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    calls: list[tuple[int, float]] = []
    steps = 2 * PROGRESS_EVERY + 3
    hist = fit_answers(make_generator(domain, HGEMSettings(**CFG), 0, "cpu"), ws, true, steps, lr=3e-3,
                       progress=lambda i, loss: calls.append((i, loss)))
    assert [i for i, _ in calls] == [PROGRESS_EVERY, 2 * PROGRESS_EVERY]
    assert [loss for _, loss in calls] == [hist[PROGRESS_EVERY], hist[2 * PROGRESS_EVERY]]
    calls.clear()
    fit_answers(make_generator(domain, HGEMSettings(**CFG), 0, "cpu"), ws, true, PROGRESS_EVERY - 1, lr=3e-3,
                progress=lambda i, loss: calls.append((i, loss)))
    assert calls == []
