"""One state's synthesis timed in-process, with a digest of what it released: the before/after
check of a change to the synthesis hot paths.

It runs ``engine.synthesize_state`` (the floor simulation, the prior mixture, the state fit with
its adaptive rounds, every PUMA fit and the balanced draws) on one private state of the shared
2018 data with the given public states as the prior, at the default release's synthesis settings
(``ReleaseConfig.synthesis_settings`` of ``deploy/releases/acs2018_default.yaml``: what the flow runs). The measurements are stored in
``--work`` on the first run and read back by every later one (the ledger is kept there too), so
runs of different commits fit the same noisy answers: their digests (sha256 of the released
households' arrays, and of the diagnostics) must be equal for a change that keeps every result.
BLAS runs on one thread, as in the pipeline's Dask worker processes (distributed's nanny sets
``OPENBLAS_NUM_THREADS=1``); an in-process run with threaded BLAS on a busy machine mostly times
its threads waiting on each other. CPU seconds are the figure to compare on a shared machine;
compare commits in one sitting, alternating runs.

With ``--stages`` it runs the state's steps as the pipeline's tasks do (``tasks.synthesize``: the state fit
and its error estimates, then every PUMA's fit, the balanced draws and their error estimates, the
response's products shared across the PUMAs) and gives each step's CPU seconds and the relabelled
copies the state's prior mixture weighed in; the strength floor is simulated once per work directory
and the support's balance targets are built before the timing (a Dask worker builds both once per
run). ``--private`` may name several states (with ``--stages``): they run one after the other, on one support
whose widened copies are built once per set of flips, as the states of one Dask worker (a state after the first
finds the lists every state groups, ``IncidenceCache.keep``); each repeat runs them all again.
``--private-data`` and ``--geography`` take a state of another input, e.g. a copy of
``benchmarks/national_input.py``'s national input with its PUMA list.

    python benchmarks/state_speed.py --work /tmp/state_speed [--data ../shared/data/acs2018_1yr] [--private nm] [--public id,nd,nh,ri,sd,wy] [--repeats 3]
    python benchmarks/state_speed.py --work /tmp/state_speed --stages --private ak --private-data /tmp/national \
        --geography /tmp/national/pumas.yaml --public de,id,me,mt,nd,ne,nh,nm,ri,sd,vt,wy --repeats 2
    python benchmarks/state_speed.py --work /tmp/state_speed --stages --private ak,al --private-data /tmp/national \
        --geography /tmp/national/pumas.yaml --public de,id,me,mt,nd,ne,nh,nm,ri,sd,vt,wy --repeats 2
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy loads BLAS
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import engine as dp  # noqa: E402
from engine.data import HierarchicalData  # noqa: E402
from engine.queries import Support, Workload  # noqa: E402
from engine.synthesis import (  # noqa: E402
    BalanceTargets,
    Flip,
    SharedPrior,
    WidenedSupport,
    choose_puma_workloads,
    choose_workloads,
    fit_state,
    floor_rho,
    measured_counts,
    release_pumas,
    simulate_strength_floor,
    widen,
)
from schemas.domain_spec import load_domain_spec  # noqa: E402
from schemas.geography import load_puma_list, shipped_puma_list  # noqa: E402
from schemas.ingestion import HouseholdRules, load_person_file  # noqa: E402
from schemas.release_config import load_config  # noqa: E402
from tasks.synthesize import answer_sd  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "acs2018_1yr"


def load_state(abbr: str, work: Path, data_dir: Path = DATA) -> HierarchicalData:
    """A state's households, read once from ``data_dir`` and kept in ``work``."""
    cached = work / (f"{abbr}.npz" if data_dir == DATA else f"{data_dir.name}_{abbr}.npz")
    if not cached.exists():
        data, _ = load_person_file(data_dir / f"csv_p{abbr}.zip", load_domain_spec(), HouseholdRules(max_household_size=8))
        data.to_npz(cached)
    return HierarchicalData.from_npz(cached)


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def open_session(private: HierarchicalData, work: Path, epsilon: float, geography: Path | None) -> tuple[dp.PrivateSession, int]:
    plan = dp.state_plan(epsilon=epsilon, delta=1e-10)
    state = int(private.geo[0, 0])
    pumas = shipped_puma_list() if geography is None else load_puma_list(geography)
    session = dp.PrivateSession(private, "household", dp.PrivacyLedger(work / "ledger.jsonl", plan), dp.MeasurementStore(work / "measurements"),
                                geography=pumas.restricted([state]))  # the state's PUMAs
    return session, state


def settings_for(public: HierarchicalData) -> dp.SynthesisSettings:
    return load_config(ROOT / "deploy" / "releases" / "acs2018_default.yaml").synthesis_settings(public.domain)


def run_once(private: HierarchicalData, public: HierarchicalData, work: Path, epsilon: float, seed: int, geography: Path | None = None) -> dict:
    session, state = open_session(private, work, epsilon, geography)
    wall, cpu = time.perf_counter(), time.process_time()
    release = dp.synthesize_state(session, state, public, settings_for(public), seed=seed)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    r = release.data
    return {"cpu_s": cpu, "wall_s": wall, "households": r.n_households,
            "release": digest(r.group, r.person, r.geo, r.person_offsets),
            "diagnostics": hashlib.sha256(json.dumps(release.diagnostics, sort_keys=True, default=str).encode()).hexdigest()[:16]}


class StageClock:
    """CPU seconds of this thread per named step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.thread_time()

    def lap(self, step: str) -> None:
        now = time.thread_time()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._last
        self._last = now


class WorkerSupports:
    """The public support widened by each set of flips, built once (``tasks.synthesize.cached_widened``): the
    states run after the first on a support find its per-workload incidences and the lists every state groups, as on
    a Dask worker."""

    def __init__(self, public: HierarchicalData, support: Support) -> None:
        self.public, self.support = public, support
        self._widened: dict[tuple[Flip, ...], WidenedSupport] = {}

    def __call__(self, flips: tuple[Flip, ...]) -> WidenedSupport:
        if flips not in self._widened:
            self._widened[flips] = widen(self.public, flips, public_cache=self.support.cache)
        return self._widened[flips]


def run_stages(private: HierarchicalData, public: HierarchicalData, support: Support, balance: BalanceTargets, work: Path,
               epsilon: float, seed: int, geography: Path | None = None, supports: WorkerSupports | None = None) -> dict:
    """One state's steps as ``tasks.synthesize``'s state and PUMA tasks run them, each step timed. ``supports``:
    the widened supports kept across calls (a worker's); without it each call widens the support afresh."""
    session, state = open_session(private, work, epsilon, geography)
    settings = settings_for(public)
    plan = session.ledger.plan
    pumas = sorted(n for n in session.nodes("puma") if n[0] == state)
    counts = measured_counts(session, pumas)
    selection = choose_workloads(public, settings)
    selection, _ = choose_puma_workloads(public, selection, session.unit, plan.allocation("puma_synthesis", "puma"),
                                         [counts[n].households for n in pumas], settings)
    floor_file = work / "strength_floor.json"  # a run-level stage of the pipeline: simulated once here too
    if not floor_file.exists():
        floor_file.write_text(json.dumps(simulate_strength_floor(support, selection.state, session.unit, floor_rho(
            plan.allocation("state_synthesis", "state"), settings), settings.strength_candidates).floor))
    floor = float(json.loads(floor_file.read_text()))
    clock, wall = StageClock(), time.perf_counter()
    widen_by = WorkerSupports(public, support) if supports is None else supports
    st = fit_state(session, state, support, widen_by, selection, counts[(state,)], settings,
                   pumas=pumas, strength_floor=floor)
    clock.lap("state fit")
    state_sd = answer_sd(st.support, st.result, st.prior, selection.state, st.record, settings.prior_strength, counts[(state,)], extra=st.sums)
    clock.lap("state intervals")
    # the widened support's balance targets extend the public ones (tasks.synthesize.cached_balance)
    targets = balance if st.support is support else balance.with_copies(support.data, st.support.data.take(np.arange(support.n_support, st.support.n_support)),
                                                                        widen_by(st.flips).copies)
    clock.lap("balance targets of the widened support")
    rel = release_pumas(session, st.support, st.result.weights, selection.puma, [(n, counts[n]) for n in pumas], settings, seed,
                        targets=st.targets(), balance=targets)
    clock.lap("PUMA fits and draws")
    queries = [Workload.from_id(w) for w in st.record.sigmas]
    shared = SharedPrior(st.support, st.result.weights, queries)
    puma_sd = [answer_sd(st.support, f.result, f.prior, selection.puma, f.record, settings.prior_strength, counts[f.node], queries, shared=shared)
               for f in rel.fits]
    clock.lap("PUMA intervals")
    r = HierarchicalData.concat(rel.draws)
    return {"cpu_s": sum(clock.seconds.values()), "wall_s": time.perf_counter() - wall, "households": r.n_households, "steps": clock.seconds,
            "release": digest(r.group, r.person, r.geo, r.person_offsets),
            "diagnostics": hashlib.sha256(json.dumps([st.result.diagnostics, *(f.result.diagnostics for f in rel.fits)], sort_keys=True,
                                                     default=str).encode()).hexdigest()[:16],
            "intervals": hashlib.sha256(json.dumps([state_sd, puma_sd], sort_keys=True).encode()).hexdigest()[:16],
            "mixture": st.mixture.to_dict() if st.mixture else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="keeps the states' data, the stored measurements and the ledger between runs")
    ap.add_argument("--data", type=Path, default=DATA, help="the 2018 1-year PUMS files (csv_pXX.zip)")
    ap.add_argument("--private", default="nm")
    ap.add_argument("--public", default="id,nd,nh,ri,sd,wy")
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", action="store_true", help="the tasks' steps, each timed, the error estimates included")
    ap.add_argument("--private-data", type=Path, default=None, help="the private state's file's folder (default: --data)")
    ap.add_argument("--geography", type=Path, default=None, help="the PUMA list of the private state's input (default: the shipped one)")
    args = ap.parse_args(argv)
    privates = args.private.split(",")
    if len(privates) > 1 and not args.stages:
        ap.error("several --private states need --stages (they share one worker's supports)")
    private_data = args.private_data or args.data
    source = "" if private_data == args.data else f"{private_data.name}_"
    args.work.mkdir(parents=True, exist_ok=True)
    public = HierarchicalData.concat([load_state(s, args.work, args.data) for s in args.public.split(",")])
    states = {abbr: load_state(abbr, args.work, private_data) for abbr in privates}
    works = {abbr: args.work / f"{source}{abbr}_from_{args.public.replace(',', '_')}_eps{args.epsilon:g}{'_stages' if args.stages else ''}"
             for abbr in privates}
    for work in works.values():
        work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {abbr: [] for abbr in privates}
    if args.stages:
        support = Support.from_data(public)
        balance = BalanceTargets.for_data(public)
        supports = WorkerSupports(public, support)  # one worker's: every state and repeat after the first finds its caches
        for _ in range(args.repeats):
            for abbr in privates:
                runs[abbr].append(run_stages(states[abbr], public, support, balance, works[abbr], args.epsilon, args.seed, args.geography,
                                             supports))
    else:
        runs[privates[0]] = [run_once(states[privates[0]], public, works[privates[0]], args.epsilon, args.seed, args.geography)
                             for _ in range(args.repeats)]
    failed = False
    for abbr, state_runs in runs.items():
        label = f"{abbr}: " if len(privates) > 1 else ""
        for r in state_runs:
            steps = "".join(f"  {k} {v:.2f}" for k, v in r.get("steps", {}).items())
            print(f"{label}cpu {r['cpu_s']:.2f} s  wall {r['wall_s']:.2f} s{steps}  households {r['households']}  release {r['release']}  "
                  f"diagnostics {r['diagnostics']}" + (f"  intervals {r['intervals']}" if "intervals" in r else ""))
        if state_runs[0].get("mixture"):  # the relabellings the state weighed in (the same in every run: the measurements are read back)
            m = state_runs[0]["mixture"]
            print(f"{label}prior mixture: " + (", ".join(f"{a} {w:.3f}" for a, w in zip(m["attributes"], m["weights"]) if w > 0)
                                              or "the public support") + f" (candidates {', '.join(m['attributes'])})")
        print(f"{label}median cpu {statistics.median(r['cpu_s'] for r in state_runs):.2f} s, "
              f"wall {statistics.median(r['wall_s'] for r in state_runs):.2f} s")
        if len({(r["release"], r["diagnostics"], r.get("intervals")) for r in state_runs}) != 1:
            print(f"{label}the runs released different households: the measurements were not all read back", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
