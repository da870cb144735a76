"""Synthesis accuracy: prior update (MAP / Tao IDE) against the public-only prior, independent noisy
marginals and MWEM from a uniform start, on the ACS 2018 12-state split.

Set-up (the default release, ``deploy/releases/acs2018_default.yaml``):
  private = DE, ME, MT, NE, NM, VT;  public = ID, ND, NH, RI, SD, WY (merged into one support).
  ε ∈ {0.1, 0.25, 0.5, 1, 2}, δ = 1/N_G² (N_G = private households), ρ = eps_delta_to_rho(ε, δ, "cks").

Budget: the whole ρ goes to synthesis, split like the default config's two synthesis stages
(state_synthesis : puma_synthesis = 0.45 : 0.45 = 50/50): every state node gets ρ/2 and every PUMA
node ρ/2 (nodes of one level are disjoint: parallel composition; state then PUMA: sequential, total
ρ). The count-of-counts stage is NOT run: household totals per node are the true counts (the
pipeline treats housing-unit counts per PUMA as public), and every method samples exactly each
PUMA's true number of households. Inside a node ρ is split evenly over its workloads
(``engine.synthesis._node.measure_node``).

Noise: BENCHMARK-ONLY numpy samplers (seeded, fast): continuous Gaussian N(0, σ²) with
σ = Δ₂/√(2ρ) for measurements, and permute-and-flip as report-noisy-max with exponential noise of
scale 2Δ/ε (identical output distribution, Ding et al. 2021) for MWEM's selection. The release
path uses OpenDP's discrete Gaussian through the privacy ledger instead; none of this code is
used by a release.

Methods (column ``method``):
  map      prior update, noise-aware MAP rule (pipeline default, prior_strength 0.1): per state
           ``synthesize_node`` from the public empirical distribution with the state workloads of
           ``select_workloads(public)``, then per PUMA from the state posterior with the PUMA
           workloads; households drawn with ``sample_households`` (systematic) to the PUMA count.
           ``map@a`` = the same with prior_strength a (``--prior-strengths``).
  ide      the same with Tao et al.'s exact IDE rule (rule="ide", T = 3 sweeps).
  public   ε = 0: the public empirical distribution resampled (same sampler) to every PUMA's count;
           independent of ε (computed once per run and shown in every ε column).
  indep    independent measured marginals: per PUMA (whole ρ, no state stage), noisy 1-way
           marginals of every group attribute (NP included; L2 sensitivity 1) and every person
           attribute (person level, L2 sensitivity M) at ρ/(k_G + k_I) each; households drawn with
           independent group attributes, persons with independent person attributes. Derived
           attributes (householder's age/sex/race …, R18, MULTG, NP vs persons' RELP) are therefore
           incoherent — that is the point of the baseline.
  mwem     MWEM over the public support from a UNIFORM start (PMW-Pub ablation, Liu et al. Fig. 8):
           weights uniform over the DISTINCT public households (the public data domain X̂; uniform
           over rows would be the public empirical distribution itself), then ``pmw_pub`` per state
           (T_state rounds over the state workloads) and per PUMA (T_puma rounds over the PUMA
           workloads, continuing from the state's output), each node at the same ρ as the prior
           update; per round ρ_node/T, half to permute-and-flip (ε₀ = √(2ρ_sel), charged as pure
           DP ρ = ε₀²/2), half to the Gaussian measurement.

Metrics (against the confidential private data — internal QA only):
  {group,person}_{max,mean}_{ST,PUMA}: max / mean absolute error of normalised 3-way hierarchical
      queries per node, averaged over the nodes (``engine.queries.query_errors`` semantics, computed
      with cached true answers), on a fixed seeded random subset of ``--workloads`` 3-way workloads
      per query level;
  l1_2way_PUMA: average L1 distance of 50 random 2-way marginals per PUMA (``two_way_l1``, fixed pairs).
Every number is the mean ± standard error over ``--runs`` runs.

Timing: the synthesis stage of the MAP rule (6 private states: state + PUMA updates, measurement
and sampling, including building the incidence matrices on a fresh support) next to the
public-only baseline's, single process. ``--replicate K`` instead runs a scale test: the private
input replicated K× (copies with shifted PUMA codes, so every copy keeps its PUMA structure as new
PUMAs of the same states) through the MAP synthesis stage once; reports wall time and peak RSS.

    python benchmarks/synthesis_accuracy.py                      # full: 5 ε × 5 runs
    python benchmarks/synthesis_accuracy.py --quick              # 1 run, 2 ε, fewer workloads
    python benchmarks/synthesis_accuracy.py --replicate 10       # scale test

Results (JSON + PNG) go to ``--out`` (default ``benchmarks/results/``, gitignored).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers.pmw_pub import pmw_pub  # noqa: E402
from engine.data import HierarchicalData  # noqa: E402
from engine.privacy import eps_delta_to_rho, sigma_for_rho  # noqa: E402
from engine.queries import Support, Workload, answer, household_cell_pairs, k_way_workloads, node_index, two_way_l1  # noqa: E402
from engine.synthesis import WorkloadSelection, local_measure, sample_households, select_workloads, synthesize_node  # noqa: E402

DATA_ROOT = Path(os.environ.get("DPRELEASE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
YEAR_DIR = "acs2018_1yr"
PRIVATE_STATES = ("de", "me", "mt", "ne", "nm", "vt")
PUBLIC_STATES = ("id", "nd", "nh", "ri", "sd", "wy")
EPSILONS = (0.1, 0.25, 0.5, 1.0, 2.0)
STAGE_SPLIT = {"state": 0.5, "puma": 0.5}   # state_synthesis : puma_synthesis of the default config
UNIT = "household"
METRICS = (
    "group_max_ST", "group_mean_ST", "person_max_ST", "person_mean_ST",
    "group_max_PUMA", "group_mean_PUMA", "person_max_PUMA", "person_mean_PUMA",
    "l1_2way_PUMA",
)


# ------------------------------------------------------------------------------------ data
def load_states(codes: Sequence[str], year_dir: str = YEAR_DIR) -> HierarchicalData:
    """ACS PUMS person files (``csv_p{code}.zip``) encoded with the default domain spec and rules."""
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file

    spec = load_domain_spec()
    return HierarchicalData.concat([load_person_file(DATA_ROOT / year_dir / f"csv_p{c}.zip", spec, HouseholdRules())[0] for c in codes])


def replicate(data: HierarchicalData, k: int) -> HierarchicalData:
    """``k`` copies of ``data``; copy j has its PUMA codes shifted by j·base (base a power of ten
    above every code), so each copy keeps its PUMA structure as new PUMAs of the same states."""
    if k <= 1:
        return data
    col = data.domain.geography.index("PUMA")
    base = 10 ** len(str(int(data.geo[:, col].max())))
    if (k - 1) * base + int(data.geo[:, col].max()) >= 1 << 17:  # engine.queries.node_index keys
        raise ValueError(f"cannot shift PUMA codes {k} times below 2^17")
    parts = []
    for j in range(k):
        geo = data.geo.copy()
        geo[:, col] += j * base
        parts.append(data.with_geo(geo))
    return HierarchicalData.concat(parts)


def distinct_uniform_weights(data: HierarchicalData) -> np.ndarray:
    """Weights uniform over the DISTINCT households (group codes + persons in order), i.e. the
    uniform distribution over the public data domain X̂ spread over its duplicate rows."""
    d = data.domain
    k_i = len(d.person)
    pad = np.full((data.n_households, d.max_size * k_i), -1, dtype=np.int64)
    rows = data.person_household
    slot = data.person_slot
    for j in range(k_i):
        pad[rows, slot * k_i + j] = data.person[:, j]
    key = np.concatenate([data.group.astype(np.int64), pad], axis=1)
    _, inv, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    return 1.0 / (len(counts) * counts[inv])


@dataclass
class Node:
    code: tuple[int, ...]
    data: HierarchicalData
    n_households: int
    children: list[Node] = field(default_factory=list)


def node_tree(private: HierarchicalData) -> list[Node]:
    """States with their PUMAs (private data and true household count of every node)."""
    states = []
    for st in private.nodes("ST"):
        sd = private.select(private.node_mask(st))
        node = Node(st, sd, sd.n_households)
        for pu in sd.nodes("PUMA"):
            pd = sd.select(sd.node_mask(pu))
            node.children.append(Node(pu, pd, pd.n_households))
        states.append(node)
    return states


# ------------------------------------------------------------------- benchmark-only noise
class NumpyNoise:
    """BENCHMARK-ONLY mechanisms on a seeded numpy Generator (the release uses OpenDP via the ledger)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def noise(self, counts: np.ndarray, l2: float, rho) -> tuple[np.ndarray, float]:
        """Continuous Gaussian: counts + N(0, σ²), σ = Δ₂/√(2ρ)  (ρ-zCDP)."""
        sigma = sigma_for_rho(l2, rho)
        return np.asarray(counts, dtype=np.float64) + self.rng.normal(0.0, sigma, np.shape(counts)), sigma

    def permute_and_flip(self, scores: np.ndarray, sensitivity: float, epsilon: float) -> int:
        """Report-noisy-max with Exp(scale 2Δ/ε) noise ≡ permute-and-flip (ε-DP)."""
        s = np.asarray(scores, dtype=np.float64)
        return int(np.argmax(s + self.rng.exponential(2.0 * sensitivity / epsilon, s.shape)))


# ------------------------------------------------------------------------------- methods
@dataclass
class Context:
    private: HierarchicalData
    public: HierarchicalData
    support: Support
    selection: WorkloadSelection
    states: list[Node]
    prior: np.ndarray                       # public empirical distribution
    uniform_prior: np.ndarray | None = None  # uniform over distinct public households (MWEM)
    mwem_rounds: tuple[int, int] = (8, 3)
    failures: list = field(default_factory=list)   # failed node updates (see run_prior_update)

    @classmethod
    def build(cls, private: HierarchicalData, public: HierarchicalData, selection: WorkloadSelection | None = None, mwem_rounds=(8, 3)) -> Context:
        support = Support.from_data(public)
        sel = selection or select_workloads(public)
        return cls(private, public, support, sel, node_tree(private), support.weights.copy(), None, tuple(mwem_rounds))

    def fresh_support(self) -> Context:
        """Same context on a new Support (cold incidence cache), for timings."""
        c = Context(self.private, self.public, Support.from_data(self.public), self.selection, self.states, self.prior, self.uniform_prior, self.mwem_rounds)
        return c


def _place(parts: list[HierarchicalData]) -> HierarchicalData:
    return HierarchicalData.concat(parts)


def run_prior_update(ctx: Context, rho: float, rng: np.random.Generator, rule: str = "map", prior_strength: float = 0.1) -> HierarchicalData:
    """Tao et al. Alg. 2 through ``synthesize_node``: state from the public prior, PUMA from the
    state posterior; then systematic sampling to each PUMA's household count."""
    noise = NumpyNoise(rng)
    rho_s = Fraction(rho) * Fraction(STAGE_SPLIT["state"]).limit_denominator()
    rho_p = Fraction(rho) * Fraction(STAGE_SPLIT["puma"]).limit_denominator()
    def node(prior, data, workloads, rho_n, total):
        # A failed update (exception or non-finite weights — seen with rule="ide" at small ε) is
        # recorded in ctx.failures and the node keeps its prior, so the run can go on.
        try:
            w = synthesize_node(ctx.support, prior, workloads, rho_n, local_measure(data, UNIT, noise.noise), total, rule=rule, prior_strength=prior_strength, sweeps=3).weights
            if np.all(np.isfinite(w)) and w.sum() > 0:
                return w
            err = "non-finite weights"
        except Exception as e:  # noqa: BLE001 — benchmark bookkeeping, reported in the JSON
            err = f"{type(e).__name__}: {e}"[:200]
        ctx.failures.append({"rule": rule, "rho": float(rho_n), "workloads": len(workloads), "error": err})
        return np.asarray(prior, dtype=np.float64) / np.sum(prior)

    parts = []
    for st in ctx.states:
        w_st = node(ctx.prior, st.data, ctx.selection.state, rho_s, st.n_households)
        for pu in st.children:
            w_pu = node(w_st, pu.data, ctx.selection.puma, rho_p, pu.n_households)
            parts.append(sample_households(ctx.support, w_pu, pu.n_households, rng, geo=pu.code))
    return _place(parts)


def run_public_only(ctx: Context, rng: np.random.Generator) -> HierarchicalData:
    """ε = 0: the public empirical distribution, same sampler, to each PUMA's household count."""
    parts = []
    for st in ctx.states:
        for pu in st.children:
            parts.append(sample_households(ctx.support, ctx.prior, pu.n_households, rng, geo=pu.code))
    return _place(parts)


def _noisy_distribution(noisy: np.ndarray) -> np.ndarray:
    p = np.maximum(np.asarray(noisy, dtype=np.float64), 0.0)
    return p / p.sum() if p.sum() > 0 else np.full(p.size, 1.0 / p.size)


def run_independent_marginals(ctx: Context, rho: float, rng: np.random.Generator) -> HierarchicalData:
    """Per PUMA, the whole ρ over noisy 1-way marginals of every group and person attribute;
    every attribute drawn independently (module docstring)."""
    noise = NumpyNoise(rng)
    d = ctx.private.domain
    ws = [Workload("group", (a.name,), ()) for a in d.group] + [Workload("person", (), (a.name,)) for a in d.person]
    rho_w = Fraction(rho) / len(ws)
    np_idx = d.group_index(d.size_attribute)
    parts = []
    for st in ctx.states:
        for pu in st.children:
            dists = []
            for w in ws:
                _, l2 = w.sensitivity(d, UNIT)
                noisy, _ = noise.noise(answer(pu.data, w), l2, rho_w)
                dists.append(_noisy_distribution(noisy))
            n = pu.n_households
            group = np.stack([rng.choice(a.size, size=n, p=dists[j]) for j, a in enumerate(d.group)], axis=1)
            sizes = group[:, np_idx].astype(np.int64) + 1
            n_i = int(sizes.sum())
            person = np.stack([rng.choice(a.size, size=n_i, p=dists[len(d.group) + j]) for j, a in enumerate(d.person)], axis=1)
            geo = np.repeat(np.asarray(pu.code, dtype=np.int32)[None, :], n, axis=0)
            parts.append(HierarchicalData.from_arrays(d, geo, group, person, np.concatenate([[0], np.cumsum(sizes)])))
    return _place(parts)


def run_mwem_uniform(ctx: Context, rho: float, rng: np.random.Generator) -> HierarchicalData:
    """MWEM on the public support from uniform weights over the distinct public households
    (``pmw_pub`` with a uniform prior), per state then per PUMA, same ρ per node as the prior update."""
    if ctx.uniform_prior is None:
        ctx.uniform_prior = distinct_uniform_weights(ctx.public)
    noise = NumpyNoise(rng)
    d = ctx.private.domain
    t_state, t_puma = ctx.mwem_rounds

    def node_mwem(node: Node, workloads: list[Workload], rho_node: float, T: int, prior: np.ndarray) -> np.ndarray:
        T = min(T, len(workloads))
        rho_round = rho_node / T
        eps_sel = math.sqrt(2.0 * rho_round / 2.0)       # permute-and-flip, ε₀²/2 = ρ_round/2
        rho_meas = rho_round / 2.0
        truth = [answer(node.data, w) for w in workloads]
        index = {w: i for i, w in enumerate(workloads)}

        def select(scores, sensitivity):
            return noise.permute_and_flip(scores, sensitivity, eps_sel)

        def measure(w):
            _, l2 = w.sensitivity(d, UNIT)
            return noise.noise(truth[index[w]], l2, rho_meas)[0]

        res = pmw_pub(ctx.support, workloads, truth, select, measure, unit=UNIT, total=node.n_households, T=T, prior=prior, rng=rng)
        return res.weights

    parts = []
    for st in ctx.states:
        q_st = node_mwem(st, ctx.selection.state, rho * STAGE_SPLIT["state"], t_state, ctx.uniform_prior)
        for pu in st.children:
            q_pu = node_mwem(pu, ctx.selection.puma, rho * STAGE_SPLIT["puma"], t_puma, q_st)
            parts.append(sample_households(ctx.support, q_pu, pu.n_households, rng, geo=pu.code))
    return _place(parts)


def method_runner(name: str) -> Callable[[Context, float, np.random.Generator], HierarchicalData]:
    if name == "map":
        return lambda c, r, g: run_prior_update(c, r, g, "map", 0.1)
    if name.startswith("map@"):
        a = float(name.split("@", 1)[1])
        return lambda c, r, g: run_prior_update(c, r, g, "map", a)
    if name == "ide":
        return lambda c, r, g: run_prior_update(c, r, g, "ide")
    if name == "public":
        return lambda c, r, g: run_public_only(c, g)
    if name == "indep":
        return run_independent_marginals
    if name == "mwem":
        return run_mwem_uniform
    raise ValueError(f"unknown method {name!r}")


# ------------------------------------------------------------------------------- metrics
class Evaluator:
    """``engine.queries.query_errors`` (ST and PUMA) for fixed workloads with the true answers
    computed once, plus ``two_way_l1`` at PUMA level with fixed pairs."""

    def __init__(self, true: HierarchicalData, group_workloads: list[Workload], person_workloads: list[Workload], n_pairs: int = 50, pair_seed: int = 0):
        self.true = true
        self.workloads = {"group": group_workloads, "person": person_workloads}
        self.n_pairs = n_pairs
        self.pair_seed = pair_seed
        self.puma_nodes = np.unique(true.geo, axis=0)
        self.st_nodes, self.st_of_puma = np.unique(self.puma_nodes[:, :1], axis=0, return_inverse=True)
        self.st_of_puma = self.st_of_puma.reshape(-1)
        self._true = {w: self._counts(true, w) for ws in self.workloads.values() for w in ws}

    def _counts(self, data: HierarchicalData, w: Workload) -> tuple[np.ndarray, np.ndarray]:
        """(n_puma, cells) counts and (n_puma,) denominators (households or persons) per PUMA."""
        n_cells = w.n_cells(data.domain)
        nodes = self.puma_nodes
        h, c, k = household_cell_pairs(data, w)
        node = node_index(data, "PUMA", nodes)
        ok = node[h] >= 0
        counts = np.bincount(node[h][ok] * n_cells + c[ok], weights=k[ok].astype(np.float64), minlength=len(nodes) * n_cells).reshape(len(nodes), n_cells)
        valid = node >= 0
        unit = np.ones(data.n_households) if w.level == "group" else data.sizes.astype(np.float64)
        denom = np.bincount(node[valid], weights=unit[valid], minlength=len(nodes))
        return counts, denom

    def _up(self, counts: np.ndarray, denom: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.st_nodes)
        c = np.zeros((n, counts.shape[1]))
        np.add.at(c, self.st_of_puma, counts)
        return c, np.bincount(self.st_of_puma, weights=denom, minlength=n)

    def query_errors(self, synth: HierarchicalData) -> dict:
        out = {}
        for level, ws in self.workloads.items():
            acc = {g: [np.zeros(n), np.zeros(n), 0] for g, n in (("ST", len(self.st_nodes)), ("PUMA", len(self.puma_nodes)))}
            for w in ws:
                tc, td = self._true[w]
                sc, sd = self._counts(synth, w)
                for geo in ("ST", "PUMA"):
                    if geo == "ST":
                        t, tden = self._up(tc, td)
                        s, sden = self._up(sc, sd)
                    else:
                        t, tden, s, sden = tc, td, sc, sd
                    diff = np.abs(t / np.maximum(tden, 1.0)[:, None] - s / np.maximum(sden, 1.0)[:, None])
                    a = acc[geo]
                    a[0] = np.maximum(a[0], diff.max(axis=1))
                    a[1] += diff.sum(axis=1)
                    a[2] += diff.shape[1]
            for geo, (mx, sm, nc) in acc.items():
                out[f"{level}_max_{geo}"] = float(mx.mean())
                out[f"{level}_mean_{geo}"] = float((sm / max(nc, 1)).mean())
        return out

    def __call__(self, synth: HierarchicalData) -> dict:
        out = self.query_errors(synth)
        out["l1_2way_PUMA"] = two_way_l1(self.true, synth, "PUMA", n_pairs=self.n_pairs, rng=np.random.default_rng(self.pair_seed))["mean_l1"]
        return out


def eval_workloads(domain, n: int, seed: int) -> tuple[list[Workload], list[Workload]]:
    rng = np.random.default_rng(seed)
    return (k_way_workloads(domain, 3, "group", limit=n, rng=rng), k_way_workloads(domain, 3, "person", limit=n, rng=rng))


# ------------------------------------------------------------------------------- driver
def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(k) for k in key)))


def rho_for(epsilon: float, n_households: int) -> tuple[float, float]:
    delta = 1.0 / float(n_households) ** 2
    return eps_delta_to_rho(epsilon, delta, "cks"), delta


def run_accuracy(ctx: Context, evaluator: Evaluator, epsilons: Sequence[float], methods: Sequence[str], runs: int, seed: int = 0, log=print) -> dict:
    """results[method][eps] = {metric: [value per run]}; plus seconds per (method, eps)."""
    n_g = ctx.private.n_households
    results: dict = {m: {} for m in methods}
    seconds: dict = {m: {} for m in methods}
    public_runs = None
    for _, m in enumerate(methods):
        fn = method_runner(m)
        for ei, eps in enumerate(epsilons):
            if m == "public" and public_runs is not None:   # ε-independent: reuse
                results[m][str(eps)] = public_runs
                continue
            rho, _ = rho_for(eps, n_g)
            per = {k: [] for k in METRICS}
            secs = []
            for r in range(runs):
                rng = _rng(seed, 1000 if m == "public" else ei, r, sum(ord(ch) for ch in m))
                t0 = time.perf_counter()
                synth = fn(ctx, rho, rng)
                secs.append(time.perf_counter() - t0)
                for k, v in evaluator(synth).items():
                    per[k].append(v)
            results[m][str(eps)] = per
            seconds[m][str(eps)] = secs
            if m == "public":
                public_runs = per
            log(f"  {m:>10} ε={eps:<5} {np.mean(secs):7.2f} s/run  " + "  ".join(f"{k}={np.mean(per[k]):.4f}" for k in ("group_mean_PUMA", "person_mean_PUMA", "l1_2way_PUMA")))
    return {"values": results, "seconds": seconds}


def summarise(values: dict) -> dict:
    """mean and standard error (sd/√runs, 0 for one run) per method, ε, metric."""
    out = {}
    for m, by_eps in values.items():
        out[m] = {}
        for e, per in by_eps.items():
            out[m][e] = {}
            for k, xs in per.items():
                x = np.asarray(xs, dtype=np.float64)
                se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
                out[m][e][k] = {"mean": float(x.mean()), "se": se, "n": int(x.size)}
    return out


def format_table(summary: dict, epsilons: Sequence[float]) -> str:
    lines = []
    eps_keys = [str(e) for e in epsilons]
    eps_head = "".join(f"{'ε=' + e:>22}" for e in eps_keys)
    for k in METRICS:
        lines.append(f"{k:<18}{'method':<11}{eps_head}")
        for m in summary:
            row = f"{'':<18}{m:<11}"
            for e in eps_keys:
                s = summary[m].get(e, {}).get(k)
                cell = f"{s['mean']:.4f} ± {s['se']:.4f}" if s else "-"
                row += f"{cell:>22}"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def compare_to_baselines(summary: dict, epsilons: Sequence[float], method: str = "map", baselines=("public", "indep"), min_eps: float = 0.25) -> list[str]:
    """Where ``method`` does not beat a baseline (mean strictly lower) at ε ≥ min_eps."""
    fails = []
    for e in epsilons:
        if e < min_eps:
            continue
        for b in baselines:
            if b not in summary or method not in summary:
                continue
            for k in METRICS:
                a, c = summary[method][str(e)][k], summary[b][str(e)][k]
                if not a["mean"] < c["mean"]:
                    fails.append(f"{method} vs {b} at ε={e}: {k} {a['mean']:.4f}±{a['se']:.4f} ≥ {c['mean']:.4f}±{c['se']:.4f}")
    return fails


def best_prior_strength(summary: dict, epsilons: Sequence[float]) -> dict:
    """Per ε, the MAP prior strength with the lowest mean of each metric and by average rank."""
    cands = {m: (0.1 if m == "map" else float(m.split("@")[1])) for m in summary if m == "map" or m.startswith("map@")}
    out = {}
    if len(cands) < 2:
        return out
    for e in epsilons:
        ranks = {m: 0.0 for m in cands}
        per_metric = {}
        for k in METRICS:
            order = sorted(cands, key=lambda m: summary[m][str(e)][k]["mean"])
            per_metric[k] = cands[order[0]]
            for i, m in enumerate(order):
                ranks[m] += i
        best = min(ranks, key=lambda m: (ranks[m], cands[m]))
        out[str(e)] = {"best_by_mean_rank": cands[best], "mean_rank": {str(cands[m]): ranks[m] / len(METRICS) for m in cands}, "best_per_metric": per_metric}
    return out


def plot(summary: dict, epsilons: Sequence[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(15, 12))
    for ax, k in zip(axes.ravel(), METRICS):
        for m in summary:
            es = [e for e in epsilons if str(e) in summary[m]]
            mu = [summary[m][str(e)][k]["mean"] for e in es]
            se = [summary[m][str(e)][k]["se"] for e in es]
            style = "--" if m == "public" else "-"
            ax.errorbar(es, mu, yerr=se, fmt=style + "o", ms=3, capsize=2, label=m)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(k)
        ax.set_xlabel("ε")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def time_synthesis(ctx: Context, epsilon: float, seed: int = 0, repeats: int = 1) -> dict:
    """Wall time of the synthesis stage (all private states) on a fresh support: MAP vs public-only."""
    rho, _ = rho_for(epsilon, ctx.private.n_households)
    out = {"epsilon": epsilon, "cpu_count": os.cpu_count(), "map_s": [], "map_warm_s": [], "public_s": []}
    for r in range(repeats):
        c = ctx.fresh_support()
        t0 = time.perf_counter()
        run_public_only(c, _rng(seed, 7, r))
        out["public_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_prior_update(c, rho, _rng(seed, 8, r), "map", 0.1)
        out["map_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_prior_update(c, rho, _rng(seed, 9, r), "map", 0.1)
        out["map_warm_s"].append(time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epsilons", type=lambda s: [float(x) for x in s.split(",")], default=list(EPSILONS), help="comma-separated ε values")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 run, ε ∈ {0.25, 1}, 30 workloads per level")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--methods", default="map,ide,public,indep,mwem", help="comma-separated: map, map@<strength>, ide, public, indep, mwem")
    ap.add_argument("--prior-strengths", default="", help="extra MAP prior strengths to sweep, e.g. 0.03,0.3 (adds map@<a>)")
    ap.add_argument("--workloads", type=int, default=100, help="random 3-way workloads per query level")
    ap.add_argument("--pairs", type=int, default=50, help="random 2-way marginals per PUMA")
    ap.add_argument("--mwem-rounds", default="8,3", help="MWEM rounds per state, per PUMA")
    ap.add_argument("--private", default=",".join(PRIVATE_STATES))
    ap.add_argument("--public", default=",".join(PUBLIC_STATES))
    ap.add_argument("--replicate", type=int, default=0, help="scale test only: replicate the private input K× and time the MAP stage")
    ap.add_argument("--timing-epsilon", type=float, default=1.0)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.epsilons, a.workloads = 1, [0.25, 1.0], min(a.workloads, 30)
    a.out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    private = load_states(a.private.split(","))
    public = load_states(a.public.split(","))
    load_s = time.perf_counter() - t0

    if a.replicate and a.replicate > 1:
        return scale_test(private, public, a, load_s)

    methods = [m for m in a.methods.split(",") if m]
    for s in [x for x in a.prior_strengths.split(",") if x]:
        name = "map" if float(s) == 0.1 else f"map@{float(s):g}"
        if name not in methods:
            methods.insert(methods.index("map") + 1 if "map" in methods else 0, name)
    ctx = Context.build(private, public, mwem_rounds=tuple(int(x) for x in a.mwem_rounds.split(",")))
    gw, pw = eval_workloads(private.domain, a.workloads, a.seed)
    evaluator = Evaluator(private, gw, pw, n_pairs=a.pairs, pair_seed=a.seed)
    print(f"private {a.private}: {private.n_households} households, {private.n_persons} persons, {len(evaluator.puma_nodes)} PUMAs; "
          f"public {a.public}: {public.n_households} households; load {load_s:.1f} s")
    print(f"workloads: state {len(ctx.selection.state)}, PUMA {len(ctx.selection.puma)}; evaluation: {len(gw)} group + {len(pw)} person 3-way, {a.pairs} 2-way pairs")
    print("ρ per ε (δ = 1/N_G²): " + ", ".join(f"{e}: {rho_for(e, private.n_households)[0]:.3e}" for e in a.epsilons))

    timing = None
    if not a.no_timing:
        timing = time_synthesis(ctx, a.timing_epsilon, a.seed)
        print(f"synthesis stage (6 states + {len(evaluator.puma_nodes)} PUMAs, ε={a.timing_epsilon}, {os.cpu_count()} cores): "
              f"MAP {timing['map_s'][0]:.1f} s cold / {timing['map_warm_s'][0]:.1f} s warm cache; public-only {timing['public_s'][0]:.2f} s")

    t1 = time.perf_counter()
    raw = run_accuracy(ctx, evaluator, a.epsilons, methods, a.runs, a.seed)
    summary = summarise(raw["values"])
    table = format_table(summary, a.epsilons)
    print()
    print(table)
    fails = compare_to_baselines(summary, a.epsilons)
    print("MAP beats public-only and independent marginals on every metric for ε ≥ 0.25:" + (" yes" if not fails else " NO"))
    for f in fails:
        print("  " + f)
    best = best_prior_strength(summary, a.epsilons)
    if ctx.failures:
        print(f"failed node updates (node kept its prior): {len(ctx.failures)}; first: {ctx.failures[0]}")
    for e, b in best.items():
        print(f"  best prior_strength at ε={e}: {b['best_by_mean_rank']} (mean rank {b['mean_rank']})")
    tag = ("_quick" if a.quick else "") + (f"_{a.tag}" if a.tag else "")
    res = {
        "setup": {
            "private": a.private.split(","), "public": a.public.split(","),
            "private_households": private.n_households, "private_persons": private.n_persons,
            "public_households": public.n_households, "n_puma": int(len(evaluator.puma_nodes)),
            "epsilons": a.epsilons, "delta": 1.0 / private.n_households**2, "conversion": "cks",
            "rho": {str(e): rho_for(e, private.n_households)[0] for e in a.epsilons},
            "stage_split": STAGE_SPLIT, "runs": a.runs, "methods": methods, "seed": a.seed,
            "noise": "benchmark-only numpy continuous Gaussian / exponential-noise permute-and-flip",
            "state_workloads": [w.id for w in ctx.selection.state], "puma_workloads": [w.id for w in ctx.selection.puma],
            "eval_group_workloads": [w.id for w in gw], "eval_person_workloads": [w.id for w in pw],
            "pairs": a.pairs, "mwem_rounds": a.mwem_rounds,
        },
        "summary": summary,
        "values": raw["values"],
        "seconds_per_run": raw["seconds"],
        "timing": timing,
        "map_not_better": fails,
        "failed_node_updates": ctx.failures,
        "best_prior_strength": best,
        "total_seconds": time.perf_counter() - t1,
        "peak_rss_gib": peak_rss_gib(),
    }
    jpath = a.out / f"synthesis_accuracy{tag}.json"
    jpath.write_text(json.dumps(res, indent=1))
    ppath = a.out / f"synthesis_accuracy{tag}.png"
    plot(summary, a.epsilons, ppath, f"ACS 2018: private {a.private} / public {a.public}, {a.runs} runs, δ=1/N_G²")
    (a.out / f"synthesis_accuracy{tag}.txt").write_text(table + "\n")
    print(f"wrote {jpath} and {ppath} ({res['total_seconds']:.0f} s, peak RSS {res['peak_rss_gib']:.2f} GiB)")
    return 0


def scale_test(private: HierarchicalData, public: HierarchicalData, a, load_s: float) -> int:
    t0 = time.perf_counter()
    big = replicate(private, a.replicate)
    prep_s = time.perf_counter() - t0
    ctx = Context.build(big, public)
    n_puma = sum(len(s.children) for s in ctx.states)
    rho, _ = rho_for(a.timing_epsilon, big.n_households)
    print(f"replicate ×{a.replicate}: {big.n_households} households, {big.n_persons} persons, {n_puma} PUMAs (prep {prep_s:.1f} s, load {load_s:.1f} s)")
    t0 = time.perf_counter()
    synth = run_public_only(ctx, _rng(a.seed, 7))
    pub_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    synth = run_prior_update(ctx, rho, _rng(a.seed, 8), "map", 0.1)
    map_s = time.perf_counter() - t0
    rss = peak_rss_gib()
    print(f"MAP synthesis stage: {map_s:.1f} s; public-only {pub_s:.2f} s; synthetic {synth.n_households} households; peak RSS {rss:.2f} GiB ({os.cpu_count()} cores)")
    res = {"replicate": a.replicate, "households": big.n_households, "persons": big.n_persons, "n_puma": n_puma,
           "epsilon": a.timing_epsilon, "map_s": map_s, "public_s": pub_s, "prep_s": prep_s, "load_s": load_s,
           "peak_rss_gib": rss, "cpu_count": os.cpu_count()}
    a.out.mkdir(parents=True, exist_ok=True)
    p = a.out / f"synthesis_scale_x{a.replicate}.json"
    p.write_text(json.dumps(res, indent=1))
    print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
