"""Public pretraining of the H-GEM generator (no privacy cost): GEM^Pub's fit of the public
workload answers (:func:`pretrain_public`, the default) or one component per public household
(:func:`pretrain_households`); :func:`fit_answers` is the Adam loop both answer fits use."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from engine.data import HierarchicalData
from engine.hgem.answers import AnswerPlan, exact_normalised_answers
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import HouseholdCells, household_log_likelihood
from engine.hgem.steps import AdamSteps, frozen, make_adam, set_lr, use_cuda_graphs
from engine.queries import Workload

PROGRESS_EVERY = 250  # steps between two progress calls of a fit


def fit_answers(
    generator: HGEMGenerator,
    workloads: Sequence[Workload],
    targets: Sequence[np.ndarray],
    steps: int,
    lr: float = 1e-3,
    tol: float = 0.0,
    rel_tol: float = 0.0,
    window: int = 50,
    decay: bool = False,
    cuda_graphs: bool = True,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Minimise Σ_w ‖target_w − f_w(F(z))‖₂ over all ``workloads`` for at most ``steps`` Adam steps.

    Stops early when every workload's max error is below ``tol``, or (``rel_tol`` > 0) when the
    best loss of the last ``window`` steps improved by less than ``rel_tol`` (relative) on the best
    loss before it. ``decay``: cosine learning-rate decay to lr/20 over ``steps``. Returns the
    loss history. On a GPU the steps are CUDA-graph replays (``cuda_graphs``, engine.hgem.steps).
    ``progress(step, loss)`` is called every :data:`PROGRESS_EVERY` steps: a fit on CPU can run for
    minutes.
    """
    plan = AnswerPlan(generator.domain, workloads, device=generator.device)
    tgt = plan.concat_targets(targets)
    opt = make_adam(generator.parameters(), lr, generator.device)
    runner = AdamSteps(opt, use_cuda_graphs(generator.device, cuda_graphs))
    hist: list[float] = []
    best_before = float("inf")

    def evaluate() -> tuple[torch.Tensor, torch.Tensor]:
        ans = plan.answers(generator())
        loss = plan.l2_error(ans, tgt).sum()
        return loss, torch.stack([loss.detach(), plan.max_abs_error(ans.detach(), tgt).max()])

    def stop(i: int, stats: np.ndarray) -> bool:
        nonlocal best_before
        if rel_tol > 0 and hist and len(hist) % window == 0:  # after the step that filled a window
            best_now = min(hist[-window:])
            if best_now > best_before * (1 - rel_tol):
                return True
            best_before = min(best_before, best_now)
        if (tol > 0 and stats[1] < tol) or i == steps:
            return True
        if progress is not None and i > 0 and i % PROGRESS_EVERY == 0:
            progress(i, float(stats[0]))
        if decay:  # the learning rate of step i
            set_lr(opt, lr * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * i / max(int(steps), 1)))))
        hist.append(float(stats[0]))
        return False

    runner.run(evaluate, lambda loss: loss, stop, int(steps))
    return hist


def pretrain_public(
    generator: HGEMGenerator,
    public: HierarchicalData,
    workloads: Sequence[Workload],
    steps: int = 3000,
    lr: float = 3e-3,
    tol: float = 0.0,
    rel_tol: float = 0.01,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """GEM^Pub pretraining: fit F to the public data's normalised workload answers (no privacy cost).

    Runs to convergence: at most ``steps`` Adam steps with cosine learning-rate decay, stopping
    when the loss improves by less than ``rel_tol`` (relative) over 50 steps (``fit_answers``).
    An unconverged public fit is worse than resampling the public data, and the private rounds
    cannot repair the workloads they never measure. ``progress``: as :func:`fit_answers`'.
    """
    if public.domain != generator.domain:
        raise ValueError("public data and generator have different domains")
    # the paper's uniform mixture: component weights stay fixed (they are a private-phase freedom)
    with frozen([generator.component_logits], True):
        return fit_answers(generator, workloads, exact_normalised_answers(public, workloads), steps, lr, tol,
                           rel_tol=rel_tol, decay=True, progress=progress)


def pretrain_households(
    generator: HGEMGenerator,
    public: HierarchicalData,
    steps: int = 3000,
    lr: float = 3e-3,
    target: float = 0.999,
    cuda_graphs: bool = True,
) -> list[float]:
    """Public pretraining on the households themselves (an alternative to GEM^Pub's fit of the
    public workload answers, :func:`pretrain_public`): component k is fitted by maximum likelihood
    to public household k, so B must be the public household count.

    Stops when the geometric mean of the factor probabilities (each household's size, group values
    and persons' values under its component) reaches ``target``, or after ``steps``. The mixture is
    then the public empirical distribution up to 1 − ``target`` per factor, and the private MAP
    update starts from the prior update's own prior: reweighting components is reweighting public
    households, and the network can still move a component where the measurements demand it (at
    the relative-entropy cost). The component weights stay uniform (the public households are
    equally weighted). Returns the history of the mean negative log-likelihood per household.
    """
    if public.domain != generator.domain:
        raise ValueError("public data and generator have different domains")
    if generator.batch_size != public.n_households:
        raise ValueError(f"household pretraining needs one component per public household: "
                         f"B = {generator.batch_size}, public households = {public.n_households}")
    cells = HouseholdCells(generator.layout, public, generator.device)
    n = cells.n_households
    goal = float(np.log(target)) * cells.n_factors  # total log-likelihood at the target
    runner = AdamSteps(make_adam(generator.parameters(), lr, generator.device),
                       use_cuda_graphs(generator.device, cuda_graphs))
    hist: list[float] = []

    def evaluate() -> tuple[torch.Tensor, torch.Tensor]:
        ll = household_log_likelihood(generator(), cells).sum()
        return -ll / n, ll.detach().reshape(1)

    def stop(i: int, stats: np.ndarray) -> bool:
        hist.append(-float(stats[0]) / n)
        return bool(stats[0] >= goal)

    with frozen([generator.component_logits], True):  # equally weighted public households
        runner.run(evaluate, lambda loss: loss, stop, int(steps))
    return hist
