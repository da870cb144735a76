"""H-GEM training: public pretraining and the Adaptive Measurements rounds.

H-GEM paper, appendix A.2.2, Algorithms 3 (H-GEM) and 4 (H-GEM-Update), with the GEM refinements
of the GEM appendix (B.2) and the marginal trick (A.1):

for t = 1..T:
  * **Select** the workload W with the largest error score max_y |q_y(D) − f_q(F(z))| through the
    injected ``select(model answers) -> index``: the pipeline's is the private session's
    exponential mechanism (``engine.privacy.session.PrivateSession.select_worst_workload``), which
    alone holds q(D); :func:`score_select` builds one over in-memory answers (tests, benchmarks).
    Training therefore never sees the private data.
  * **Measure** the whole workload (marginal trick) through the injected
    ``measure(workload) -> noisy normalised answer vector`` (Gaussian mechanism).
  * **Update** F with Adam on the ℓ2 loss of Eq. (1), Σ_i ‖m̃_i − f_{q̃_i}(F(z))‖₂, restricted to
    the past measurements whose max error is ≥ γ; stop after T_max steps or when every past
    measurement is below γ. γ = ``gamma_scale`` × EMA_{β=0.5}(max error at the start of each
    round) (GEM B.2: "setting γ to be half of the max error … an exponential moving average
    (with β = 0.5) of the sampled max errors").
Output: the generator whose weights are the EMA θ_k = β θ_{k−1} + (1 − β) θ_k over the rounds of
the second half of training (GEM B.2, "EMA output").

That is ``update="gem"``. With public pretraining it loses to its own starting point (the γ-masked,
unweighted fit of a handful of noisy workloads with a large step budget drags the pretrained fit
of every other workload away, and the EMA started at round T/2 with weight 1 is mostly an early
iterate). The default ``update="map"`` keeps GEM's loop (select → measure → update on ALL past
measurements) but makes the update the noise-aware MAP fit of the prior-update rule
(``engine.map_update``: α · KL(q ‖ public prior) + Gaussian likelihood), on the mixture:

    L(θ) = Σ_i ‖f_{q̃_i}(F) − m̃_i‖² / (2 σ_i²)                  (Gaussian likelihood)
         + n₀ · [KL(w ‖ w_pub) + Σ_k w_k KL(P_k(θ) ‖ P_k(θ_pub))]    (relative entropy to the public fit)

where w are the component weights and P_k the components of the mixture
(``engine.hgem.mixture.mixture_kl_bound``: an upper bound of the mixtures' relative entropy, exact
per component). The weights start uniform (the paper's mixture) and are free in the private phase:
shifting the population towards households the public fit already has is a reweighting, as in the
prior update, and costs only KL(w ‖ w_pub). θ_pub are the network weights at the start of the
private phase (the public fit after pretraining: a prior that costs no privacy) and
n₀ = ``prior_households`` (α of the prior update: the pipeline passes ``synthesis.prior_strength``
× the node's households). Like the prior update's KL, the prior acts on the distribution, so a
measured workload also moves the answers of the correlated workloads that were never measured.
σ_i are the measurements' standard deviations in normalised units (``measurement_sigma``; when not
given, a conservative estimate, the RMS of m̃_i − a_i with a the public fit's answers).

Each round warm-starts from the previous weights and stops when the loss stops improving; it
keeps its best iterate (a step that made the loss worse is undone at the end of the round: Adam's
normalised steps can overshoot on saturated softmax heads, which is how household-pretrained runs
with a free network failed). The output is the last round's result (the MAP estimate given all
measurements), ``output="ema"`` restores GEM's EMA.

Initial measurements (``initial``: :class:`InitialMeasurement`): workloads chosen from public data
(the prior update's state workloads, ``engine.workload_selection``) measured before the rounds
with a share of ρ and no selection cost (``engine.hgem.privacy.split_initial``). Round 0 fits them
all at once (at most ``initial_update_steps``); the adaptive rounds, if any, spend the rest and
select against the model that already reflects them. This is how the prior update spends its
budget (the measurements that decided it: ``benchmarks/results/HISTORY.md``).
Pretraining runs to convergence (``pretrain_public``: plateau stopping, learning-rate decay).

On a GPU every update step (and every round's scoring of all candidates) is a CUDA-graph replay
(``engine.hgem.steps``; ``cuda_graphs=False`` runs them eagerly): the steps are launch-bound, and
the replays make a round 5× faster than eager GPU steps (``benchmarks/hgem_speed.py``).

z is a fixed batch held by the generator (GEM B.2: fixing z converges faster).
Public pretraining (GEM^Pub, GEM paper §5): before the private rounds, fit F to the exact answers
of the public data on the workloads, which costs no privacy. ``pretrain_households`` is the
alternative with one component per public household, each fitted to its household, so that the
private phase starts from the public empirical distribution itself (the prior update's prior);
``network_lr_scale`` slows (or, at 0, freezes) the network in the rounds while the component
weights keep ``lr``. GEM^Pub stays the default (``benchmarks/results/HISTORY.md``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.domain import Domain
from engine.hgem.answers import AnswerPlan, exact_normalised_answers
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import HouseholdCells, ProductMixture, household_log_likelihood, mixture_kl_bound, resolve_device
from engine.hgem.steps import AdamSteps, GraphedEval, make_adam, set_lr, use_cuda_graphs
from engine.hierarchical_data import HierarchicalData
from engine.privacy.session import max_abs_error_scores
from engine.queries import Workload

SelectFn = Callable[[np.ndarray], int]  # the model's answers of all candidates, concatenated -> index
MeasureFn = Callable[[Workload], np.ndarray]


@dataclass
class HGEMConfig:
    """Hyper-parameters of H-GEM (defaults follow the papers where they give a value)."""

    rounds: int = 50  # T
    max_update_steps: int = 100  # T_max per round
    initial_update_steps: int = 500  # round 0 (the update on all initial measurements at once): at most this many
    lr: float = 1e-3
    batch_size: int = 1000  # B (GEM appendix B.1)
    z_dim: int = 64
    hidden: tuple[int, ...] = (256, 512)  # H-GEM A.2.2
    ema_beta: float = 0.9  # weight EMA over the second half of training
    gamma_beta: float = 0.5  # EMA of the max errors (GEM B.2)
    gamma_scale: float = 0.5  # γ = gamma_scale × EMA(max error) (GEM B.2: "half of the max error")
    seed: int = 0
    max_elements: int = 1 << 24  # cap on answer intermediates (chunking)
    update: str = "map"  # "map": weighted likelihood + KL to the public fit (module doc); "gem": γ-masked ℓ2 (Alg. 4)
    prior_households: float = 300.0  # n₀: strength (households) of the KL prior to the public fit ("map"); 0 = off
    update_tol: float = 1e-3  # "map": stop a round when the loss improves by < update_tol (relative) over 10 steps
    output: str = "auto"  # "ema" | "last" | "auto" (= "last" for update="map", "ema" for "gem")
    cuda_graphs: bool = True  # on a GPU, replay each step as one CUDA graph (engine.hgem.steps)
    network_lr_scale: float = 1.0  # rounds: the network's learning rate is lr × this (component weights: lr); 0 = frozen


@dataclass(frozen=True)
class InitialMeasurement:
    """A measurement taken before the adaptive rounds, of a workload chosen without looking at the
    private data (e.g. from public data: ``engine.workload_selection``), so it costs no selection.

    answers  the noisy normalised answers (the units of ``engine.hgem.answers``), cells in
             ``engine.queries`` order
    sigma    the noise standard deviation per cell in the same units
    """

    workload: Workload
    answers: np.ndarray
    sigma: float


@dataclass
class RoundRecord:
    round: int  # 0: the update on the initial measurements (no selection)
    workload: str
    gamma: float
    steps: int
    max_measured_error: float  # after the update, vs the noisy measurements
    seconds: float


@dataclass
class HGEMResult:
    generator: HGEMGenerator  # the output F_out: the last round's fit (output "auto" under update="map"), or the EMA weights ("ema")
    last_generator: HGEMGenerator  # weights after round T
    measured: list[Workload]
    measurements: list[np.ndarray]
    history: list[RoundRecord] = field(default_factory=list)

    def mixture(self) -> ProductMixture:
        with torch.no_grad():
            return self.generator().detach()


def make_generator(domain: Domain, config: HGEMConfig, device=None) -> HGEMGenerator:
    return HGEMGenerator(domain, config.batch_size, config.z_dim, config.hidden, config.seed, resolve_device(device))


def _ema_update(ema: dict[str, torch.Tensor] | None, model: torch.nn.Module, beta: float) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        if ema is None:
            return {k: v.detach().clone() for k, v in model.named_parameters()}
        for k, v in model.named_parameters():
            ema[k].mul_(beta).add_(v.detach(), alpha=1.0 - beta)
        return ema


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
) -> list[float]:
    """Minimise Σ_w ‖target_w − f_w(F(z))‖₂ over all ``workloads`` for at most ``steps`` Adam steps.

    Stops early when every workload's max error is below ``tol``, or (``rel_tol`` > 0) when the
    best loss of the last ``window`` steps improved by less than ``rel_tol`` (relative) on the best
    loss before it. ``decay``: cosine learning-rate decay to lr/20 over ``steps``. Returns the
    loss history. On a GPU the steps are CUDA-graph replays (``cuda_graphs``, engine.hgem.steps).
    """
    plan = AnswerPlan(generator.domain, workloads, device=generator.device)
    tgt = plan.concat_targets(targets)
    opt = make_adam(generator.parameters(), lr, generator.device)
    runner = AdamSteps(opt, use_cuda_graphs(generator.device, cuda_graphs))
    hist: list[float] = []
    best_before = float("inf")

    def evaluate():
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
) -> list[float]:
    """GEM^Pub pretraining: fit F to the public data's normalised workload answers (no privacy cost).

    Runs to convergence: at most ``steps`` Adam steps with cosine learning-rate decay, stopping
    when the loss improves by less than ``rel_tol`` (relative) over 50 steps (``fit_answers``).
    An unconverged public fit is worse than resampling the public data, and the private rounds
    cannot repair the workloads they never measure.
    """
    if public.domain != generator.domain:
        raise ValueError("public data and generator have different domains")
    # the paper's uniform mixture: component weights stay fixed (they are a private-phase freedom)
    with _frozen([generator.component_logits], True):
        return fit_answers(generator, workloads, exact_normalised_answers(public, workloads), steps, lr, tol,
                           rel_tol=rel_tol, decay=True)


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

    def evaluate():
        ll = household_log_likelihood(generator(), cells).sum()
        return -ll / n, ll.detach().reshape(1)

    def stop(i: int, stats: np.ndarray) -> bool:
        hist.append(-float(stats[0]) / n)
        return bool(stats[0] >= goal)

    with _frozen([generator.component_logits], True):  # equally weighted public households
        runner.run(evaluate, lambda loss: loss, stop, int(steps))
    return hist


def train_hgem(
    domain: Domain,
    workloads: Sequence[Workload],
    select: SelectFn,
    measure: MeasureFn,
    config: HGEMConfig | None = None,
    generator: HGEMGenerator | None = None,
    device: str | torch.device | None = None,
    callback: Callable[[RoundRecord, HGEMGenerator], None] | None = None,
    measurement_sigma: Callable[[Workload], float] | None = None,
    initial: Sequence[InitialMeasurement] = (),
) -> HGEMResult:
    """Run T adaptive-measurement rounds (H-GEM Algorithm 3) and return the output generator: the
    last round's fit by default (the MAP estimate given all measurements), GEM's EMA of the
    second half's weights with ``output="ema"`` (module docstring).

    workloads          the candidate workloads Q (selection is over workloads: marginal trick)
    select             ``select(model_answers) -> index``: the current model's normalised answers
                       of every candidate, concatenated in order (``engine.queries`` C order per
                       workload); the selector scores them against the private data
    measure            ``measure(workload) -> noisy normalised answers`` (same cell order)
    generator          start from this generator (e.g. after ``pretrain_public``); it is trained
                       in place. Default: a fresh one from ``config`` on ``device``.
    callback           called after every round with (record, current generator).
    measurement_sigma  ``measurement_sigma(workload)``: std of the measurement noise per cell in
                       normalised units (``update="map"``); None → estimated (module doc).
    initial            measurements taken before the rounds (``InitialMeasurement``: workloads
                       chosen from public data, no selection cost). They join the past
                       measurements from the start, and round 0 updates F on them alone before the
                       first selection, so the first score already reflects them. ``config.rounds``
                       may then be 0 (no adaptive rounds).
    """
    cfg = config or HGEMConfig()
    G = generator if generator is not None else make_generator(domain, cfg, device)
    if G.domain != domain:
        raise ValueError("generator domain differs from the workloads' domain")
    dev = G.device
    plan_all = AnswerPlan(domain, workloads, device=dev, max_elements=cfg.max_elements)
    graphs = use_cuda_graphs(dev, cfg.cuda_graphs)
    groups: list[dict[str, Any]] = [{"params": [G.component_logits]}]  # Adam parameter groups
    network = [p for name, p in G.named_parameters() if name != "component_logits"]
    if cfg.network_lr_scale > 0:
        groups.append({"params": network, "lr": cfg.lr * cfg.network_lr_scale})
    runner = AdamSteps(make_adam(groups, cfg.lr, dev), graphs)
    answers_of = GraphedEval(lambda: plan_all.answers(G()), graphs)
    use_map = cfg.update == "map"
    if cfg.update not in ("map", "gem"):
        raise ValueError(f"unknown update {cfg.update!r}")
    out_mode = cfg.output if cfg.output != "auto" else ("last" if use_map else "ema")
    n0 = float(cfg.prior_households)
    anchor = prior_term = None
    if use_map and n0 > 0:
        with torch.no_grad():
            start = G().detach()  # the public fit (no privacy cost)
            anchor = plan_all.answers(start).detach()
        prior_term = functools.partial(_kl_prior, reference=start, strength=n0)
    if cfg.rounds < (0 if initial else 1):
        raise ValueError("need rounds >= 1, or initial measurements with rounds >= 0")
    measured: list[Workload] = []
    sig2: list[float] = []
    meas: list[np.ndarray] = []
    for im in initial:
        m = _answer_vector(im.workload, im.answers, domain, "initial measurement")
        if not float(im.sigma) > 0:
            raise ValueError(f"initial measurement of {im.workload.id}: sigma must be > 0")
        measured.append(im.workload)
        meas.append(m)
        sig2.append(float(im.sigma) ** 2)
    history: list[RoundRecord] = []
    gamma_ema: float | None = None
    ema: dict[str, torch.Tensor] | None = None
    ema_start = cfg.rounds // 2

    def update(max_steps: int) -> tuple[int, float, float]:
        nonlocal gamma_ema
        plan_m = AnswerPlan(domain, measured, device=dev, max_elements=cfg.max_elements)
        tgt_m = plan_m.concat_targets(meas)
        if not use_map:
            steps, gamma_ema, gamma, max_err = _gem_update(G, runner, cfg, plan_m, tgt_m, gamma_ema, max_steps)
            return steps, gamma, max_err
        w_m = torch.repeat_interleave(
            torch.as_tensor([0.5 / max(v, 1e-10) for v in sig2], dtype=tgt_m.dtype, device=dev),
            torch.as_tensor(np.diff(plan_m.offsets), device=dev))
        return _map_update(G, runner, cfg, plan_m, tgt_m, w_m, prior_term, max_steps)

    with _frozen(network, cfg.network_lr_scale <= 0):
        if initial:  # round 0: the measurements that needed no selection
            t0 = time.perf_counter()
            steps, gamma, max_err = update(cfg.initial_update_steps)
            rec = RoundRecord(0, f"initial ({len(initial)} workloads)", gamma, steps, max_err,
                              time.perf_counter() - t0)
            history.append(rec)
            if callback is not None:
                callback(rec, G)
        for t in range(1, cfg.rounds + 1):
            t0 = time.perf_counter()
            idx = int(select(answers_of().cpu().numpy().astype(np.float64)))
            if not 0 <= idx < len(workloads):
                raise ValueError(f"select returned {idx}, not a candidate index (0..{len(workloads) - 1})")
            w = workloads[idx]
            m = _answer_vector(w, measure(w), domain, "measure")
            measured.append(w)
            meas.append(m)
            if measurement_sigma is not None:
                s2 = float(measurement_sigma(w)) ** 2
            elif anchor is not None:
                a_w = plan_all.split(anchor)[idx].cpu().numpy()
                s2 = float(np.mean((m - a_w) ** 2))
            else:
                s2 = float(np.mean((m - np.mean(m)) ** 2))
            sig2.append(s2)
            steps, gamma, max_err = update(cfg.max_update_steps)
            if t > ema_start:
                ema = _ema_update(ema, G, cfg.ema_beta)
            rec = RoundRecord(t, w.id, gamma, steps, max_err, time.perf_counter() - t0)
            history.append(rec)
            if callback is not None:
                callback(rec, G)
    out = copy.deepcopy(G)
    if ema is not None and out_mode == "ema":
        with torch.no_grad():
            for k, v in out.named_parameters():
                v.copy_(ema[k])
    return HGEMResult(out, G, measured, meas, history)


def _answer_vector(w: Workload, values, domain: Domain, what: str) -> np.ndarray:
    """``values`` as a flat float64 vector with one entry per cell of ``w`` (else ValueError)."""
    m = np.asarray(values, dtype=np.float64).reshape(-1)
    if m.shape[0] != w.n_cells(domain):
        raise ValueError(f"{what} of {w.id}: {m.shape[0]} values for {w.n_cells(domain)} cells")
    return m


@contextlib.contextmanager
def _frozen(params: Sequence[torch.nn.Parameter], frozen: bool):
    """Parameters that take no gradient inside the block (when ``frozen``)."""
    if not frozen:
        yield
        return
    before = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, rg in zip(params, before):
            p.requires_grad_(rg)


def _kl_prior(mix: ProductMixture, reference: ProductMixture, strength: float) -> torch.Tensor:
    """The "map" rule's prior term: n₀ × the relative-entropy bound to the public fit."""
    return strength * mixture_kl_bound(mix, reference)


def _gem_update(G, runner: AdamSteps, cfg, plan_m, tgt_m, gamma_ema, max_steps) -> tuple[int, float, float, float]:
    """One round of H-GEM-Update (Algorithm 4): γ = gamma_scale × EMA of the max errors; Adam on the
    ℓ2 errors of the measurements still above γ, until none is or ``max_steps`` (T_max).
    Returns (steps, new γ EMA, γ, max err)."""
    gamma_t = torch.zeros((), device=tgt_m.device, dtype=tgt_m.dtype)  # read by the captured loss
    gamma, max_err = 0.0, float("nan")

    def evaluate():
        ans = plan_m.answers(G())
        err = plan_m.max_abs_error(ans.detach(), tgt_m)
        return (ans, err), err.max().reshape(1)

    def loss_of(state):
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


def _map_update(G, runner: AdamSteps, cfg, plan_m, tgt_m, w_m, prior_term, max_steps) -> tuple[int, float, float]:
    """One round of the ``update="map"`` rule: Adam on the weighted likelihood of all past
    measurements plus the prior term ``prior_term(mixture)`` (None: none), warm-started, until the
    loss stops improving (relative change < ``update_tol`` over 10 steps) or ``max_steps``.
    The round keeps its best iterate: when a later step made the loss worse (Adam's normalised steps
    can overshoot on saturated softmax heads), the parameters of the lowest loss seen are restored,
    so a round never ends above its own best. Returns (steps, γ = 0 (unused), max err)."""
    best_prev, hist = float("inf"), []
    params = [p for p in G.parameters() if p.requires_grad]
    best_loss, best_max_err, best_params = float("inf"), float("nan"), [torch.empty_like(p) for p in params]
    last_loss = float("inf")

    def evaluate():
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


def fit_hgem(
    private: HierarchicalData,
    workloads: Sequence[Workload],
    choose: Callable[[np.ndarray, float], int],
    measure: MeasureFn,
    score_sensitivity: float,
    config: HGEMConfig | None = None,
    public: HierarchicalData | None = None,
    pretrain_steps: int = 3000,
    device: str | torch.device | None = None,
) -> HGEMResult:
    """Convenience over in-memory data (tests, benchmarks): ``choose(scores, sensitivity)`` picks
    from the max-error scores against the exact answers, optional public pretraining, then rounds."""
    cfg = config or HGEMConfig()
    G = make_generator(private.domain, cfg, device)
    if public is not None and pretrain_steps > 0:
        pretrain_public(G, public, workloads, steps=pretrain_steps)
    return train_hgem(
        private.domain, workloads, score_select(exact_normalised_answers(private, workloads), choose, score_sensitivity),
        measure, cfg, generator=G,
    )


def score_select(true_answers: Sequence[np.ndarray], choose: Callable[[np.ndarray, float], int], sensitivity: float) -> SelectFn:
    """A :data:`SelectFn` over in-memory answers: scores each candidate by its max abs error
    (``engine.privacy.session.max_abs_error_scores``) and lets ``choose(scores, sensitivity)``
    pick (e.g. ``engine.privacy.mechanisms.exponential_mechanism`` with ε bound in)."""
    target = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in true_answers])
    n_cells = [int(np.size(a)) for a in true_answers]
    return lambda model: int(choose(max_abs_error_scores(model, target, n_cells), float(sensitivity)))
