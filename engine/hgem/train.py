"""H-GEM training: the Adaptive Measurements rounds (:func:`train_hgem`).

The pieces live beside it: the settings in ``engine.hgem.settings``, the measurement and result types in
``engine.hgem.config``, public pretraining in ``engine.hgem.pretrain``, the two update rules
(``"gem"``, ``"map"``) and the EMA in ``engine.hgem.updates``, the Adam step loops in
``engine.hgem.steps``; one state's whole procedure as the pipeline runs it (budget split,
normalisers, measurements through the private session, sampling) in ``engine.hgem.state``.

H-GEM paper, appendix A.2.2, Algorithms 3 (H-GEM) and 4 (H-GEM-Update), with the GEM refinements
of the GEM appendix (B.2) and the marginal trick (A.1):

for t = 1..T:
  * **Select** the workload W with the largest error score max_y |q_y(D) − f_q(F(z))| through the
    injected ``select(model answers) -> index``: the pipeline's is the private session's
    exponential mechanism (``engine.privacy._session.PrivateSession.select_worst_workload``), which
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
(``engine.synthesis._map_update``: α · KL(q ‖ public prior) + Gaussian likelihood), on the mixture:

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

Initial measurements (``initial``: :class:`NormalisedMeasurement`): workloads chosen from public data
(the prior update's state workloads, ``engine.synthesis._workload_selection``) measured before the rounds
with a share of ρ and no selection cost (``engine.hgem.privacy.state_budget``). Round 0 fits them
all at once (at most ``initial_update_steps``); the adaptive rounds, if any, spend the rest and
select against the model that already reflects them. This is how the prior update spends its
budget (the measurements that decided it: ``benchmarks/results/HISTORY.md``).
Pretraining runs to convergence (``engine.hgem.pretrain.pretrain_public``: plateau stopping,
learning-rate decay).

On a GPU every update step (and every round's scoring of all candidates) is a CUDA-graph replay
(``engine.hgem.steps``; ``cuda_graphs=False`` runs them eagerly): the steps are launch-bound, and
the replays remove the host's per-operator overhead (``benchmarks/hgem_speed.py`` times both).

z is a fixed batch held by the generator (GEM B.2: fixing z converges faster).
Public pretraining (GEM^Pub, GEM paper §5): before the private rounds, fit F to the exact answers
of the public data on the workloads, which costs no privacy. ``pretrain_households`` is the
alternative with one component per public household, each fitted to its household, so that the
private phase starts from the public empirical distribution itself (the prior update's prior);
``network_lr_scale`` slows (or, at 0, freezes) the network in the rounds while the component
weights keep ``lr``. GEM^Pub stays the default (``benchmarks/results/HISTORY.md``).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from engine.data import Domain, HierarchicalData
from engine.hgem.answers import AnswerPlan, exact_normalised_answers
from engine.hgem.config import HGEMResult, NormalisedMeasureFn, NormalisedMeasurement, NormalisedSelectFn, RoundRecord, make_generator
from engine.hgem.generator import HGEMGenerator
from engine.hgem.pretrain import pretrain_public
from engine.hgem.settings import HGEMSettings
from engine.hgem.steps import AdamSteps, GraphedEval, frozen, make_adam, use_cuda_graphs
from engine.hgem.updates import ema_update, gem_update, kl_prior, map_update
from engine.privacy import max_abs_error_scores
from engine.queries import Workload


def train_hgem(
    domain: Domain,
    workloads: Sequence[Workload],
    select: NormalisedSelectFn,
    measure: NormalisedMeasureFn,
    settings: HGEMSettings,
    *,
    prior_households: float,
    generator: HGEMGenerator | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    callback: Callable[[RoundRecord, HGEMGenerator], None] | None = None,
    measurement_sigma: Callable[[Workload], float] | None = None,
    initial: Sequence[NormalisedMeasurement] = (),
) -> HGEMResult:
    """Run T adaptive-measurement rounds (H-GEM Algorithm 3) and return the output generator: the
    last round's fit by default (the MAP estimate given all measurements), GEM's EMA of the
    second half's weights with ``output="ema"`` (module docstring).

    workloads          the candidate workloads Q (selection is over workloads: marginal trick)
    select             ``select(model_answers) -> index``: the current model's normalised answers
                       of every candidate, concatenated in order (``engine.queries._queries`` C order per
                       workload); the selector scores them against the private data
    measure            ``measure(workload) -> noisy normalised answers`` (same cell order)
    settings           the hyper-parameters (rounds, steps, learning rate, update rule, output)
    prior_households   n₀, the strength of the ``"map"`` rule's prior to the public fit in
                       households (0: no prior; the ``"gem"`` rule has none)
    generator          start from this generator (e.g. after ``pretrain_public``); it is trained
                       in place. Default: a fresh one of ``settings``' size from ``seed`` on ``device``.
    callback           called after every round with (record, current generator).
    measurement_sigma  ``measurement_sigma(workload)``: std of the measurement noise per cell in
                       normalised units (``update="map"``); None → estimated (module doc).
    initial            measurements taken before the rounds (``NormalisedMeasurement``: workloads
                       chosen from public data, no selection cost). They join the past
                       measurements from the start, and round 0 updates F on them alone before the
                       first selection, so the first score already reflects them. ``settings.rounds``
                       may then be 0 (no adaptive rounds).
    """
    G = generator if generator is not None else make_generator(domain, settings, seed, device)
    if G.domain != domain:
        raise ValueError("generator domain differs from the workloads' domain")
    dev = G.device
    plan_all = AnswerPlan(domain, workloads, device=dev, max_elements=settings.max_elements)
    graphs = use_cuda_graphs(dev, settings.cuda_graphs)
    groups: list[dict[str, Any]] = [{"params": [G.component_logits]}]  # Adam parameter groups
    network = [p for name, p in G.named_parameters() if name != "component_logits"]
    if settings.network_lr_scale > 0:
        groups.append({"params": network, "lr": settings.lr * settings.network_lr_scale})
    runner = AdamSteps(make_adam(groups, settings.lr, dev), graphs)
    answers_of = GraphedEval(lambda: plan_all.answers(G()), graphs)
    use_map = settings.update == "map"
    out_mode = settings.output if settings.output != "auto" else ("last" if use_map else "ema")
    n0 = float(prior_households)
    anchor = prior_term = None
    if use_map and n0 > 0:
        with torch.no_grad():
            start = G().detach()  # the public fit (no privacy cost)
            anchor = plan_all.answers(start).detach()
        prior_term = functools.partial(kl_prior, reference=start, strength=n0)
    if settings.rounds == 0 and not initial:
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
    ema_start = settings.rounds // 2

    def update(max_steps: int) -> tuple[int, float, float]:
        nonlocal gamma_ema
        plan_m = AnswerPlan(domain, measured, device=dev, max_elements=settings.max_elements)
        tgt_m = plan_m.concat_targets(meas)
        if not use_map:
            steps, gamma_ema, gamma, max_err = gem_update(G, runner, settings, plan_m, tgt_m, gamma_ema, max_steps)
            return steps, gamma, max_err
        w_m = torch.repeat_interleave(
            torch.as_tensor([0.5 / max(v, 1e-10) for v in sig2], dtype=tgt_m.dtype, device=dev),
            torch.as_tensor(np.diff(plan_m.offsets), device=dev))
        return map_update(G, runner, settings, plan_m, tgt_m, w_m, prior_term, max_steps)

    with frozen(network, settings.network_lr_scale <= 0):
        if initial:  # round 0: the measurements that needed no selection
            t0 = time.perf_counter()
            steps, gamma, max_err = update(settings.initial_update_steps)
            rec = RoundRecord(0, f"initial ({len(initial)} workloads)", gamma, steps, max_err,
                              time.perf_counter() - t0)
            history.append(rec)
            if callback is not None:
                callback(rec, G)
        for t in range(1, settings.rounds + 1):
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
            steps, gamma, max_err = update(settings.max_update_steps)
            if t > ema_start:
                ema = ema_update(ema, G, settings.ema_beta)
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


def _answer_vector(w: Workload, values: ArrayLike, domain: Domain, what: str) -> np.ndarray:
    """``values`` as a flat float64 vector with one entry per cell of ``w`` (else ValueError)."""
    m = np.asarray(values, dtype=np.float64).reshape(-1)
    if m.shape[0] != w.n_cells(domain):
        raise ValueError(f"{what} of {w.id}: {m.shape[0]} values for {w.n_cells(domain)} cells")
    return m


def fit_hgem(
    private: HierarchicalData,
    workloads: Sequence[Workload],
    choose: Callable[[np.ndarray, float], int],
    measure: NormalisedMeasureFn,
    score_sensitivity: float,
    settings: HGEMSettings,
    *,
    prior_households: float,
    public: HierarchicalData | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> HGEMResult:
    """Convenience over in-memory data (tests, benchmarks): ``choose(scores, sensitivity)`` picks
    from the max-error scores against the exact answers, optional public pretraining
    (``settings.pretrain_steps``), then rounds."""
    G = make_generator(private.domain, settings, seed, device)
    if public is not None and settings.pretrain_steps > 0:
        pretrain_public(G, public, workloads, steps=settings.pretrain_steps)
    return train_hgem(
        private.domain, workloads, score_select(exact_normalised_answers(private, workloads), choose, score_sensitivity),
        measure, settings, prior_households=prior_households, generator=G,
    )


def score_select(true_answers: Sequence[np.ndarray], choose: Callable[[np.ndarray, float], int], sensitivity: float) -> NormalisedSelectFn:
    """A :data:`NormalisedSelectFn` over in-memory answers: scores each candidate by its max abs error
    (``engine.privacy._session.max_abs_error_scores``) and lets ``choose(scores, sensitivity)``
    pick (e.g. ``engine.privacy._mechanisms.exponential_mechanism`` with ε bound in)."""
    target = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in true_answers])
    n_cells = [int(np.size(a)) for a in true_answers]
    return lambda model: int(choose(max_abs_error_scores(model, target, n_cells), float(sensitivity)))
