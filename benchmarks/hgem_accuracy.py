"""H-GEM accuracy: max / mean error of group- and person-level 3-way hierarchical queries.

Reproduces the shape of the H-GEM paper's Figure 1: for ε ∈ {0.125, 0.25, 0.5, 1} and
δ = 1/N_G², ≥ 5 runs, the max and mean absolute error of normalised group-level and person-level
3-way queries for
  * ``hgem``        H-GEM (public pretraining when public data is given) on the full domain,
  * ``public``      the public-pretrained generator alone (ε-independent, no private rounds),
  * ``mwem_small``  MWEM on the reduced ACS-SMALL-like domain (engine.hgem.mwem.reduce_data),
  * ``hgem_small``  H-GEM on the same reduced domain (the like-for-like comparison with MWEM).
Errors are computed on the model answers f_q (for MWEM on the histogram) against the exact
answers of the private data — internal QA, never released. Privacy: ρ from (ε, δ) by
ε = ρ + 2√(ρ log 1/δ); per round ρ/T split by α between the exponential mechanism (ε₀²/8) and the
Gaussian measurement, through ``engine.privacy.mechanisms``.

The lead wires real data and the prior-update comparison through :func:`run_accuracy`, which
takes private / public HierarchicalData. ``python benchmarks/hgem_accuracy.py`` runs a small
version on ACS 2018 Vermont (private) with New Hampshire as public data.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.hgem.answers import AnswerPlan, exact_normalised_answers  # noqa: E402
from engine.hgem.mixture import default_device  # noqa: E402
from engine.hgem.mwem import MWEMConfig, reduce_data, train_mwem  # noqa: E402
from engine.hgem.privacy import (  # noqa: E402
    RoundBudget,
    gem_budget,
    measurement_l2_sensitivity,
    rho_from_epsilon,
    score_sensitivity,
    split_initial,
)
from engine.hgem.train import (  # noqa: E402
    HGEMConfig,
    InitialMeasurement,
    make_generator,
    pretrain_households,
    pretrain_public,
    score_select,
    train_hgem,
)
from engine.hgem.workloads import kway_workloads  # noqa: E402
from engine.hierarchical_data import HierarchicalData  # noqa: E402
from engine.queries import PrivacyUnit, Workload  # noqa: E402

_log = functools.partial(print, flush=True)
DATA_ROOT = Path(os.environ.get("DPRELEASE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def load_state(file_name: str, year_dir: str = "acs2018_1yr") -> HierarchicalData:
    """One ACS PUMS person file encoded with the default domain spec and household rules."""
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file

    data, _ = load_person_file(DATA_ROOT / year_dir / file_name, load_domain_spec(), HouseholdRules())
    return data


def make_oracles(
    private: HierarchicalData,
    workloads: Sequence[Workload],
    true_answers: Sequence[np.ndarray],
    budget: RoundBudget,
    unit: PrivacyUnit = "household",
    selection: str = "exponential_mechanism",
):
    """``select(scores, sensitivity)`` and ``measure(workload)`` on engine.privacy.mechanisms.

    Measurements are Gaussian on the normalised answers with the normalised L2 sensitivity
    (count L2 from Workload.sensitivity / N_G or N_I), ρ_meas per round from ``budget``.
    """
    from engine.privacy import mechanisms

    index = {w: i for i, w in enumerate(workloads)}
    sel = getattr(mechanisms, selection)

    def select(scores: np.ndarray, sensitivity: float) -> int:
        return int(sel(np.asarray(scores, dtype=float), sensitivity, budget.epsilon0))

    def measure(w: Workload) -> np.ndarray:
        return gaussian_measurement(private, w, true_answers[index[w]], budget.rho_measure, unit).answers

    return select, measure


def gaussian_measurement(private: HierarchicalData, w: Workload, answers: np.ndarray, rho: float,
                         unit: PrivacyUnit = "household") -> InitialMeasurement:
    """Gaussian noise (engine.privacy.mechanisms) at cost ρ on ``w``'s normalised ``answers``, with
    the normalised L2 sensitivity (count L2 from Workload.sensitivity / N_G or N_I), and its σ."""
    from engine.privacy import mechanisms

    l2 = measurement_l2_sensitivity(w, private.domain, unit, private.n_households, private.n_persons)
    noisy, sigma = mechanisms.gaussian(np.asarray(answers, dtype=float), l2, rho)
    return InitialMeasurement(w, np.asarray(noisy, dtype=float), float(sigma))


EPSILONS = (0.125, 0.25, 0.5, 1.0)


def level_errors(workloads: Sequence[Workload], answers: Sequence[np.ndarray], true: Sequence[np.ndarray]) -> dict:
    """max / mean absolute error over all queries (cells), per level."""
    out = {}
    for level in ("group", "person"):
        errs = [np.abs(np.asarray(a) - t) for w, a, t in zip(workloads, answers, true) if w.level == level]
        if errs:
            e = np.concatenate(errs)
            out[level] = {"max": float(e.max()), "mean": float(e.mean()), "queries": int(e.size)}
    return out


def _hgem_answers(G, plan) -> list[np.ndarray]:
    with torch.no_grad():
        return [x.cpu().numpy().astype(np.float64) for x in plan.split(plan.answers(G()))]


def _run_hgem(private, workloads, true, eps, delta, cfg, unit, seed, device, pub_state=None, prior_strength=0.1,
              initial_workloads: Sequence[Workload] = (), initial_share: float = 0.0):
    """With a public fit (``pub_state``): the MAP update with the relative-entropy prior to it
    (α = prior_strength × N_G, the measurements' σ known). Without public data there is no prior
    to stay close to, and H-GEM is the paper's: H-GEM-Update (Algorithm 4) with the EMA output.
    ``initial_share`` of ρ first measures ``initial_workloads`` evenly (no selection), the
    ``cfg.rounds`` adaptive rounds split the rest (``engine.hgem.privacy.split_initial``)."""
    rho = rho_from_epsilon(eps, delta)
    rho_each, rho_rounds = split_initial(rho, initial_share, len(initial_workloads))
    initial = [gaussian_measurement(private, w, a, rho_each, unit)
               for w, a in zip(initial_workloads, exact_normalised_answers(private, initial_workloads))] if rho_each else []
    if rho_rounds <= 1e-12 * rho:  # the initial workloads take all of ρ: no adaptive rounds
        cfg = replace(cfg, rounds=0)
    elif cfg.rounds == 0:
        raise ValueError("rounds = 0 needs initial_share = 1")
    # without rounds the oracles are never called: their budget is a placeholder over the whole ρ
    budget = gem_budget(rho_rounds if cfg.rounds else rho, max(cfg.rounds, 1), alpha=0.5)
    select, measure = make_oracles(private, workloads, true, budget, unit)
    dom = private.domain
    if pub_state is None:
        cfg = replace(cfg, seed=seed, update="gem", output="ema")
        sigma = None
    else:
        cfg = replace(cfg, seed=seed, update="map", prior_households=prior_strength * private.n_households)
        l2 = {w: measurement_l2_sensitivity(w, dom, unit, private.n_households, private.n_persons) for w in workloads}
        sigma = lambda w: budget.sigma(l2[w])  # noqa: E731
    G = make_generator(dom, cfg, device)
    if pub_state is not None:
        G.load_state_dict(pub_state)
    sens = score_sensitivity(workloads, dom, unit, private.n_households, private.n_persons)
    return train_hgem(dom, workloads, score_select(true, select, sens), measure, cfg, generator=G, measurement_sigma=sigma,
                      initial=initial)


def run_accuracy(
    private: HierarchicalData,
    public: HierarchicalData | None = None,
    epsilons: Sequence[float] = EPSILONS,
    runs: int = 5,
    delta: float | None = None,
    hgem_config: HGEMConfig | None = None,
    mwem_config: MWEMConfig | None = None,
    pretrain_steps: int = 300,
    per_group_count: int | None = 32,
    methods: Sequence[str] = ("hgem", "public", "mwem_small", "hgem_small"),
    reduce_kwargs: dict | None = None,
    unit: str = "household",
    device: str | None = None,
    log=_log,
) -> list[dict]:
    """One row per (method, ε, run, level) with max / mean error and seconds.

    ``per_group_count``: 3-way attribute sets sampled per |S_G| on the full domain (paper: 128);
    None → all. The reduced domain always uses all 3-way sets (paper: ACS-SMALL).
    """
    delta = delta if delta is not None else 1.0 / private.n_households**2
    cfg = hgem_config or HGEMConfig()
    mcfg = mwem_config or MWEMConfig()
    rows: list[dict] = []

    def add(method, eps, run, errs, secs):
        for level, e in errs.items():
            rows.append({"method": method, "epsilon": eps, "run": run, "level": level, **e, "seconds": secs})
        log(f"{method:11s} eps={eps!s:6s} run={run} " + "  ".join(
            f"{lv}: max {e['max']:.4f} mean {e['mean']:.5f}" for lv, e in errs.items()) + f"  ({secs:.1f}s)")

    settings = []
    if {"hgem", "public"} & set(methods):
        ws = kway_workloads(private.domain, 3, per_group_count=per_group_count, seed=0)
        settings.append(("full", private, public, ws))
    if {"mwem_small", "hgem_small"} & set(methods):
        rp, spec = reduce_data(private, **(reduce_kwargs or {}))
        kw = dict(reduce_kwargs or {})
        kw.setdefault("group_attrs", spec.group_attrs)
        kw.setdefault("person_attrs", spec.person_attrs)
        rpub = reduce_data(public, **kw)[0] if public is not None else None
        settings.append(("small", rp, rpub, kway_workloads(rp.domain, 3)))
    for name, priv, pub, ws in settings:
        true = exact_normalised_answers(priv, ws)
        plan = AnswerPlan(priv.domain, ws, device=device)
        log(f"[{name}] {len(ws)} workloads, {plan.n_cells} queries, N_G={priv.n_households}, N_I={priv.n_persons}")
        pub_states = {}
        for run in range(runs):
            if pub is not None:
                t0 = time.perf_counter()
                G = make_generator(priv.domain, replace(cfg, seed=run), device)
                pretrain_public(G, pub, ws, steps=pretrain_steps, lr=cfg.lr)
                pub_states[run] = {k: v.clone() for k, v in G.state_dict().items()}
                if name == "full" and "public" in methods:
                    add("public", "-", run, level_errors(ws, _hgem_answers(G, plan), true), time.perf_counter() - t0)
        for eps in epsilons:
            for run in range(runs):
                hg = "hgem" if name == "full" else "hgem_small"
                if hg in methods:
                    t0 = time.perf_counter()
                    G = _run_hgem(priv, ws, true, eps, delta, cfg, unit, run, device, pub_states.get(run)).generator
                    add(hg, eps, run, level_errors(ws, _hgem_answers(G, plan), true), time.perf_counter() - t0)
                if name == "small" and "mwem_small" in methods:
                    t0 = time.perf_counter()
                    budget = gem_budget(rho_from_epsilon(eps, delta), mcfg.rounds, alpha=0.5)
                    select, measure = make_oracles(priv, ws, true, budget, unit)
                    sens = score_sensitivity(ws, priv.domain, unit, priv.n_households, priv.n_persons)
                    res = train_mwem(priv.domain, ws, true, select, measure, sens, replace(mcfg, seed=run), device=device)
                    add("mwem_small", eps, run, level_errors(ws, [res.answers(w) for w in ws], true),
                        time.perf_counter() - t0)
    return rows


# -------------------------------------------------------------------- real data, sampled output
def run_real(
    private: HierarchicalData,
    public: HierarchicalData,
    epsilons: Sequence[float] = EPSILONS,
    runs: int = 5,
    hgem_config: HGEMConfig | None = None,
    pretrain_steps: int = 3000,
    per_group_count: int | None = 8,
    methods: Sequence[str] = ("hgem", "prior_update", "public"),
    unit: str = "household",
    prior_strength: float = 0.1,
    pretrained_cache: Path | None = None,
    device: str | None = None,
    public_fit: str = "answers",
    initial_share: float = 0.0,
    log=_log,
) -> list[dict]:
    """Released-data comparison per private state: every method outputs N_G synthetic households
    of the state, scored with ``engine.metrics.query_errors`` at level "ST" on the 3-way
    candidate workloads (group and person level) — the H-GEM paper's metric on what is released.

    hgem          public pretraining (once per state, public only, no privacy cost) + T rounds at
                  ρ(ε, δ = 1/N_G²), measurement σ passed to the MAP update; households sampled
                  from the output mixture.
    prior_update  ``engine.synthesis.synthesize_node`` (MAP rule, prior_strength 0.1) on the
                  public support with the state workloads of ``select_workloads(public)``, whole ρ
                  at the state node; systematic sampling of N_G households.
    public        the public empirical distribution resampled (same sampler) to N_G households.
    Noise: benchmark-only numpy Gaussian / exponential mechanism (``make_oracles`` uses
    engine.privacy.mechanisms for H-GEM; the prior update uses a seeded numpy Gaussian).
    device: where H-GEM trains and samples (None → cuda when visible, else cpu).
    public_fit: "answers" — GEM^Pub, the generator fitted to the public answers of the candidate
    workloads (``pretrain_public``, B from ``hgem_config``); "households" — one component per public
    household, fitted to it (``pretrain_households``, B = the public household count).
    initial_share: the share of H-GEM's ρ that first measures the prior update's own state
    workloads (``select_workloads(public).state``, evenly, no selection); the adaptive rounds
    (``hgem_config.rounds``) spend the rest. 0: all adaptive (the paper's H-GEM).
    """
    from fractions import Fraction

    from engine.hgem.sampling import sample_households as hgem_sample
    from engine.metrics import query_errors
    from engine.prior_update import sample_households as support_sample
    from engine.privacy.accountant import sigma_for_rho
    from engine.support import Support
    from engine.synthesis import local_measure, synthesize_node
    from engine.workload_selection import select_workloads

    cfg = hgem_config or HGEMConfig()
    if public_fit == "households":
        cfg = replace(cfg, batch_size=public.n_households)
    elif public_fit != "answers":
        raise ValueError(f"unknown public_fit {public_fit!r}")
    device = str(torch.device(device) if device else default_device())
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    log(f"H-GEM on {device} ({name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads)")
    rows: list[dict] = []
    support = Support.from_data(public)
    sel = select_workloads(public)
    for st in private.nodes("ST"):
        priv = private.select(private.node_mask(st))
        dom = priv.domain
        n_g = priv.n_households
        delta = 1.0 / n_g**2
        ws = kway_workloads(dom, 3, per_group_count=per_group_count, seed=0)
        wg = [w for w in ws if w.level == "group"]
        wp = [w for w in ws if w.level == "person"]
        true = exact_normalised_answers(priv, ws)
        plan = AnswerPlan(dom, ws, device=device)  # the model's own answers, per H-GEM run

        def score(synth, method, eps, run, secs, extra=None, *, wg=wg, wp=wp, priv=priv, st=st):  # this state's workloads, bound now
            for level, wl in (("group", wg), ("person", wp)):
                q = query_errors(priv, synth, wl, "ST")
                rows.append({"state": int(st[0]), "method": method, "epsilon": eps, "run": run, "level": level,
                             "max": q["max_error"], "mean": q["mean_error"], "seconds": secs, **(extra or {})})
            g, p = rows[-2], rows[-1]
            log(f"ST={st[0]} {method:12s} eps={eps!s:6s} run={run} group max {g['max']:.4f} mean {g['mean']:.5f} "
                f"person max {p['max']:.4f} mean {p['mean']:.5f} ({secs:.1f}s)")

        pub_state = None
        cache = None
        if pretrained_cache is not None:  # the public fit depends only on public data and settings
            cache = Path(pretrained_cache) / (f"ST{int(st[0])}_B{cfg.batch_size}_h{'-'.join(map(str, cfg.hidden))}"
                                              f"_z{cfg.z_dim}_lr{cfg.lr}_s{pretrain_steps}_k{per_group_count}"
                                              f"{'_households' if public_fit == 'households' else ''}.pt")
        if "hgem" in methods and cache is not None and cache.exists():
            pub_state = torch.load(cache, map_location=device)
            log(f"ST={st[0]} public fit read from {cache}")
        elif "hgem" in methods:
            t0 = time.perf_counter()
            G = make_generator(dom, cfg, device)
            if public_fit == "households":
                hist = pretrain_households(G, public, steps=pretrain_steps, lr=cfg.lr)
            else:
                hist = pretrain_public(G, public, ws, steps=pretrain_steps, lr=cfg.lr)
            pub_state = {k: v.clone() for k, v in G.state_dict().items()}
            log(f"ST={st[0]} pretraining: {len(hist)} steps, final loss {hist[-1]:.4g} ({time.perf_counter() - t0:.1f}s)")
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save(pub_state, cache)
        for run in range(runs):
            rng = np.random.default_rng(1000 + run)
            if "public" in methods:
                t0 = time.perf_counter()
                synth = support_sample(support, support.weights, n_g, rng, geo=tuple(int(x) for x in st) + (0,) * (len(dom.geography) - len(st)))
                score(synth, "public", "-", run, time.perf_counter() - t0)
            for eps in epsilons:
                rho = rho_from_epsilon(eps, delta)
                if "prior_update" in methods:
                    t0 = time.perf_counter()

                    def noise(counts, l2, rho_w, *, rng=rng):  # this run's generator, bound now
                        sigma = sigma_for_rho(l2, rho_w)
                        return np.asarray(counts, float) + rng.normal(0.0, sigma, np.shape(counts)), sigma

                    res = synthesize_node(support, support.weights, sel.state, Fraction(rho).limit_denominator(10**12),
                                          local_measure(priv, unit, noise), n_g, rule="map", prior_strength=0.1)
                    synth = support_sample(support, res.weights, n_g, rng, geo=tuple(int(x) for x in priv.geo[0]))
                    score(synth, "prior_update", eps, run, time.perf_counter() - t0)
                if "hgem" in methods:
                    t0 = time.perf_counter()
                    out = _run_hgem(priv, ws, true, eps, delta, cfg, unit, run, device, pub_state, prior_strength,
                                    sel.state, initial_share)
                    synth = hgem_sample(out.mixture(), n_g, seed=run, geo=tuple(int(x) for x in priv.geo[0]))
                    model = level_errors(ws, _hgem_answers(out.generator, plan), true)
                    score(synth, "hgem", eps, run, time.perf_counter() - t0,
                          {"model": model, "initial_share": initial_share, "rounds": cfg.rounds})
    return rows


def save_results(rows: list[dict], out_dir: Path, name: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(rows, indent=2, default=str))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
    for ax, (level, stat) in zip(axes, [(lv, st) for lv in ("group", "person") for st in ("max", "mean")]):
        for m in sorted({r["method"] for r in rows}):
            sel = [r for r in rows if r["method"] == m and r["level"] == level]
            eps = sorted({r["epsilon"] for r in sel if r["epsilon"] != "-"})
            if not eps:
                v = np.mean([r[stat] for r in sel])
                ax.axhline(v, ls="--", label=m, color="gray")
                continue
            ax.plot(eps, [np.mean([r[stat] for r in sel if r["epsilon"] == e]) for e in eps], "o-", label=m)
        ax.set_xscale("log")
        ticks = sorted({r["epsilon"] for r in rows if r["epsilon"] != "-"})
        ax.set_xticks(ticks, [f"{e:g}" for e in ticks])
        ax.minorticks_off()
        ax.set_title(f"{level} {stat} error")
        ax.set_xlabel("ε")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / f"{name}.png", dpi=100)


def summarise(rows: list[dict]) -> str:
    keys = sorted({(r["method"], str(r["epsilon"]), r["level"]) for r in rows})
    lines = [f"{'method':11s} {'eps':>6s} {'level':6s} {'max err':>16s} {'mean err':>18s} runs"]
    for m, e, lv in keys:
        sel = [r for r in rows if r["method"] == m and str(r["epsilon"]) == e and r["level"] == lv]
        mx = np.array([r["max"] for r in sel])
        mn = np.array([r["mean"] for r in sel])
        se = lambda x: x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0.0  # noqa: E731
        lines.append(f"{m:11s} {e:>6s} {lv:6s} {mx.mean():.4f} ± {se(mx):.4f} {mn.mean():.5f} ± {se(mn):.5f} {len(sel)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--private", default="csv_pvt.zip")
    ap.add_argument("--public", default="csv_pnh.zip")
    ap.add_argument("--epsilons", default=",".join(str(e) for e in EPSILONS))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tmax", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--hidden", default="256,512")
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--per-group-count", type=int, default=32)
    ap.add_argument("--methods", default="hgem,public,mwem_small,hgem_small")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="write rows as JSON here")
    ap.add_argument("--real", action="store_true",
                    help="released-data comparison (hgem vs prior_update vs public, query_errors at ST); "
                         "--private/--public take comma-separated state files")
    ap.add_argument("--results-dir", default=str(Path(__file__).resolve().parent / "results"),
                    help="--real: where <name>.{json,png} go")
    ap.add_argument("--name", default="hgem_accuracy_real", help="--real: file name stem of the results")
    ap.add_argument("--public-fit", choices=("answers", "households"), default="answers",
                    help="--real: H-GEM's public pretraining (run_real's public_fit)")
    ap.add_argument("--network-lr-scale", type=float, default=1.0,
                    help="--real: private rounds' network learning rate = lr × this (0: only component weights move)")
    ap.add_argument("--initial-share", type=float, default=0.0,
                    help="--real: share of H-GEM's rho that first measures the prior update's public-selected "
                         "state workloads (no selection); the --rounds adaptive rounds spend the rest")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--pretrained-cache", default=None,
                    help="--real: directory for the public fits (reused across invocations; public data only)")
    args = ap.parse_args(argv)
    if args.real:
        from engine.hierarchical_data import HierarchicalData as HD

        private = HD.concat([load_state(f) for f in args.private.split(",")])
        public = HD.concat([load_state(f) for f in args.public.split(",")])
        cfg = HGEMConfig(rounds=args.rounds, max_update_steps=args.tmax, batch_size=args.batch_size, lr=args.lr,
                         hidden=tuple(int(h) for h in args.hidden.split(",")), z_dim=32,
                         network_lr_scale=args.network_lr_scale)
        torch.manual_seed(0)
        rows = run_real(private, public, [float(e) for e in args.epsilons.split(",")], args.runs, cfg,
                        args.pretrain_steps, args.per_group_count,
                        [m for m in args.methods.split(",") if m in ("hgem", "prior_update", "public")],
                        pretrained_cache=Path(args.pretrained_cache) if args.pretrained_cache else None,
                        device=args.device, public_fit=args.public_fit, initial_share=args.initial_share)
        print(summarise(rows))
        save_results(rows, Path(args.results_dir), args.name)
        return 0
    private = load_state(args.private)
    public = load_state(args.public) if args.public else None
    cfg = HGEMConfig(rounds=args.rounds, max_update_steps=args.tmax, batch_size=args.batch_size,
                     hidden=tuple(int(h) for h in args.hidden.split(",")))
    rows = run_accuracy(private, public, [float(e) for e in args.epsilons.split(",")], args.runs,
                        hgem_config=cfg, mwem_config=MWEMConfig(rounds=args.rounds, max_update_steps=args.tmax),
                        pretrain_steps=args.pretrain_steps, per_group_count=args.per_group_count,
                        methods=args.methods.split(","), device=args.device)
    print(summarise(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
