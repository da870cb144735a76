"""H-GEM accuracy: max / mean error of group- and person-level 3-way hierarchical queries.

Every H-GEM number here is the shipped code's: each run is :func:`engine.hgem.state.fit_state` /
:func:`engine.hgem.state.run_state` — the procedure ``tasks.hgem`` runs per state — with an
:class:`engine.hgem.settings.HGEMSettings` (the release config's ``advanced.hgem`` section), the same exact
budget split (``engine.hgem.privacy.state_budget``), the same normalisers (N_G, N_G × the public
mean household size) and the pipeline's mechanisms on in-memory data
(:func:`engine.hgem.state.local_oracles`: discrete Gaussian on the integer counts, exponential
mechanism on the session's scores; nothing charged). ρ from (ε, δ) by the pipeline's accountant
(``engine.privacy.eps_delta_to_rho``, Canonne-Kamath-Steinke), δ = 1/N_G². Differences
from a release: N_G is the exact household count of the private state (the pipeline's is a DP
count from the household-count stages), and the public fit may be cached across runs (it is a
function of public data and settings only).

Reproduces the shape of the H-GEM paper's Figure 1 (:func:`run_accuracy`): for ε ∈ {0.125, 0.25,
0.5, 1}, ≥ 5 runs, the max and mean absolute error of the model's normalised answers for
  * ``hgem``        H-GEM (public pretraining) on the full domain,
  * ``public``      the public-pretrained generator alone (ε-independent, no private rounds),
  * ``mwem_small``  MWEM (``benchmarks/baselines/mwem.py``) on the reduced ACS-SMALL-like domain,
                    same budget split and mechanisms,
  * ``hgem_small``  H-GEM on the same reduced domain (the like-for-like comparison with MWEM).
:func:`run_real` (``--real``) compares what is released: H-GEM's sampled households against the
prior update (``engine.synthesis.synthesize_node``, discrete Gaussian through ``local_measure``)
and the public data resampled. Errors are against the exact answers of the private data —
internal QA, never released.

``python benchmarks/hgem_accuracy.py`` runs a small version on ACS 2018 Vermont (private) with New
Hampshire as public data.
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
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.baselines.mwem import MWEMConfig, reduce_data, train_mwem  # noqa: E402
from engine.data import HierarchicalData  # noqa: E402
from engine.hgem.answers import AnswerPlan, exact_normalised_answers  # noqa: E402
from engine.hgem.config import make_generator  # noqa: E402
from engine.hgem.mixture import default_device  # noqa: E402
from engine.hgem.pretrain import pretrain_households  # noqa: E402
from engine.hgem.privacy import score_sensitivity, state_budget  # noqa: E402
from engine.hgem.settings import HGEMSettings  # noqa: E402
from engine.hgem.state import Normalisers, fit_state, local_oracles, pretrained_generator, run_state  # noqa: E402
from engine.hgem.workloads import candidate_workloads  # noqa: E402
from engine.privacy import discrete_gaussian, eps_delta_to_rho, exponential_mechanism  # noqa: E402
from engine.queries import PrivacyUnit, Workload, answer  # noqa: E402

_log = functools.partial(print, flush=True)
DATA_ROOT = Path(os.environ.get("DPRELEASE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
EPSILONS = (0.125, 0.25, 0.5, 1.0)


def load_state(file_name: str, year_dir: str = "acs2018_1yr") -> HierarchicalData:
    """One ACS PUMS person file encoded with the default domain spec and household rules."""
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file

    data, _ = load_person_file(DATA_ROOT / year_dir / file_name, load_domain_spec(), HouseholdRules())
    return data


def rho_of(epsilon: float, delta: float) -> Fraction:
    """The node's ρ for a target (ε, δ): the pipeline's conversion (CKS), exact as a Fraction."""
    return Fraction(eps_delta_to_rho(float(epsilon), float(delta), "cks"))


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


def _public_fit(public: HierarchicalData, settings: HGEMSettings, seed: int, device) -> dict:
    """GEM^Pub on the settings' candidates (public only): the generator's state_dict."""
    G = pretrained_generator(public, candidate_workloads(public.domain, settings), settings, seed, device)
    return {k: v.clone() for k, v in G.state_dict().items()}


def mwem_run(private: HierarchicalData, public: HierarchicalData, workloads: Sequence[Workload], true: Sequence[np.ndarray],
             rho: Fraction, config: MWEMConfig, unit: PrivacyUnit, device):
    """The MWEM baseline at ρ with H-GEM's split (no initial workloads) and mechanisms: the
    exponential mechanism at ε₀ on the max-error scores, the discrete Gaussian on the integer
    counts divided by the same public normalisers."""
    budget = state_budget(rho, config.rounds, Fraction(1, 2), Fraction(0))
    norm = Normalisers.of(private.n_households, public)

    def select(scores: np.ndarray, sensitivity: float) -> int:
        return int(exponential_mechanism(np.asarray(scores, dtype=float), sensitivity, budget.epsilon0))

    def measure(w: Workload) -> np.ndarray:
        noisy, _ = discrete_gaussian(np.rint(answer(private, w)).astype(np.int64), w.sensitivity(private.domain, unit)[1],
                                     budget.measure)
        return np.asarray(noisy, dtype=float) / norm(w)

    # MWEM scores its own histogram against the normalised private answers (``true``)
    sens = score_sensitivity(workloads, private.domain, unit, norm.households, norm.persons)
    return train_mwem(private.domain, workloads, true, select, measure, sens, config, device=device)


def run_accuracy(
    private: HierarchicalData,
    public: HierarchicalData,
    epsilons: Sequence[float] = EPSILONS,
    runs: int = 5,
    delta: float | None = None,
    settings: HGEMSettings | None = None,
    mwem_config: MWEMConfig | None = None,
    methods: Sequence[str] = ("hgem", "public", "mwem_small", "hgem_small"),
    reduce_kwargs: dict | None = None,
    unit: PrivacyUnit = "household",
    prior_strength: float = 0.1,
    device: str | None = None,
    log=_log,
) -> list[dict]:
    """One row per (method, ε, run, level) with the model's max / mean error and seconds.

    ``settings``: H-GEM's (candidates: ``kway_per_group_count`` 3-way attribute sets per |S_G| on
    the full domain; the reduced domain always uses all of them, as the paper's ACS-SMALL). No
    initial workloads: every round adaptive, as in the paper.
    """
    delta = delta if delta is not None else 1.0 / private.n_households**2
    settings = settings or HGEMSettings()
    mcfg = mwem_config or MWEMConfig()
    rows: list[dict] = []

    def add(method, eps, run, errs, secs):
        for level, e in errs.items():
            rows.append({"method": method, "epsilon": eps, "run": run, "level": level, **e, "seconds": secs})
        log(f"{method:11s} eps={eps!s:6s} run={run} " + "  ".join(
            f"{lv}: max {e['max']:.4f} mean {e['mean']:.5f}" for lv, e in errs.items()) + f"  ({secs:.1f}s)")

    cases = []
    if {"hgem", "public"} & set(methods):
        cases.append(("full", private, public, settings))
    if {"mwem_small", "hgem_small"} & set(methods):
        rp, spec = reduce_data(private, **(reduce_kwargs or {}))
        kw = dict(reduce_kwargs or {})
        kw.setdefault("group_attrs", spec.group_attrs)
        kw.setdefault("person_attrs", spec.person_attrs)
        cases.append(("small", rp, reduce_data(public, **kw)[0], replace(settings, kway_per_group_count=None)))
    for name, priv, pub, st in cases:
        ws = candidate_workloads(priv.domain, st)
        true = exact_normalised_answers(priv, ws)
        plan = AnswerPlan(priv.domain, ws, device=device)
        log(f"[{name}] {len(ws)} workloads, {plan.n_cells} queries, N_G={priv.n_households}, N_I={priv.n_persons}")
        pub_fits = {}
        for run in range(runs):
            t0 = time.perf_counter()
            pub_fits[run] = _public_fit(pub, st, run, device)
            if name == "full" and "public" in methods:
                G = make_generator(priv.domain, st, run, device)
                G.load_state_dict(pub_fits[run])
                add("public", "-", run, level_errors(ws, _hgem_answers(G, plan), true), time.perf_counter() - t0)
        for eps in epsilons:
            rho = rho_of(eps, delta)
            for run in range(runs):
                hg = "hgem" if name == "full" else "hgem_small"
                if hg in methods:
                    t0 = time.perf_counter()
                    fit = fit_state(pub, st, rho, priv.n_households, local_oracles(priv, unit), unit=unit, seed=run,
                                    prior_strength=prior_strength, device=device, public_fit=pub_fits[run])
                    add(hg, eps, run, level_errors(ws, _hgem_answers(fit.result.generator, plan), true), time.perf_counter() - t0)
                if name == "small" and "mwem_small" in methods:
                    t0 = time.perf_counter()
                    res = mwem_run(priv, pub, ws, true, rho, replace(mcfg, seed=run), unit, device)
                    add("mwem_small", eps, run, level_errors(ws, [res.answers(w) for w in ws], true), time.perf_counter() - t0)
    return rows


# -------------------------------------------------------------------- real data, sampled output
def run_real(
    private: HierarchicalData,
    public: HierarchicalData,
    epsilons: Sequence[float] = EPSILONS,
    runs: int = 5,
    settings: HGEMSettings | None = None,
    methods: Sequence[str] = ("hgem", "prior_update", "public"),
    unit: PrivacyUnit = "household",
    prior_strength: float = 0.1,
    pretrained_cache: Path | None = None,
    device: str | None = None,
    public_fit: str = "answers",
    log=_log,
) -> list[dict]:
    """Released-data comparison per private state: every method outputs N_G synthetic households
    of the state, scored with ``engine.queries.query_errors`` at level "ST" on H-GEM's candidate
    workloads (group and person level) — the H-GEM paper's metric on what is released.

    hgem          :func:`engine.hgem.state.run_state`, the pipeline's per-state procedure, at
                  ρ(ε, δ = 1/N_G²) with ``settings`` (the public-selected state workloads of
                  ``select_workloads(public)`` measured first with ``settings.initial_share``).
    prior_update  ``engine.synthesis.synthesize_node`` (MAP rule, ``prior_strength``) on the public
                  support with the same state workloads, whole ρ at the state node, discrete
                  Gaussian through ``engine.synthesis.local_measure``; systematic sampling of N_G
                  households.
    public        the public empirical distribution resampled (same sampler) to N_G households.
    device: where H-GEM trains and samples (None → cuda when visible, else cpu).
    public_fit: "answers" — GEM^Pub, the pipeline's (``settings.pretrain_steps``); "households" —
    an ablation: one component per public household, fitted to it (``pretrain_households``,
    B = the public household count). Ablations of the trainer's fields (e.g. ``network_lr_scale``)
    are fields of ``settings``.
    """
    from engine.queries import Support, query_errors
    from engine.synthesis import local_measure, select_workloads, synthesize_node
    from engine.synthesis import sample_households as support_sample
    from schemas.domain_spec import load_domain_spec
    from schemas.household_structure import household_structure

    settings = settings or HGEMSettings()
    if public_fit == "households":
        settings = replace(settings, batch_size=public.n_households)
    elif public_fit != "answers":
        raise ValueError(f"unknown public_fit {public_fit!r}")
    device = str(torch.device(device) if device else default_device())
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    log(f"H-GEM on {device} ({name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads), settings {settings.to_dict()}")
    rows: list[dict] = []
    support = Support.from_data(public)
    sel = select_workloads(public)
    structure = household_structure(load_domain_spec(), public.domain)  # as tasks.hgem samples (group quarters excluded)
    for st in private.nodes("ST"):
        priv = private.select(private.node_mask(st))
        dom = priv.domain
        n_g = priv.n_households
        delta = 1.0 / n_g**2
        ws = candidate_workloads(dom, settings)
        wg = [w for w in ws if w.level == "group"]
        wp = [w for w in ws if w.level == "person"]
        true = exact_normalised_answers(priv, ws)
        plan = AnswerPlan(dom, ws, device=device)  # the model's own answers, per H-GEM run
        geo = tuple(int(x) for x in priv.geo[0])

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
            s = settings
            cache = Path(pretrained_cache) / (f"ST{int(st[0])}_B{s.batch_size}_h{'-'.join(map(str, s.hidden))}"
                                              f"_z{s.z_dim}_lr{s.lr}_s{s.pretrain_steps}_k{s.kway_per_group_count}"
                                              f"{'_households' if public_fit == 'households' else ''}.pt")
        if "hgem" in methods and cache is not None and cache.exists():
            pub_state = torch.load(cache, map_location=device)
            log(f"ST={st[0]} public fit read from {cache}")
        elif "hgem" in methods:
            t0 = time.perf_counter()
            if public_fit == "households":
                G = make_generator(dom, settings, 0, device)
                pretrain_households(G, public, steps=settings.pretrain_steps, lr=settings.lr)
                pub_state = {k: v.clone() for k, v in G.state_dict().items()}
            else:
                pub_state = _public_fit(public, settings, 0, device)
            log(f"ST={st[0]} public pretraining ({time.perf_counter() - t0:.1f}s)")
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save(pub_state, cache)
        for run in range(runs):
            rng = np.random.default_rng(1000 + run)
            if "public" in methods:
                t0 = time.perf_counter()
                synth = support_sample(support, support.weights, n_g, rng, geo=geo)
                score(synth, "public", "-", run, time.perf_counter() - t0)
            for eps in epsilons:
                rho = rho_of(eps, delta)
                if "prior_update" in methods:
                    t0 = time.perf_counter()
                    res = synthesize_node(support, support.weights, sel.state, rho, local_measure(priv, unit, discrete_gaussian),
                                          n_g, rule="map", prior_strength=prior_strength)
                    synth = support_sample(support, res.weights, n_g, rng, geo=geo)
                    score(synth, "prior_update", eps, run, time.perf_counter() - t0)
                if "hgem" in methods:
                    t0 = time.perf_counter()
                    synth, fit = run_state(public, settings, rho, n_g, local_oracles(priv, unit), n_g, unit=unit,
                                           state=int(st[0]), initial_workloads=sel.state, seed=run,
                                           prior_strength=prior_strength, device=device, public_fit=pub_state,
                                           structure=structure)
                    model = level_errors(ws, _hgem_answers(fit.result.generator, plan), true)
                    score(synth, "hgem", eps, run, time.perf_counter() - t0,
                          {"model": model, "initial_share": str(settings.initial_share), "rounds": settings.rounds})
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
    d = HGEMSettings()
    ap.add_argument("--private", default="csv_pvt.zip")
    ap.add_argument("--public", default="csv_pnh.zip")
    ap.add_argument("--epsilons", default=",".join(str(e) for e in EPSILONS))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=d.rounds, help="hgem.rounds")
    ap.add_argument("--tmax", type=int, default=d.max_update_steps, help="hgem.max_update_steps (MWEM: its T_max)")
    ap.add_argument("--batch-size", type=int, default=d.batch_size, help="hgem.batch_size")
    ap.add_argument("--hidden", default=",".join(map(str, d.hidden)), help="hgem.hidden")
    ap.add_argument("--z-dim", type=int, default=d.z_dim, help="hgem.z_dim")
    ap.add_argument("--lr", type=float, default=d.lr, help="hgem.lr")
    ap.add_argument("--pretrain-steps", type=int, default=d.pretrain_steps, help="hgem.pretrain_steps")
    ap.add_argument("--per-group-count", type=int, default=d.kway_per_group_count, help="hgem.kway_per_group_count")
    ap.add_argument("--initial-share", default=str(d.initial_share),
                    help="--real: hgem.initial_share (a fraction such as 4/5; 0: every round adaptive, the paper's H-GEM)")
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
    ap.add_argument("--network-lr-scale", type=float, default=HGEMSettings.network_lr_scale,
                    help="--real ablation: private rounds' network learning rate = lr × this (0: only component weights move)")
    ap.add_argument("--pretrained-cache", default=None,
                    help="--real: directory for the public fits (reused across invocations; public data only)")
    args = ap.parse_args(argv)
    share = Fraction(args.initial_share)
    settings = HGEMSettings(rounds=args.rounds, max_update_steps=args.tmax, batch_size=args.batch_size, lr=args.lr,
                            hidden=tuple(int(h) for h in args.hidden.split(",")), z_dim=args.z_dim,
                            pretrain_steps=args.pretrain_steps, kway_per_group_count=args.per_group_count,
                            network_lr_scale=args.network_lr_scale,
                            initial_share=share if args.real else HGEMSettings.initial_share)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    if args.real:
        private = HierarchicalData.concat([load_state(f) for f in args.private.split(",")])
        public = HierarchicalData.concat([load_state(f) for f in args.public.split(",")])
        torch.manual_seed(0)
        rows = run_real(private, public, epsilons, args.runs, settings,
                        [m for m in args.methods.split(",") if m in ("hgem", "prior_update", "public")],
                        pretrained_cache=Path(args.pretrained_cache) if args.pretrained_cache else None,
                        device=args.device, public_fit=args.public_fit)
        print(summarise(rows))
        save_results(rows, Path(args.results_dir), args.name)
        return 0
    rows = run_accuracy(load_state(args.private), load_state(args.public), epsilons, args.runs, settings=settings,
                        mwem_config=MWEMConfig(rounds=max(args.rounds, 1), max_update_steps=args.tmax),
                        methods=args.methods.split(","), device=args.device)
    print(summarise(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
