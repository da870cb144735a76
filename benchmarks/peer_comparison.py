"""Peer benchmark: AIM and MST (McKenna et al.) side by side with the full
dprelease pipeline — count-of-counts included — and its public-only baseline, on the same
private/public split, workload and δ, in one run.

Split: one 2018 state private (``--private``, default New Hampshire), the other eleven public.
``--private-file PATH`` puts another person file of that state in its place (a shifted copy of its
shared file, ``benchmarks/shift_inputs.py``); the public states stay the other eleven.
δ = 1/n² with n = the private state's persons; ρ = eps_delta_to_rho(ε, δ, "cks") (the pipeline's
own conversion, the same ρ for every method).

Workload (the AIM paper's ACS set-up): eleven attributes, all 165 3-way marginals,
evaluated on person records (one row per person):
  AGEP_BAND (0-4, 5-17, 18-24, 25-34, 35-44, 45-54, 55-64, 65-74, 75+), SEX, RAC1P (9),
  HISP_ORIGIN (2), SCHL_GROUP (blank; 01-15; 16-17; 18-20; 21; 22-24), MAR (5), ESR_GROUP (blank,
  1..6), RELP_GROUP (00; 01,13; 02-04; 05-10; 11,12,14,15; 16,17), CIT (5), NP (household size of
  the person's household, 1..6, 7+) and PUMA. Group-quarters persons are one-person units (NP 1).
  The person attributes are those of ``schemas/domains/acs_pums_aim.yaml`` (encoded by the
  project's own reader, ``schemas.ingestion``).

Metrics (against the confidential data: benchmark output is internal):
  mean_l1    mean over the 165 marginals of ‖p − q‖₁ (p, q the confidential and synthetic
             marginals, each normalised to sum 1; ∈ [0, 2]; the papers' "average error" is half);
  max_cell   the largest |p − q| over every cell of every marginal;
  contains_l1 (dprelease and public-only only: AIM, MST and JAM release no households) the same 165
             attribute triples at group level — the share of households (of the private state)
             whose PUMA / NP match and that contain at least one person with the person attributes
             of the triple — mean L1 between confidential and synthetic.
Each is the mean ± standard error over ``--runs`` runs. Beside them, mean_l1 by marginal kind (with
PUMA / with NP / persons only) and by attribute (the marginals that hold it: where a method is weak).

Methods (``--methods``):
  aim        AIM (benchmarks/peers/aim.py) on the person records, sensitivity 1: the paper's
             add/remove-one-RECORD guarantee. Under the household unit this is weaker (a household
             of k persons is k records: group privacy gives only kε). The issue quotes these.
  mst        MST (benchmarks/peers/mst.py), same data and guarantee.
  aim_hh     the fair variant: households clipped to M persons like the pipeline's (keep the
             householder and the next M−1 by SPORDER), sensitivity M in L1 and L2 (a household of up
             to M persons changes a person-level marginal by up to M): household-level DP.
  mst_hh     the same for MST.
  jam        JAM (benchmarks/peers/jam.py; Fuentes et al. 2024): AIM-like selection that may also pick a
             public marginal, measured free: the public states' persons (no PUMA: their PUMAs are not
             the private state's), scaled to a noisy person count. Person records, sensitivity 1.
  jam_hh     the same on the clipped households with sensitivity M (public households clipped alike).
  dprelease  the real pipeline (``dprelease run``, subprocess) with the default release config's
             allocation and settings (deploy/releases/acs2018_default.yaml), domain
             acs_pums_aim.yaml, household unit, max_household_size M (the base config's, 8 by default,
             as the release ships it; ``--max-household-size``), group quarters as one-person
             households, oversize clip; the released Parquet is read back and scored. The truth is
             not clipped: persons of households above M are what the release loses to the clip.
  dprelease_person  the same pipeline with ``privacy_unit: person`` (add/remove one person, the
             household's size and derived attributes changing with it): the guarantee to set
             beside AIM and MST on person records.
  hgem       the same pipeline with ``synthesizer: hgem`` (the shipped H-GEM: pretrained on the public
             households, fitted to the state's measurements with the ``map`` update rule, the PUMAs
             from its households; ``advanced.hgem`` at its defaults), on this machine's device
             (cuda when visible, else CPU).
  public     the pipeline's public-only baseline (``synthesizer: public_baseline``, same config):
             public households resampled to each PUMA's household count (its household counts and
             size histograms come from the count-of-counts stage at the same ε, δ).
  dprelease@NAME  ``dprelease`` run from another checkout of the repository (``--source NAME=PATH``, a
             git worktree at another commit): that tree's engine/ tasks/ flows/ schemas/ with this
             Python environment, its own deploy/releases/acs2018_default.yaml as the base config (the
             config format may differ between commits), the same split, domain, unit, M, budget and
             scoring; the tree's commit is recorded. Runs the code before and after a change in one
             benchmark (``--resume`` adds a later tree's cells to the same table).
  public0    the public data alone, nothing measured: ``public_baseline`` with the declared
             invariant ``puma_household_counts`` (exact PUMA household counts, no count-of-counts):
             the "never do worse than the public data alone" reference (not DP for those counts).

    python benchmarks/peer_comparison.py --quick                       # smoke run: 1 ε, 1 run, small AIM
    python benchmarks/peer_comparison.py --epsilons 0.25,1 --runs 1    # what the issue quotes
    python benchmarks/peer_comparison.py --private nm --epsilons 1     # New Mexico private
    python benchmarks/peer_comparison.py --epsilons 2 --resume         # add ε = 2 to an existing table
    python benchmarks/peer_comparison.py --private nh --private-file /tmp/shifts/csv_pnh_race60.zip  # a shifted NH
    python benchmarks/peer_comparison.py --methods dprelease@before --source before=../wt-before --tag before_after
    python benchmarks/peer_comparison.py --methods dprelease@after --source after=. --tag before_after --resume

Results: benchmarks/results/peer_comparison_<tag>.{json,txt} (tag: the private state, the private
file's name after ``csv_p`` with ``--private-file``, or ``--tag``); the JSON is rewritten after
every method run, so a long run loses nothing and ``--resume`` skips the (method, ε, run) cells it already holds. Progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.data import HierarchicalData  # noqa: E402
from engine.privacy import eps_delta_to_rho  # noqa: E402
from schemas.domain_spec import DomainSpec, load_domain_spec  # noqa: E402
from schemas.ingestion import HouseholdRules, load_person_file  # noqa: E402

DATA = Path(os.environ.get("DPRELEASE_DATA", ROOT.parent / "shared" / "data")).resolve()
SPEC_PATH = ROOT / "schemas" / "domains" / "acs_pums_aim.yaml"
DEFAULT_CONFIG = ROOT / "deploy" / "releases" / "acs2018_default.yaml"
OUT = ROOT / "benchmarks" / "results"
STATES = ("de", "id", "me", "mt", "nd", "ne", "nh", "nm", "ri", "sd", "vt", "wy")
FIPS = dict(zip(STATES, (10, 16, 23, 30, 38, 31, 33, 35, 44, 46, 50, 56)))  # a --private-file must cover its --private state
PERSON_ATTRS = ("AGEP_BAND", "SEX", "RAC1P", "HISP_ORIGIN", "SCHL_GROUP", "MAR", "ESR_GROUP", "RELP_GROUP", "CIT")
ATTRS = PERSON_ATTRS + ("NP", "PUMA")
NP_TOP = 7  # NP is scored as 1..6, 7+
ALL_METHODS = ("aim", "mst", "aim_hh", "mst_hh", "jam", "jam_hh", "dprelease", "dprelease_person", "hgem", "public", "public0")
EXEC_ORDER = ("public0", "public", "dprelease", "dprelease_person", "mst", "mst_hh", "aim", "aim_hh", "jam", "jam_hh", "hgem")
PIPELINE = ("dprelease", "dprelease_person", "hgem", "public", "public0")
LABELS = {"aim": "AIM (person records)", "mst": "MST (person records)", "aim_hh": "AIM (household unit)",
          "mst_hh": "MST (household unit)", "jam": "JAM (person records)", "jam_hh": "JAM (household unit)",
          "dprelease": "dprelease (default)",
          "dprelease_person": "dprelease (person unit)", "hgem": "dprelease, H-GEM synthesizer", "public": "public-only baseline",
          "public0": "public-only, exact counts"}
SOURCE_METHOD = "dprelease@"  # dprelease@NAME: the pipeline of the checkout given by --source NAME=PATH
# the release-config keys a benchmark run sets in every config format the repository has had; the
# others it sets only where the tree's base config has them (a newer format may drop a key)
# the top-level keys every config format since the first release has known (the rest of a
# checkout's base config is its own: allocation and settings sections moved between formats)
SHARED_KEYS = ("name", "description", "data_root", "private", "public", "domain", "privacy_unit", "budget", "household_rules",
               "synthesizer", "output_dir", "work_dir")
T0 = time.time()  # a child process gets the parent's start (see _peer_child)


def label(method: str) -> str:
    if method.startswith(SOURCE_METHOD):
        return f"{method} (default)"
    return LABELS[method]


def parse_sources(specs: list[str]) -> dict[str, Path]:
    """``--source NAME=PATH`` values: NAME → the checkout's root (a tree holding flows/cli.py and
    the default release config)."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not sep or not name or not path.strip() or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"--source {spec!r}: expected NAME=PATH with NAME of letters, digits, - or _")
        if name in out:
            raise ValueError(f"--source {name} given twice")
        root = Path(path.strip()).expanduser().resolve()
        missing = [f for f in ("flows/cli.py", "deploy/releases/acs2018_default.yaml") if not (root / f).is_file()]
        if missing:
            raise ValueError(f"--source {name}={root}: not a checkout of this repository (no {', '.join(missing)})")
        out[name] = root
    return out


def source_info(root: Path) -> dict:
    """The commit of a checkout and whether its pipeline source differs from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=20).stdout.strip()
    return {"path": str(root), "commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "engine", "tasks", "flows", "schemas"))}


def log(msg: str) -> None:
    sys.stderr.write(f"[peer_comparison {time.time() - T0:7.0f}s] {msg}\n")
    sys.stderr.flush()


# -- data ------------------------------------------------------------------------------------------
def state_zip(state: str) -> str:
    s = state.lower()
    if s not in STATES:
        raise SystemExit(f"unknown state {state!r}; one of {', '.join(STATES)}")
    return f"acs2018_1yr/csv_p{s}.zip"


def person_np_codes(data: HierarchicalData) -> np.ndarray:
    """Each person's codes of :data:`PERSON_ATTRS` and NP (index of 1..6, 7+): n × 10."""
    d = data.domain
    cols = [data.person[:, d.person_index(a)].astype(np.int64) for a in PERSON_ATTRS]
    cols.append(np.minimum(data.sizes, NP_TOP)[data.person_household].astype(np.int64) - 1)
    return np.stack(cols, axis=1)


class Bench:
    """The private state's persons as benchmark codes (n × 11) and its households."""

    def __init__(self, private: str, max_size: int, path: Path | None = None):
        self.spec: DomainSpec = load_domain_spec(SPEC_PATH)
        self.private = private
        self.path = path or Path(state_zip(private))  # relative to DATA (the pipeline's data_root) or absolute
        self.M = max_size
        full, report = load_person_file(DATA / self.path, self.spec, HouseholdRules(20, "single_person_households", "clip"))
        if report["oversize_persons_removed"]:
            log(f"warning: {report['oversize_persons_removed']} persons in households above 20 persons are not in the truth")
        self.report = report
        self.pumas = np.unique(full.geo[:, 1]).astype(np.int64)
        self.st = int(full.geo[0, 0])
        self.person_codes = {a: full.domain.person_attribute(a).codes for a in PERSON_ATTRS}
        self.shape = tuple(len(self.person_codes[a]) for a in PERSON_ATTRS) + (NP_TOP, len(self.pumas))
        self.truth = self.records(full)
        self.truth_hh = self.households(full)
        clipped, rep = load_person_file(DATA / self.path, self.spec, HouseholdRules(max_size, "single_person_households", "clip"))
        self.clipped = self.records(clipped)
        self.clip_removed = rep["oversize_persons_removed"]
        self.n = len(self.truth)
        self.triples = list(itertools.combinations(range(len(ATTRS)), 3))
        self.true_marg = [self.marginal(self.truth, t) for t in self.triples]
        self.true_contains = [self.contains(self.truth_hh, t) for t in self.triples]
        self._public: dict[tuple, np.ndarray] = {}

    def puma_index(self, puma: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.pumas, puma)
        i = np.clip(i, 0, len(self.pumas) - 1)
        if np.any(self.pumas[i] != puma):
            raise ValueError("synthetic PUMA codes outside the private state's PUMAs")
        return i

    def records(self, data: HierarchicalData) -> np.ndarray:
        puma = self.puma_index(data.geo[:, 1].astype(np.int64))[data.person_household]
        return np.concatenate([person_np_codes(data), puma[:, None]], axis=1)

    def public_records(self, states: list[str], clipped: bool) -> np.ndarray:
        """The public states' persons as the benchmark codes but PUMA (the private state's PUMAs are
        none of theirs), households clipped to M like the private records of the *_hh methods when
        ``clipped``: JAM's public data."""
        if (tuple(states), clipped) in self._public:
            return self._public[tuple(states), clipped]
        rules = HouseholdRules(self.M if clipped else 20, "single_person_households", "clip")
        parts = []
        for s in states:
            data, _ = load_person_file(DATA / state_zip(s), self.spec, rules)
            if any(list(data.domain.person_attribute(a).codes) != list(self.person_codes[a]) for a in PERSON_ATTRS):
                raise ValueError(f"{state_zip(s)}: person attribute codes differ from the private state's")
            parts.append(person_np_codes(data))
        self._public[tuple(states), clipped] = np.concatenate(parts)
        return self._public[tuple(states), clipped]

    def households(self, data: HierarchicalData) -> dict:
        return {"person": self.records(data)[:, : len(PERSON_ATTRS)], "hh": data.person_household.astype(np.int64),
                "np": np.minimum(data.sizes, NP_TOP).astype(np.int64) - 1,
                "puma": self.puma_index(data.geo[:, 1].astype(np.int64)), "n_households": data.n_households}

    # -- answers
    def marginal(self, codes: np.ndarray, t: tuple[int, ...]) -> np.ndarray:
        dims = [self.shape[i] for i in t]
        idx = np.ravel_multi_index([codes[:, i] for i in t], dims)
        c = np.bincount(idx, minlength=int(np.prod(dims))).astype(np.float64)
        return c / max(c.sum(), 1.0)

    def contains(self, h: dict, t: tuple[int, ...]) -> np.ndarray:
        """Share of households whose household attributes (NP, PUMA) of the triple match and that
        contain at least one person matching its person attributes."""
        k = len(PERSON_ATTRS)
        hh = h["hh"]
        cols, dims = [], []
        for i in t:
            if i < k:
                cols.append(h["person"][:, i])
            else:
                cols.append((h["np"] if ATTRS[i] == "NP" else h["puma"])[hh])
            dims.append(self.shape[i])
        n_cells = int(np.prod(dims))
        key = np.unique(hh * n_cells + np.ravel_multi_index(cols, dims))
        c = np.bincount(key % n_cells, minlength=n_cells).astype(np.float64)
        return c / max(h["n_households"], 1)

    def score(self, codes: np.ndarray, hh: dict | None = None) -> dict:
        l1, mx = [], []
        for t, p in zip(self.triples, self.true_marg):
            diff = np.abs(p - self.marginal(codes, t))
            l1.append(diff.sum())
            mx.append(diff.max())
        kinds = [marginal_kind(t) for t in self.triples]
        out = {"mean_l1": float(np.mean(l1)), "max_cell": float(np.max(mx)), "mean_max_cell": float(np.mean(mx)),
               "l1_by_kind": {k: float(np.mean([e for e, kk in zip(l1, kinds) if kk == k])) for k in KINDS},
               "l1_by_attribute": l1_by_attribute(self.triples, l1),
               "worst_marginals": [ "|".join(ATTRS[i] for i in self.triples[j]) for j in np.argsort(l1)[::-1][:3]],
               "persons": int(len(codes))}
        if hh is not None:
            cl = [np.abs(p - self.contains(hh, t)).sum() for t, p in zip(self.triples, self.true_contains)]
            out["contains_l1"] = float(np.mean(cl))
            out["households"] = int(hh["n_households"])
        return out


KINDS = ("with PUMA", "with NP, no PUMA", "person attributes only")


def l1_by_attribute(triples: list[tuple[int, ...]], l1: list[float]) -> dict[str, float]:
    """Per attribute of :data:`ATTRS`: the mean L1 over the marginals that contain it (where a method
    is weak: New Mexico's Hispanic origin, far from the public states', was the pipeline's)."""
    return {a: float(np.mean([e for t, e in zip(triples, l1) if i in t])) for i, a in enumerate(ATTRS) if any(i in t for t in triples)}


def marginal_kind(t: tuple[int, ...]) -> str:
    """Which of :data:`KINDS` a triple of attribute indices belongs to (where the error sits:
    the geography, the household size, or the persons' attributes alone)."""
    names = {ATTRS[i] for i in t}
    return KINDS[0] if "PUMA" in names else KINDS[1] if "NP" in names else KINDS[2]


# -- peers -----------------------------------------------------------------------------------------
def mbi_dataset(codes: np.ndarray, shape, attrs: tuple[str, ...] = ATTRS):
    from peers.common import import_mbi

    mbi = import_mbi()
    return mbi.Dataset({a: codes[:, j] for j, a in enumerate(attrs)}, mbi.Domain(attrs, shape))


def synth_codes(synth) -> np.ndarray:
    return np.stack([np.asarray(synth.data[a]).astype(np.int64) for a in ATTRS], axis=1)


def _peer_child(method: str, codes: np.ndarray, shape: tuple, rho: float, sens: float, settings: dict, t0: float,
                public: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """One AIM / MST / JAM run (in a child process): the synthetic records and the mechanism's info."""
    global T0
    T0 = t0
    from peers import aim, jam, mst

    data = mbi_dataset(codes, shape)
    rng = np.random.default_rng()
    if method.startswith("jam"):
        pub = mbi_dataset(public, shape[: public.shape[1]], ATTRS[: public.shape[1]])
        workload = [(t, 1.0) for t in itertools.combinations(ATTRS, 3)]
        _, synth, info = jam.run(data, pub, workload, rho, rng=rng, sensitivity=sens, rounds=settings["rounds"],
                                 max_model_size=settings["max_model_size"], max_iters=settings["max_iters"],
                                 log=lambda s: log(f"  {s}"))
    elif method.startswith("aim"):
        workload = [(t, 1.0) for t in itertools.combinations(ATTRS, 3)]
        _, synth, info = aim.run(data, workload, rho, rng=rng, sensitivity=sens, rounds=settings["rounds"],
                                 max_model_size=settings["max_model_size"], max_iters=settings["max_iters"],
                                 log=lambda s: log(f"  {s}"))
    else:
        synth, info = mst.run(data, rho, rng=rng, sensitivity=sens, iters=settings["iters"], log=lambda s: log(f"  {s}"))
    info["settings"] = settings
    info["sensitivity"] = sens
    return synth_codes(synth), info


def run_peer(method: str, bench: Bench, public: list[str], rho: float, args) -> tuple[dict, dict]:
    """AIM / MST / JAM in a fresh child process: every run starts with empty JAX caches (one long process
    accumulates thousands of compiled programs), and a crash of the native code costs one cell,
    not the benchmark."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    hh_unit = method.endswith("_hh")
    settings = ({"max_model_size": args.max_model_size, "max_iters": args.max_iters, "rounds": args.rounds} if method.startswith("aim")
                else {"max_model_size": args.max_model_size, "max_iters": args.max_iters, "rounds": args.jam_rounds} if method.startswith("jam")
                else {"iters": args.mst_iters})
    codes = bench.clipped if hh_unit else bench.truth
    public_codes = bench.public_records(public, hh_unit) if method.startswith("jam") else None
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        synth, info = pool.submit(_peer_child, method, codes, bench.shape, rho, float(bench.M) if hh_unit else 1.0, settings, T0,
                                  public_codes).result()
    return bench.score(synth), info


# -- the pipeline ----------------------------------------------------------------------------------
def household_max_size(base: dict) -> int:
    """M of the base release config (its ``household_rules.max_household_size``, the config schema's
    default where it sets none): the benchmark clips households as the release it measures does."""
    from schemas.release_config import HouseholdRulesSpec

    return HouseholdRulesSpec(**(base.get("household_rules") or {})).max_household_size


def pipeline_config(base: dict, bench: Bench, public: list[str], method: str, epsilon: float, delta: float, tmp: Path,
                    root: Path = ROOT) -> Path:
    """The release config of one pipeline run: ``base`` (a tree's default release config, read once
    at the start so that every run of one benchmark uses the same allocation and settings) with the
    benchmark's split, domain, budget, household rules and locations: the keys of
    :data:`SHARED_KEYS`, which every config format knows; the rest of ``base`` (its allocation and
    settings, in its own format: ``--source``) as it is."""
    import copy

    cfg = copy.deepcopy(base)
    cfg.pop("attributes", None)
    shared = {
        "name": "peer-comparison",
        "description": f"peer benchmark: {bench.private} private, {len(public)} states public",
        "data_root": str(DATA),
        "private": [{"path": str(bench.path)}],
        "public": [{"path": state_zip(s)} for s in public],
        "domain": str(root / SPEC_PATH.relative_to(ROOT)),  # the checkout's own copy of the spec, in its format
        "privacy_unit": "person" if method == "dprelease_person" else "household",
        "budget": {"epsilon": float(epsilon), "delta": float(delta), "conversion": "cks"},
        "household_rules": {"max_household_size": bench.M, "group_quarters": "single_person_households", "oversize": "clip"},
        "synthesizer": "prior_update" if method.startswith("dprelease") else "hgem" if method == "hgem" else "public_baseline",
        "output_dir": str(tmp / "releases"),
        "work_dir": str(tmp / "work"),
    }
    assert tuple(shared) == SHARED_KEYS
    cfg.update(shared)
    if method == "public0":  # nothing measured: exact PUMA household counts (the declared invariant)
        cfg["invariants"] = ["puma_household_counts"]
        cfg["advanced"] = {"allocation": {"stages": {"puma_synthesis": 1.0}, "levels": {"puma_synthesis": {"puma": 1.0}}}}
    path = tmp / f"{method}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def read_release(release_dir: Path, bench: Bench) -> tuple[np.ndarray, dict, dict]:
    import pyarrow.dataset as ds

    from schemas.release_schema import PARTITION_SCHEMA

    part = ds.partitioning(PARTITION_SCHEMA, flavor="hive")
    hh = ds.dataset(release_dir / "households", partitioning=part, format="parquet").to_table(columns=["SERIALNO", "NP", "PUMA"]).to_pandas()
    pp = ds.dataset(release_dir / "persons", partitioning=part, format="parquet").to_table(columns=["SERIALNO", "PUMA", *PERSON_ATTRS]).to_pandas()
    pos = pd.Index(hh["SERIALNO"].astype(str)).get_indexer(pp["SERIALNO"].astype(str))
    if np.any(pos < 0):
        raise ValueError("released persons whose SERIALNO has no household")
    cols = []
    for a in PERSON_ATTRS:
        c = pd.Categorical(pp[a].astype(str), categories=list(bench.person_codes[a])).codes.astype(np.int64)
        if np.any(c < 0):
            raise ValueError(f"released {a} values outside the domain spec")
        cols.append(c)
    np_hh = np.minimum(hh["NP"].to_numpy().astype(np.int64), NP_TOP) - 1
    puma_hh = bench.puma_index(hh["PUMA"].astype(str).astype(np.int64).to_numpy())
    cols += [np_hh[pos], puma_hh[pos]]
    codes = np.stack(cols, axis=1)
    h = {"person": codes[:, : len(PERSON_ATTRS)], "hh": pos.astype(np.int64), "np": np_hh, "puma": puma_hh, "n_households": len(hh)}
    manifest = json.loads((release_dir / "manifest.json").read_text())
    return codes, h, manifest


def pipeline_source_hash(root: Path = ROOT) -> str:
    """SHA-256 (16 hex) of the pipeline's source as it is in the working tree ``root`` at this moment
    (engine/, tasks/, flows/, schemas/, tracked and untracked): tells which runs saw the same code."""
    import hashlib

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "engine", "tasks", "flows", "schemas"],
                           cwd=root, capture_output=True, text=True).stdout.split()
    h = hashlib.sha256()
    for f in sorted(files):
        p = root / f
        if p.is_file():
            h.update(f.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def pipeline_env(root: Path, prefect_home: Path) -> dict[str, str]:
    """The environment of a ``dprelease run`` of the checkout ``root``: its packages first on the path,
    the shared data, and Prefect offline in ``prefect_home``."""
    return dict(os.environ, PYTHONPATH=str(root), DPRELEASE_DATA=str(DATA), PREFECT_HOME=str(prefect_home), DO_NOT_TRACK="1",
                PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="90",
                PREFECT_LOGGING_LEVEL="WARNING")


def run_pipeline(base: dict, method: str, bench: Bench, public: list[str], epsilon: float, delta: float, tmp: Path, tag: str,
                 root: Path = ROOT) -> tuple[dict, dict]:
    """One ``dprelease run`` of the checkout ``root`` (its own packages first on the path, this
    Python environment) and the scores of its release."""
    run_tmp = Path(tempfile.mkdtemp(prefix=f"{method.replace('@', '-')}-", dir=tmp))
    cfg_path = pipeline_config(base, bench, public, method, epsilon, delta, run_tmp, root)
    source = pipeline_source_hash(root)
    env = pipeline_env(root, tmp / "prefect")
    cmd = [sys.executable, "-m", "flows.cli", "run", str(cfg_path), "--name", tag]
    pinned = len(os.sched_getaffinity(0)) < (os.cpu_count() or 1)
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                          preexec_fn=(lambda: os.sched_setaffinity(0, range(os.cpu_count() or 1))) if pinned else None)
    (run_tmp / "dprelease.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"dprelease run exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    output_dir = yaml.safe_load(cfg_path.read_text()).get("output_dir") or "releases"  # a format without the key: its default
    codes, h, manifest = read_release(root / output_dir / tag, bench)
    priv = manifest["privacy"]
    info = {"rho_spent": float(Fraction(str(priv["rho"]))), "epsilon_spent": priv["epsilon_delta"]["epsilon"], "delta": priv["epsilon_delta"]["delta"],
            "stages": manifest.get("stages"), "release_counts": manifest.get("release_counts"),
            "allocation": manifest["privacy"]["plan"], "synthesizer": manifest["config"].get("synthesizer"),
            "invariants": manifest["config"].get("invariants"), "pipeline_source_sha256": source,
            "state_fraction": (priv.get("synthesis_split") or {}).get("state_fraction"),  # the public simulation's choice, if it ran
            "prior_strength_floor": ((manifest.get("synthesizer") or {}).get("prior_strength_floor") or {}).get("floor"),  # ditto
            "prior_mixture": (manifest.get("synthesizer") or {}).get("prior_mixture"),  # each state's weight of the flipped households
            "git_commit": (manifest.get("code") or {}).get("git_commit"),
            "workloads": None if not manifest.get("workload") else {k: len(v) for k, v in manifest["workload"].items() if k in ("state", "puma")}}
    return bench.score(codes, h), info


# -- summary ---------------------------------------------------------------------------------------
def mean_se(xs) -> dict:
    a = np.asarray([x for x in xs if x is not None], dtype=np.float64)
    if a.size == 0:
        return {"mean": None, "se": None, "n": 0}
    return {"mean": float(a.mean()), "se": float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else None, "n": int(a.size)}


def summarise(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        if "error" in r:
            continue
        out.setdefault(r["method"], {}).setdefault(str(r["epsilon"]), []).append(r)
    summary = {}
    for m, by_eps in out.items():
        summary[m] = {}
        for e, rs in by_eps.items():
            summary[m][e] = {k: mean_se([r["metrics"].get(k) for r in rs]) for k in ("mean_l1", "max_cell", "mean_max_cell", "contains_l1")}
            summary[m][e]["wall_s"] = mean_se([r["wall_s"] for r in rs])
    return summary


def better_ratio(num: dict, *peers: dict) -> float:
    """Mean L1 of ``num`` over the best (lowest) mean L1 of ``peers`` (summary cells of one ε)."""
    return num["mean_l1"]["mean"] / min(p["mean_l1"]["mean"] for p in peers)


def fmt(s: dict, digits: int = 3, signed: bool = False) -> str:
    if not s or s["mean"] is None:
        return "—"
    return f"{s['mean']:{'+' if signed else ''}.{digits}f}" + (f" ± {s['se']:.{digits}f}" if s["se"] is not None else "")


def breakdown(records: list[dict], methods: list[str], epsilon: str, key: str, labels: tuple[str, ...]) -> list[str]:
    """Per method with records at ``epsilon``: "method m1 / m2 / …", its mean over runs of ``metrics[key][label]``
    for each label (the table's by-kind and by-attribute lines)."""
    out = []
    for m in methods:
        rs = [r for r in records if r["method"] == m and str(r["epsilon"]) == epsilon and key in r.get("metrics", {})]
        if rs:
            out.append(f"{m} " + " / ".join(f"{np.mean([r['metrics'][key][x] for r in rs]):.3f}" for x in labels))
    return out


def render(res: dict) -> str:
    st = res["settings"]
    summary = res["summary"]
    eps_all = sorted({float(e) for m in summary.values() for e in m})
    methods = [m for m in ALL_METHODS if m in summary] + sorted(m for m in summary if m.startswith(SOURCE_METHOD))

    def used(kind):
        seen = []
        for r in res["records"]:
            cfg = r.get("info", {}).get("settings")
            if r["method"].startswith(kind) and cfg and cfg not in seen:
                seen.append(cfg)
        return seen
    lines = [
        f"Peer comparison: {st['private'].upper()} 2018 private"
        + (f" as {Path(st['private_file']).name}" if st.get("private_file") else "") + f" ({st['private_persons']} persons, "
        f"{st['private_households']} units incl. group-quarters persons), public = {', '.join(s.upper() for s in st['public'])}.",
        f"δ = 1/n² = {st['delta']:.3g}; ρ from (ε, δ) by the CKS conversion, the same ρ for every method. "
        f"Workload: all 165 3-way marginals of {', '.join(ATTRS)} on person records.",
        "mean L1 = mean over the 165 marginals of ‖p − q‖₁ (normalised; the papers' 'average error' is half of it); "
        "max cell = largest |p − q| over all cells; contains L1 = the same triples at household level "
        "(share of households containing a matching person; AIM/MST/JAM release no households).",
        "Mean ± s.e. over runs (no ± with one run). Wall time per run in seconds (2 shared CPU cores).",
        "",
    ]
    for e in eps_all:
        k = str(e)
        lines.append(f"ε = {e:g}   (ρ = {res['rho'][k]:.5g})")
        lines.append(f"  {'method':<26}{'runs':>5}  {'mean L1':>16}  {'max cell':>16}  {'contains L1':>16}  {'wall s':>9}")
        for m in methods:
            s = summary[m].get(k)
            if not s:
                continue
            lines.append(f"  {label(m):<26}{s['mean_l1']['n']:>5}  {fmt(s['mean_l1']):>16}  {fmt(s['max_cell']):>16}  "
                         f"{fmt(s['contains_l1']):>16}  {s['wall_s']['mean']:>9.0f}")
        ratios = []
        for num, den in (("dprelease", "aim"), ("dprelease", "mst"), ("dprelease", "public"), ("dprelease", "public0"),
                         ("dprelease", "aim_hh"), ("dprelease", "mst_hh"), ("dprelease", "jam"), ("dprelease", "jam_hh"),
                         ("hgem", "aim_hh"), ("hgem", "jam_hh"), ("hgem", "dprelease"),
                         ("dprelease_person", "aim"), ("dprelease_person", "mst"),
                         *((m, "dprelease") for m in methods if m.startswith(SOURCE_METHOD))):
            a, b = summary.get(num, {}).get(k), summary.get(den, {}).get(k)
            if a and b and a["mean_l1"]["mean"] and b["mean_l1"]["mean"]:
                ratios.append(f"{num}/{den} {a['mean_l1']['mean'] / b['mean_l1']['mean']:.2f}")
        best = [summary.get(m, {}).get(k) for m in ("aim_hh", "jam_hh")]
        if summary.get("dprelease", {}).get(k) and all(best):
            ratios.append(f"dprelease/min(aim_hh,jam_hh) {better_ratio(summary['dprelease'][k], *best):.2f}")
        if ratios:
            lines.append("  ratio of mean L1: " + ", ".join(ratios))
        if by_kind := breakdown(res["records"], methods, k, "l1_by_kind", KINDS):
            counts = [sum(marginal_kind(t) == kind for t in itertools.combinations(range(len(ATTRS)), 3)) for kind in KINDS]
            lines.append("  mean L1 by marginal kind (" + " / ".join(f"{kind}: {c}" for kind, c in zip(KINDS, counts)) + "): "
                         + "; ".join(by_kind))
        if by_attr := breakdown(res["records"], methods, k, "l1_by_attribute", ATTRS):
            lines.append("  mean L1 of the marginals with each attribute (" + " / ".join(ATTRS) + "): " + "; ".join(by_attr))
        lines.append("")
    lines += [
        "Privacy guarantees (read before comparing):",
        "  dprelease and public-only: household unit (add/remove a household of ≤ M persons), (ε, δ) over everything released.",
        "  dprelease (person unit): privacy_unit person (add/remove one person; the household's size and derived attributes",
        "    change with it, so up to k person records change), (ε, δ) over everything released: comparable with AIM, MST (person records).",
        "  AIM, MST (person records): the papers' add/remove-one-record DP on person rows. Under the household unit this is",
        f"    WEAKER: a household of k persons is k records (group privacy: kε). M = {st['max_household_size']}.",
        f"  AIM_hh, MST_hh: households clipped to M = {st['max_household_size']} persons ({st['clip_removed_persons']} persons removed), "
        "noise and selection sensitivity M: household-level DP, comparable with dprelease.",
        "  JAM, JAM_hh: as AIM and AIM_hh; the public states' data (clipped alike for JAM_hh) are measured at no cost.",
        "",
        "Settings:",
        *[f"  AIM: max_model_size {a['max_model_size']:g} MB, max_iters {a['max_iters']} mirror-descent iterations per round, "
          f"rounds T = {a['rounds'] or '16·d = 176'} (paper defaults: 80 MB, 1000, 16·d)" for a in used("aim")],
        *[f"  JAM: rounds T = {a['rounds']}, max_model_size {a['max_model_size']:g} MB, max_iters {a['max_iters']} (reference: 30, 80 MB, 1000), "
          "α = 0.2, 2% of ρ for the noisy person count N̂ that scales the public marginals; public data: the public states' persons "
          "without PUMA (cliques with PUMA are private candidates only)" for a in used("jam")],
        *[f"  MST: {a['iters']} mirror-descent iterations (reference: 10000), selection model 2500 iterations" for a in used("mst")],
        *(["  public-only: the pipeline with synthesizer public_baseline spends only its household-count share of ρ "
           "(count-of-counts / group_counts stages); the synthesis shares stay unspent."] if "public" in summary else []),
        *(["  public-only, exact counts: public_baseline with the invariant puma_household_counts: no noise at all "
           "(ε-independent; the PUMA household counts are exact, i.e. not DP)."] if "public0" in summary else []),
        f"  dprelease: config {st['dprelease']['config']} with domain {st['dprelease']['domain']}, privacy_unit household, "
        f"max_household_size {st['max_household_size']}, group_quarters single_person_households, oversize clip; "
        f"allocation {json.dumps(st['dprelease']['allocation'])}.",
        f"  pipeline source (engine/ tasks/ flows/ schemas/ as in the working tree at each pipeline run): "
        f"{', '.join(sorted({r['info'].get('pipeline_source_sha256') or 'not recorded' for r in res['records'] if r['method'] in PIPELINE and 'info' in r})) or '—'}.",
        *[f"  {SOURCE_METHOD}{name}: the pipeline of {s['path']} at commit {s['commit']}{' (engine/ tasks/ flows/ schemas/ modified)' if s['dirty'] else ''}, "
          f"its base config deploy/releases/acs2018_default.yaml with the keys {', '.join(SHARED_KEYS)} set as above; "
          f"allocation {json.dumps(s['base_config'].get('allocation'))}."
          for name, s in sorted(st.get("sources", {}).items())],
        f"  code: git {res['code']['commit']}{' (working tree modified)' if res['code']['dirty'] else ''}; mbi {res['code']['mbi']}, jax {res['code']['jax']}.",
        f"  started {res['started']}; {res['machine']}.",
    ]
    return "\n".join(lines) + "\n"


def code_info() -> dict:
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:  # noqa: BLE001
            return ""
    from importlib.metadata import PackageNotFoundError, version

    def ver(p):
        try:
            return version(p)
        except PackageNotFoundError:
            return None
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "mbi": ver("mbi"), "jax": ver("jax")}


def source_configs(roots: dict[str, Path], old: dict | None) -> dict[str, dict]:
    """Per ``--source`` checkout: its path, commit and base config (its own default release config,
    in its own format). A source the kept records of ``--resume`` already hold keeps their base
    config, as the main tree's does; the ones only the kept records name stay in the settings."""
    kept = dict((old or {}).get("settings", {}).get("sources") or {})
    out = dict(kept)
    for name, root in roots.items():
        info = source_info(root)
        if name in kept:
            if kept[name]["commit"] != info["commit"]:
                log(f"warning: source {name} is at {info['commit']}, its kept records at {kept[name]['commit']}")
            out[name] = {**kept[name], **info}
            continue
        out[name] = {**info, "base_config": yaml.safe_load((root / "deploy" / "releases" / "acs2018_default.yaml").read_text())}
    return out


# -- main ------------------------------------------------------------------------------------------
def add_split_arguments(ap: argparse.ArgumentParser) -> None:
    """The private/public split's options (shared with ``paired_rerun.py``)."""
    ap.add_argument("--private", default="nh", help="private state (two-letter code of the shared 2018 files)")
    ap.add_argument("--private-file", default=None, help="a person file of the --private state in place of its shared "
                    "file (e.g. a shifted copy from benchmarks/shift_inputs.py)")
    ap.add_argument("--public", default=None, help="comma-separated public states (default: the other eleven)")


def split_of(args: argparse.Namespace, ap: argparse.ArgumentParser) -> tuple[str, list[str], Path | None]:
    """(private state, public states, the private file in place of the shared one or None), checked."""
    private = args.private.lower()
    state_zip(private)
    public = [s.strip().lower() for s in args.public.split(",")] if args.public else [s for s in STATES if s != private]
    for s in public:
        state_zip(s)
    if private in public:
        ap.error("the private state cannot also be public")
    return private, public, Path(args.private_file).resolve() if args.private_file else None


def private_bench(private: str, max_size: int, private_file: Path | None, ap: argparse.ArgumentParser) -> Bench:
    """The private state's benchmark data; a ``--private-file`` must hold that state."""
    bench = Bench(private, max_size, private_file)
    if bench.st != FIPS[private]:
        ap.error(f"--private-file {private_file} holds state {bench.st}, not {private.upper()} ({FIPS[private]}): set --private")
    return bench


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_split_arguments(ap)
    ap.add_argument("--epsilons", default="0.1,0.25,0.5,1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", default="aim,mst,dprelease,public", help=f"comma-separated, from {','.join(ALL_METHODS)}")
    ap.add_argument("--max-model-size", type=float, default=80.0, help="AIM: model size limit in MB (paper: 80)")
    ap.add_argument("--max-iters", type=int, default=1000, help="AIM: mirror-descent iterations per round (paper: 1000)")
    ap.add_argument("--rounds", type=int, default=None, help="AIM: T (default 16·d = 176)")
    ap.add_argument("--jam-rounds", type=int, default=30, help="JAM: rounds T (reference: 30)")
    ap.add_argument("--mst-iters", type=int, default=10000, help="MST: mirror-descent iterations of the final fit")
    ap.add_argument("--max-household-size", type=int, default=None,
                    help="M for dprelease and the *_hh variants (≥ 7 to score NP 7+; default: the base config's "
                         "household_rules.max_household_size, as the release ships it, or the kept records' M with --resume)")
    ap.add_argument("--cpus", type=int, default=0, help="pin AIM/MST to this many cores (0: no pinning); the pipeline subprocess is not pinned")
    ap.add_argument("--quick", action="store_true", help="smoke run: ε = 1, 1 run, AIM 1 MB / 100 iterations / 20 rounds, MST 1000 iterations")
    ap.add_argument("--resume", action="store_true", help="keep the cells of an existing result file and run only the missing ones")
    ap.add_argument("--config", default=None, help="base release config of the pipeline runs, read once at the start "
                    "(default: deploy/releases/acs2018_default.yaml; with --resume: the one stored with the kept records)")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                    help="another checkout of the repository (e.g. a git worktree at another commit), run as method "
                         "dprelease@NAME with its own pipeline and default release config (repeatable)")
    ap.add_argument("--tag", default=None)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    if args.quick:
        args.epsilons, args.runs = "1", 1
        args.max_model_size, args.max_iters, args.rounds, args.mst_iters, args.jam_rounds = 1.0, 100, 20, 1000, 10
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        source_roots = parse_sources(args.source)
    except ValueError as ex:
        ap.error(str(ex))
    bad = [m for m in methods if m not in ALL_METHODS and m.removeprefix(SOURCE_METHOD) not in source_roots]
    if bad:
        ap.error(f"unknown methods {bad} (dprelease@NAME needs --source NAME=PATH)")
    private, public, private_file = split_of(args, ap)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    private_file_name = str(private_file) if private_file else None
    name = private_file.stem.removeprefix("csv_p") if private_file else private
    tag = args.tag or (name + ("_quick" if args.quick else ""))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, txt_path = out_dir / f"peer_comparison_{tag}.json", out_dir / f"peer_comparison_{tag}.txt"
    old = json.loads(json_path.read_text()) if args.resume and json_path.exists() else None  # the kept records
    if args.config is None and old is not None:  # the same set-up as the kept records
        base_config = old["settings"]["dprelease"].get("base_config")
        config_name = old["settings"]["dprelease"]["config"]
    else:
        base_config = None
    if base_config is None:
        config_name = os.path.relpath(Path(args.config or DEFAULT_CONFIG).resolve(), ROOT)
        base_config = yaml.safe_load(Path(args.config or DEFAULT_CONFIG).read_text())
    sources = source_configs(source_roots, old)
    if args.max_household_size is None:
        args.max_household_size = old["settings"]["max_household_size"] if old is not None else household_max_size(base_config)
    if args.max_household_size < NP_TOP:
        ap.error(f"--max-household-size must be ≥ {NP_TOP} (NP is scored as 1..6, 7+)")
    if args.cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])

    log(f"loading {private.upper()} (private) with {SPEC_PATH.name}")
    bench = private_bench(private, args.max_household_size, private_file, ap)
    n = bench.n
    delta = 1.0 / n**2
    log(f"{n} persons, {bench.truth_hh['n_households']} units, {len(bench.pumas)} PUMAs; δ = 1/n² = {delta:.3g}; "
        f"clip to M={bench.M} removes {bench.clip_removed} persons")

    records: list[dict] = []
    if old is not None:
        if (old["settings"]["private"], old["settings"].get("private_file"), old["settings"]["max_household_size"]) != (private, private_file_name, bench.M):
            ap.error(f"{json_path} holds another set-up; use another --tag")
        records = [r for r in old["records"] if "error" not in r]
        if old["settings"].get("dprelease", {}).get("allocation") != (base_config.get("advanced") or {}).get("allocation"):
            log("warning: the base config's allocation differs from the one of the kept records (see each record's info.allocation)")
        log(f"resuming: {len(records)} finished cells kept from {json_path.name}")
    have = {(r["method"], float(r["epsilon"]), r["run"]) for r in records}
    if any(m in ALL_METHODS and m not in PIPELINE for m in methods):
        import mbi  # noqa: F401,I001  (fail early when the bench extra is missing; the pipeline methods need none)

    from peers.common import cdp_rho

    res = {
        "benchmark": "peer_comparison",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
        "code": code_info(),
        "settings": {
            "private": private, "private_file": private_file_name, "public": public, "private_persons": n, "private_households": int(bench.truth_hh["n_households"]),
            "delta": delta, "epsilons": epsilons, "runs": args.runs, "methods": methods, "quick": args.quick,
            "max_household_size": bench.M, "clip_removed_persons": int(bench.clip_removed),
            "aim": {"max_model_size": args.max_model_size, "max_iters": args.max_iters, "rounds": args.rounds},
            "mst": {"iters": args.mst_iters},
            "jam": {"rounds": args.jam_rounds},
            "dprelease": {"config": config_name, "domain": str(SPEC_PATH.relative_to(ROOT)),
                          "allocation": (base_config.get("advanced") or {}).get("allocation"), "base_config": base_config},
            "attributes": {a: int(s) for a, s in zip(ATTRS, bench.shape)},
            "pinned_cpus": args.cpus or None,
            "sources": sources,
        },
        "rho": {str(e): eps_delta_to_rho(e, delta, "cks") for e in epsilons},
        "rho_reference_cdp2adp": {str(e): cdp_rho(e, delta) for e in epsilons},
        "records": records,
    }
    if old is not None:
        res["rho"] = {**old.get("rho", {}), **res["rho"]}

    def save():
        res["summary"] = summarise(res["records"])
        json_path.write_text(json.dumps(res, indent=1))
        txt_path.write_text(render(res))

    with tempfile.TemporaryDirectory(prefix="peer_comparison_") as t:
        tmp = Path(t)
        order = [m for m in EXEC_ORDER if m in methods] + [m for m in methods if m.startswith(SOURCE_METHOD)]  # cheapest first
        for run in range(args.runs):  # one pass over every ε first: a cut-short run still covers the grid
            for e in epsilons:
                rho = res["rho"][str(e)]
                for m in order:
                    if (m, e, run) in have:
                        continue
                    log(f"ε={e:g} run {run + 1}/{args.runs}: {m} ...")
                    t1 = time.perf_counter()
                    try:
                        if m in PIPELINE:
                            metrics, info = run_pipeline(base_config, m, bench, public, e, delta, tmp, f"peer-{m}-{str(e).replace('.', 'p')}-{run}")
                        elif m.startswith(SOURCE_METHOD):
                            name = m.removeprefix(SOURCE_METHOD)
                            metrics, info = run_pipeline(sources[name]["base_config"], SOURCE_METHOD.rstrip("@"), bench, public, e, delta, tmp,
                                                         f"peer-{name}-{str(e).replace('.', 'p')}-{run}", root=source_roots[name])
                            info["source_commit"] = sources[name]["commit"]
                        else:
                            metrics, info = run_peer(m, bench, public, rho, args)
                    except Exception as ex:  # noqa: BLE001 - record and go on with the other cells
                        log(f"ε={e:g} run {run + 1}: {m} FAILED: {ex}")
                        res["records"].append({"method": m, "epsilon": e, "run": run, "error": str(ex)[-4000:]})
                        save()
                        continue
                    wall = time.perf_counter() - t1
                    res["records"].append({"method": m, "epsilon": e, "run": run, "wall_s": wall, "metrics": metrics, "info": info})
                    save()
                    extra = f", contains L1 {metrics['contains_l1']:.4f}" if "contains_l1" in metrics else ""
                    log(f"ε={e:g} run {run + 1}: {m} mean L1 {metrics['mean_l1']:.4f}, max cell {metrics['max_cell']:.4f}{extra} ({wall:.0f}s)")
    save()
    sys.stdout.write(render(res))
    log(f"wrote {json_path} and {txt_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
