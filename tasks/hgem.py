"""H-GEM synthesis of one state (issue #7, item 6), every privacy cost through the ledger.

``hgem_state_task`` trains the H-GEM generator (``engine.hgem``) on one state's households and
samples synthetic households from it:

1. candidates Q: 3-way group- and person-level workloads (``engine.hgem.workloads.kway_workloads``,
   ``KWAY_PER_GROUP_COUNT`` attribute sets per number of group attributes, i.e. at most
   2 × 4 × KWAY_PER_GROUP_COUNT workloads);
2. GEM^Pub: pretraining on the PUBLIC data's answers (no privacy cost);
3. initial measurements: the state workloads that the select-workload stage chose from the public
   data (``initial_workload_ids``, the prior update's own state workloads) are measured first,
   ``INITIAL_SHARE`` × ρ_node evenly over them, with no selection (they were chosen without the
   private data). Keys ``hgem/<node>/initial/<workload id>``, discrete Gaussian through the
   ``MeasurementStore`` (persisted before use, reused on a rerun). ``train_hgem`` fits them in its
   round 0, before the first selection (``engine.hgem.train.InitialMeasurement``);
4. ``ROUNDS`` adaptive rounds (``engine.hgem.train.train_hgem``). Stage ``"hgem"``, level
   ``"state"``, node ``node_key((state,))`` (``"ST=50"``); ρ_node = ``budget_plan(cfg).allocation(
   "hgem", "state")``; what the initial measurements leave, ρ_rounds, is split as in GEM
   (``engine.hgem.privacy.gem_budget``, α = ``ALPHA``), in
   exact fractions: ρ_round = ρ_rounds / T, ρ_sel = α ρ_round, ρ_meas = ρ_round − ρ_sel.

   * select: the private session's exponential mechanism
     (``PrivateSession.select_worst_workload``; the scores against the private answers are
     computed inside the session) with the largest float ε₀ such that ε₀²/8 ≤ ρ_sel exactly. The
     ledger is charged ε₀²/8 (key ``hgem/<node>/round-<r>/select``) BEFORE drawing; the drawn
     index is persisted in the MeasurementStore before it is used, and a rerun reuses it (no new
     draw, no new charge).
   * measure: the discrete Gaussian on the workload's integer counts through
     ``PrivateSession.measure_workload`` (key ``hgem/<node>/round-<r>/<workload id>``) with the
     count-level L2 sensitivity and ρ_meas; persisted before use, read back on a rerun.

   Units (what ``train_hgem`` expects): normalised answers, group level = fraction of households,
   person level = fraction of persons (``engine.hgem.answers``). Both the score targets and the
   noisy measurements are divided by constants fixed before the rounds at no further privacy
   cost, so that the score sensitivity (``engine.hgem.privacy.score_sensitivity``) is exact:
     - group level: N_G = the state's DP household count (from the count-of-counts or
       household-counts stage; exact only under the ``puma_household_counts`` invariant);
     - person level: N̂_I = N_G × the PUBLIC data's mean household size ("expected persons"). The
       state's true person count is never used, so it costs nothing; the price is a small bias
       when the state's mean size differs from the public data's.
   The update is the MAP rule of ``engine.hgem.train`` with the relative-entropy prior to the public
   fit at strength ``synthesis.prior_strength`` × N_G households (the prior update's α).
5. ``n_samples`` households are drawn from the output generator (``engine.hgem.sampling``, balanced
   components and stratified draws) with geo
   (state, 0, ...) placeholders and saved atomically to ``nodes/hgem_support/ST<xx>.npz``; a
   ``.json`` sidecar keeps the per-round diagnostics (no true errors, only DP-derived values).

Resume: if the output exists the task returns it at once. Otherwise every round's selection and
measurement already on disk is reused, so a rerun after a crash charges exactly what one clean
run charges. The budget split must match the first run (same ROUNDS/ALPHA/INITIAL_SHARE, same
initial workloads, same allocation), or the ledger refuses the differently-parameterised charges.

Device: ``engine.hgem.mixture.default_device()`` (cuda when visible). On a Dask cluster with GPU
workers, submit with ``dask.annotate(resources=gpu_resources(address))`` (see
:func:`gpu_resources`).
"""

from __future__ import annotations

import logging
import math
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from prefect import task

from engine.geography import node_key
from engine.hgem.mixture import default_device
from engine.hgem.privacy import gem_budget, score_sensitivity
from engine.hgem.sampling import sample_households
from engine.hgem.train import HGEMConfig, InitialMeasurement, make_generator, pretrain_public, train_hgem
from engine.hgem.workloads import kway_workloads
from engine.privacy.accountant import exponential_mechanism_rho
from engine.privacy.ledger import BudgetExceededError
from engine.privacy.mechanisms import discrete_gaussian_sigma
from engine.queries import Workload
from tasks.context import RunContext
from tasks.run_context import RunPaths, save_npz_atomic, write_json_atomic

STAGE = "hgem"
LEVEL = "state"

# -- model / workload settings (small defaults that run on a CPU in about a minute per state) --
KWAY = 3  # attributes per workload (H-GEM appendix A.1.2: |S| = 3)
KWAY_PER_GROUP_COUNT = 8  # attribute sets per |S_G| ∈ {0..3}; ×2 levels → ≤ 64 candidates
WORKLOAD_SEED = 0
ROUNDS = 4  # T (adaptive rounds after the initial measurements)
ALPHA = Fraction(1, 2)  # selection share of each round (GEM: 1/2)
INITIAL_SHARE = Fraction(4, 5)  # share of the node's rho for the public-selected state workloads (before the rounds)
BATCH_SIZE = 200  # B mixture components
Z_DIM = 32
HIDDEN: tuple[int, ...] = (128, 128)
LR = 3e-3
MAX_UPDATE_STEPS = 100  # T_max per round (the MAP update stops earlier when the loss plateaus)
PRETRAIN_STEPS = 3000  # at most this many GEM^Pub steps (stops at convergence, see pretrain_public)
TORCH_THREADS: int | None = 1  # CPU intra-op threads per task (one task per Dask worker); None: torch's default
SUPPORT_PER_HOUSEHOLD = 2  # suggested n_samples = this × the state's (public) household count


def hgem_config(seed: int = 0, prior_households: float = 300.0) -> HGEMConfig:
    """The HGEMConfig built from the module constants; ``prior_households``: strength α of the
    relative-entropy prior to the public fit, in households (the pipeline passes
    ``synthesis.prior_strength`` × the state's household count, as the prior update does)."""
    return HGEMConfig(
        rounds=ROUNDS, max_update_steps=MAX_UPDATE_STEPS, lr=LR, batch_size=BATCH_SIZE, z_dim=Z_DIM,
        hidden=tuple(HIDDEN), seed=int(seed), prior_households=float(prior_households),
    )


def candidate_workloads(domain) -> list[Workload]:
    """The candidate set Q (deterministic: the same on every rerun for the same constants)."""
    return kway_workloads(domain, KWAY, KWAY_PER_GROUP_COUNT, seed=WORKLOAD_SEED)


def _logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # no flow/task run context (e.g. ``.fn`` called directly)
        return logging.getLogger(__name__)


def selection_epsilon(rho_select: Fraction) -> float:
    """The largest float ε₀ (up to ulps) with ε₀²/8 ≤ ρ_sel exactly (exponential mechanism)."""
    eps = math.sqrt(8.0 * float(rho_select))
    while exponential_mechanism_rho(eps) > rho_select:
        eps = float(np.nextafter(eps, 0.0))
    return eps


def round_budget(rho_node: Fraction, rounds: int | None = None, alpha: Fraction | None = None,
                 initial_share: Fraction | None = None, n_initial: int = 0) -> dict:
    """Exact split of ρ_node: ``initial_share`` × ρ_node evenly over the ``n_initial`` initial
    workloads (``rho_initial`` each; no initial workloads: share 0), the rest over the rounds by the
    GEM split of ``gem_budget`` (in Fractions). ``rounds`` = 0 needs the whole ρ_node initial."""
    rounds = ROUNDS if rounds is None else int(rounds)
    alpha = ALPHA if alpha is None else Fraction(alpha)
    share = (INITIAL_SHARE if initial_share is None else Fraction(initial_share)) if n_initial > 0 else Fraction(0)
    if not 0 <= share <= 1 or rounds < 0:
        raise ValueError(f"need 0 <= initial share <= 1 and rounds >= 0, got {share} and {rounds}")
    rho_node = Fraction(rho_node)
    rho_initial = share * rho_node / n_initial if n_initial > 0 else Fraction(0)
    rho_rounds = rho_node - share * rho_node
    out = {"rounds": rounds, "n_initial": int(n_initial), "rho_initial": rho_initial, "rho_rounds": rho_rounds}
    if rounds == 0:
        if rho_rounds != 0:
            raise ValueError("no adaptive rounds: the initial workloads must take the whole node budget")
        return {**out, "rho_round": Fraction(0), "rho_select": Fraction(0), "rho_measure": Fraction(0), "epsilon0": 0.0}
    if rho_rounds <= 0:
        raise ValueError("adaptive rounds without budget: lower the initial share or set the rounds to 0")
    rho_round = rho_rounds / rounds
    rho_sel_planned = alpha * rho_round
    eps0 = selection_epsilon(rho_sel_planned)
    rho_sel = exponential_mechanism_rho(eps0)  # ε₀²/8 exactly, ≤ the planned share
    rho_meas = rho_round - rho_sel_planned
    ref = gem_budget(float(rho_rounds), rounds, float(alpha))  # the documented float split
    if not (math.isclose(ref.rho_measure, float(rho_meas), rel_tol=1e-9) and math.isclose(ref.epsilon0, eps0, rel_tol=1e-9)):
        raise RuntimeError(f"H-GEM budget split: the exact split ({rho_meas}, ε₀ {eps0}) disagrees with gem_budget's {ref}")
    if n_initial * rho_initial + rounds * (rho_sel + rho_meas) > rho_node:  # never asserted: python -O strips asserts
        raise BudgetExceededError(f"H-GEM budget split would spend more than the node's ρ = {rho_node}")
    return {**out, "rho_round": rho_round, "rho_select": rho_sel, "rho_measure": rho_meas, "epsilon0": eps0}


def _seeds(base: int, state: int) -> tuple[int, int]:
    """(generator seed, sampling seed) for the post-processing randomness of one state."""
    s = np.random.SeedSequence(entropy=int(base), spawn_key=(int(state),)).generate_state(2)
    return int(s[0] >> 1), int(s[1] >> 1)


@task(name="hgem-state")
def hgem_state_task(
    ctx: RunContext,
    state: int,
    households: int,
    n_samples: int,
    seed: int | None = None,
    initial_workload_ids: list[str] | None = None,
) -> str:
    """Train H-GEM on one state and sample ``n_samples`` households; returns the .npz path.

    ``households``: the state's DP household count (the group-level normaliser N_G; the private
    data are reached only through ``ctx.session()``). ``seed``: post-processing seed (generator
    initialisation and sampling); default ``cfg.sampling_seed`` or 0. Noise never uses seeds
    (OpenDP samplers, OS entropy). ``initial_workload_ids``: the state workloads chosen from public
    data (the select-workload stage's ``state`` list), measured first with ``INITIAL_SHARE`` of the
    node's ρ; None or empty: every round adaptive.
    """
    node = node_key((int(state),))
    out = ctx.paths.node_path("hgem_support", node)
    if out.exists():
        return str(out)
    threads = torch.get_num_threads()
    if TORCH_THREADS is not None and default_device().type == "cpu":
        torch.set_num_threads(int(TORCH_THREADS))
    try:
        return _run_state(ctx, int(state), int(households), int(n_samples), seed, out,
                          [Workload.from_id(i) for i in (initial_workload_ids or [])])
    finally:
        torch.set_num_threads(threads)


def _run_state(ctx: RunContext, state: int, households: int, n_samples: int, seed: int | None, out: Path,
               initial_ws: list[Workload]) -> str:
    log = _logger()
    t_start = time.perf_counter()
    cfg = ctx.cfg
    node_t = (int(state),)
    node = node_key(node_t)
    public = ctx.public()
    session = ctx.session()
    domain = session.domain
    if public.domain != domain:
        raise ValueError("public and private data have different domains")

    # -- normalisers fixed before the rounds (see the module docstring) ----------------------
    n_g = float(max(households, 1))
    public_mean_size = public.n_persons / max(public.n_households, 1)
    n_i = n_g * public_mean_size

    def norm(w: Workload) -> float:
        return n_g if w.level == "group" else n_i

    workloads = candidate_workloads(domain)
    delta_score = score_sensitivity(workloads, domain, cfg.privacy_unit, n_g, n_i)

    # -- budget ----------------------------------------------------------------------------------
    rho_node = ctx.allocation(STAGE, LEVEL)
    rb = round_budget(rho_node, n_initial=len(initial_ws))
    eps0, rho_sel, rho_meas, rho_init = rb["epsilon0"], rb["rho_select"], rb["rho_measure"], rb["rho_initial"]
    ledger = session.ledger
    sel_key = lambda r: session.key(STAGE, node_t, "select", f"round-{r}")  # noqa: E731
    init_key = lambda w: session.key(STAGE, node_t, w.id, "initial")  # noqa: E731

    # Fail before spending anything when the remaining budget cannot pay for the missing charges.
    charged = set(_charged_keys(ledger, node))
    missing = sum((rho_init for w in initial_ws if init_key(w) not in charged), Fraction(0))
    for r in range(1, ROUNDS + 1):
        missing += 0 if sel_key(r) in charged else rho_sel
        measured = any(k.startswith(f"{STAGE}/{node}/round-{r}/") and k != sel_key(r) for k in charged)
        missing += 0 if measured else rho_meas
    if missing > ledger.remaining(STAGE, LEVEL, node):
        raise BudgetExceededError(
            f"hgem {node}: {len(initial_ws)} initial workloads and {ROUNDS} rounds still need rho={missing} (≈{float(missing):.6g}) but the node has "
            f"{ledger.remaining(STAGE, LEVEL, node)} left of its allocation {rho_node}"
        )

    current = {"round": 0}
    normalisers = [norm(w) for w in workloads]

    def select(model_answers: np.ndarray) -> int:
        current["round"] += 1
        return session.select_worst_workload(STAGE, LEVEL, node_t, f"round-{current['round']}", workloads, normalisers,
                                             model_answers, eps0, delta_score)

    def stored_measurement(tag: str, w: Workload, rho: Fraction) -> InitialMeasurement:
        """Discrete Gaussian on ``w``'s integer counts at ``rho`` through the private session
        (charged and persisted before use, read back on a rerun), in the normalised units
        train_hgem sees: answers and σ divided by the workload's normaliser."""
        m = session.measure_workload(STAGE, LEVEL, node_t, w, rho, tag=tag)
        return InitialMeasurement(w, m.noisy_answer.astype(np.float64) / norm(w), float(m.scale) / norm(w))

    def measure(w: Workload) -> np.ndarray:
        return stored_measurement(f"round-{current['round']}", w, rho_meas).answers

    # the public-selected state workloads at ρ_initial each (no selection)
    initial = [stored_measurement("initial", w, rho_init) for w in initial_ws]
    base = seed if seed is not None else (cfg.sampling_seed or 0)
    gen_seed, sample_seed = _seeds(base, state)
    hcfg = hgem_config(gen_seed, prior_households=cfg.synthesis.prior_strength * n_g)
    device = default_device()
    log.info(f"hgem {node}: {len(initial)} initial workloads "
             f"(rho {float(rho_init):.4g} each), {len(workloads)} candidate workloads, {ROUNDS} rounds, "
             f"rho={float(rho_node):.6g} (eps0={eps0:.4g}, rho_meas/round={float(rho_meas):.4g}), device {device}")
    G = make_generator(domain, hcfg, device)
    if PRETRAIN_STEPS > 0:
        pretrain_public(G, public, workloads, steps=PRETRAIN_STEPS, lr=LR)
        log.info(f"hgem {node}: public pretraining done ({PRETRAIN_STEPS} steps)")

    def progress(rec, _G) -> None:
        log.info(f"hgem {node}: round {rec.round}/{ROUNDS} measured {rec.workload} "
                 f"({rec.steps} update steps, {rec.seconds:.1f}s)")

    def measurement_sigma(w: Workload) -> float:
        """Noise std per cell in the normalised units train_hgem sees (the discrete Gaussian's σ
        for this workload's L2 sensitivity and the per-round ρ, divided by the normaliser)."""
        return discrete_gaussian_sigma(w.sensitivity(domain, cfg.privacy_unit)[1], rho_meas) / norm(w)

    res = train_hgem(domain, workloads, select, measure, hcfg, generator=G, callback=progress,
                     measurement_sigma=measurement_sigma, initial=initial)
    synth = sample_households(res.mixture(), int(n_samples), seed=sample_seed,
                              geo=(int(state),) + (0,) * (len(domain.geography) - 1))
    save_npz_atomic(out, synth.to_npz)
    write_json_atomic(out.with_suffix(".json"), {
        "node": node,
        "n_samples": int(n_samples),
        "candidates": len(workloads),
        "settings": {**hcfg.__dict__, "hidden": list(hcfg.hidden), "pretrain_steps": PRETRAIN_STEPS,
                     "kway": KWAY, "per_group_count": KWAY_PER_GROUP_COUNT, "device": str(device)},
        "initial_workloads": [w.id for w in initial_ws],
        "budget": {"rho_node": str(rho_node), "rho_initial": str(rho_init), "rho_select": str(rho_sel),
                   "rho_measure": str(rho_meas), "epsilon0": eps0,
                   "score_sensitivity": delta_score, "household_normaliser": "the state's DP household count",
                   "person_normaliser": "N_G x public mean household size"},
        "rounds": [{"round": h.round, "workload": h.workload, "gamma": h.gamma, "steps": h.steps,
                    "max_measured_error": h.max_measured_error, "seconds": h.seconds} for h in res.history],
        "seconds": time.perf_counter() - t_start,
    })
    log.info(f"hgem {node}: {synth.n_households} households sampled in {time.perf_counter() - t_start:.1f}s")
    return str(out)


def _charged_keys(ledger, node: str) -> list[str]:
    prefix = f"{STAGE}/{node}/"
    return [c.key for c in ledger.charges() if c.key.startswith(prefix)]


def uniform_prior(paths: RunPaths, state: int, support_npz: str) -> str:
    """A ``weights`` npz (uniform 1/n over the H-GEM samples of ``state``) in the format of the
    prior-update state posteriors, so that ``puma_task`` can reweight the H-GEM support per PUMA
    (post-processing only; written once, reused on resume)."""
    out = paths.node_path("hgem_prior", node_key((int(state),)))
    if not out.exists():
        with np.load(support_npz, allow_pickle=False) as z:
            n = int(z["group"].shape[0])
        save_npz_atomic(out, lambda f: np.savez(f, weights=np.full(n, 1.0 / max(n, 1))))
    return str(out)


# -- Dask GPU resources -------------------------------------------------------------------------
def cluster_has_gpu(address: str) -> bool:
    """Whether any worker of the Dask cluster at ``address`` declares a ``GPU`` resource."""
    from distributed import Client

    with Client(address, set_as_default=False) as client:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return any(float((w.get("resources") or {}).get("GPU", 0)) > 0 for w in workers.values())


def gpu_resources(address: str) -> dict:
    """``{"GPU": 1}`` when the cluster has GPU workers (one H-GEM task per GPU at a time), else ``{}``.

    Use with ``dask.annotate(resources=...)`` around ``hgem_state_task.submit(...)``: Prefect's
    DaskTaskRunner submits through ``distributed.Client.submit``, which merges the active
    ``dask.annotate`` annotations into the task's scheduling constraints.
    """
    return {"GPU": 1} if cluster_has_gpu(address) else {}
