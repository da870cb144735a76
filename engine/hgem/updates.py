"""The two per-round update rules of H-GEM (``engine.hgem.train``, module docstring):
``"gem"``, H-GEM-Update (Algorithm 4: γ-masked ℓ2 on the measurements still above γ), and
``"map"``, the noise-aware MAP fit (weighted Gaussian likelihood of every measurement plus the
relative entropy to the public fit); and GEM's EMA of the weights for the ``"ema"`` output."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.hgem.answers import AnswerPlan
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import ProductMixture, mixture_kl_bound
from engine.hgem.settings import HGEMSettings
from engine.hgem.steps import AdamSteps


def ema_update(ema: dict[str, torch.Tensor] | None, model: torch.nn.Module, beta: float) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        if ema is None:
            return {k: v.detach().clone() for k, v in model.named_parameters()}
        for k, v in model.named_parameters():
            ema[k].mul_(beta).add_(v.detach(), alpha=1.0 - beta)
        return ema


def kl_prior(mix: ProductMixture, reference: ProductMixture, strength: float) -> torch.Tensor:
    """The "map" rule's prior term: n₀ × the relative-entropy bound to the public fit."""
    return strength * mixture_kl_bound(mix, reference)


def gem_update(G: HGEMGenerator, runner: AdamSteps, cfg: HGEMSettings, plan_m: AnswerPlan, tgt_m: torch.Tensor,
               gamma_ema: float | None, max_steps: int) -> tuple[int, float | None, float, float]:
    """One round of H-GEM-Update (Algorithm 4): γ = gamma_scale × EMA of the max errors; Adam on the
    ℓ2 errors of the measurements still above γ, until none is or ``max_steps`` (T_max).
    Returns (steps, new γ EMA, γ, max err)."""
    gamma_t = torch.zeros((), device=tgt_m.device, dtype=tgt_m.dtype)  # read by the captured loss
    gamma, max_err = 0.0, float("nan")

    def evaluate() -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        ans = plan_m.answers(G())
        err = plan_m.max_abs_error(ans.detach(), tgt_m)
        return (ans, err), err.max().reshape(1)

    def loss_of(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ans, err = state
        return (plan_m.l2_error(ans, tgt_m) * (err >= gamma_t)).sum()  # measurements above γ only

    def stop(i: int, stats: np.ndarray) -> bool:
        nonlocal gamma_ema, gamma, max_err
        max_err = float(stats[0])
        if i == 0:
            gamma_ema = max_err if gamma_ema is None else cfg.gamma_beta * gamma_ema + (1 - cfg.gamma_beta) * max_err
            gamma = cfg.gamma_scale * gamma_ema
            gamma_t.fill_(gamma)
        return max_err < gamma

    steps = runner.run(evaluate, loss_of, stop, max_steps)
    return steps, gamma_ema, gamma, max_err


def map_update(G: HGEMGenerator, runner: AdamSteps, cfg: HGEMSettings, plan_m: AnswerPlan, tgt_m: torch.Tensor, w_m: torch.Tensor,
               prior_term: Callable[[ProductMixture], torch.Tensor] | None, max_steps: int) -> tuple[int, float, float]:
    """One round of the ``update="map"`` rule: Adam on the weighted likelihood of all past
    measurements plus the prior term ``prior_term(mixture)`` (None: none), warm-started, until the
    loss stops improving (relative change < ``update_tol`` over 10 steps) or ``max_steps``.
    The round keeps its best iterate: when a later step made the loss worse (Adam's normalised steps
    can overshoot on saturated softmax heads), the parameters of the lowest loss seen are restored,
    so a round never ends above its own best. Returns (steps, γ = 0 (unused), max err)."""
    best_prev, hist = float("inf"), []
    params: list[torch.Tensor] = [p for p in G.parameters() if p.requires_grad]
    best_loss, best_max_err, best_params = float("inf"), float("nan"), [torch.empty_like(p) for p in params]
    last_loss = float("inf")

    def evaluate() -> tuple[torch.Tensor, torch.Tensor]:
        mix = G()
        ans_m = plan_m.answers(mix)
        loss = (w_m * (ans_m - tgt_m) ** 2).sum()
        if prior_term is not None:
            loss = loss + prior_term(mix)
        return loss, torch.stack([loss.detach(), plan_m.max_abs_error(ans_m.detach(), tgt_m).max()])

    def stop(i: int, stats: np.ndarray) -> bool:
        nonlocal best_prev, best_loss, best_max_err, last_loss
        hist.append(float(stats[0]))
        last_loss = float(stats[0])
        if float(stats[0]) < best_loss:  # stats describe the current parameters (before step i)
            best_loss, best_max_err = float(stats[0]), float(stats[1])
            with torch.no_grad():  # one fused copy (a launch per tensor would slow graphed GPU steps)
                torch._foreach_copy_(best_params, params)
        if len(hist) % 10 == 0 and i < max_steps:
            best_now = min(hist[-10:])
            if best_now > best_prev * (1 - cfg.update_tol):
                return True
            best_prev = min(best_prev, best_now)
        return False

    steps = runner.run(evaluate, lambda loss: loss, stop, max_steps)
    if np.isfinite(best_loss) and not last_loss <= best_loss:  # worse, or NaN
        with torch.no_grad():  # in place: CUDA graphs of later rounds read the same tensors
            torch._foreach_copy_(params, best_params)
    return steps, 0.0, best_max_err
