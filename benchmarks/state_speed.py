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

    python benchmarks/state_speed.py --work /tmp/state_speed [--data ../shared/data/acs2018_1yr] [--private nm] [--public id,nd,nh,ri,sd,wy] [--repeats 3]
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
from schemas.domain_spec import load_domain_spec  # noqa: E402
from schemas.geography import shipped_puma_list  # noqa: E402
from schemas.ingestion import HouseholdRules, load_person_file  # noqa: E402
from schemas.release_config import load_config  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "acs2018_1yr"


def load_state(abbr: str, work: Path, data_dir: Path = DATA) -> HierarchicalData:
    """A state's households, read once from ``data_dir`` and kept in ``work``."""
    cached = work / f"{abbr}.npz"
    if not cached.exists():
        data, _ = load_person_file(data_dir / f"csv_p{abbr}.zip", load_domain_spec(), HouseholdRules(max_household_size=8))
        data.to_npz(cached)
    return HierarchicalData.from_npz(cached)


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def run_once(private: HierarchicalData, public: HierarchicalData, work: Path, epsilon: float, seed: int) -> dict:
    plan = dp.state_plan(epsilon=epsilon, delta=1e-10)
    state = int(private.geo[0, 0])
    geography = shipped_puma_list().restricted([state])  # the state's published PUMAs
    session = dp.PrivateSession(private, "household", dp.PrivacyLedger(work / "ledger.jsonl", plan), dp.MeasurementStore(work / "measurements"),
                                geography=geography)
    wall, cpu = time.perf_counter(), time.process_time()
    settings = load_config(ROOT / "deploy" / "releases" / "acs2018_default.yaml").synthesis_settings(public.domain)
    release = dp.synthesize_state(session, state, public, settings, seed=seed)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    r = release.data
    return {"cpu_s": cpu, "wall_s": wall, "households": r.n_households,
            "release": digest(r.group, r.person, r.geo, r.person_offsets),
            "diagnostics": hashlib.sha256(json.dumps(release.diagnostics, sort_keys=True, default=str).encode()).hexdigest()[:16]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="keeps the states' data, the stored measurements and the ledger between runs")
    ap.add_argument("--data", type=Path, default=DATA, help="the 2018 1-year PUMS files (csv_pXX.zip)")
    ap.add_argument("--private", default="nm")
    ap.add_argument("--public", default="id,nd,nh,ri,sd,wy")
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    work = args.work / f"{args.private}_from_{args.public.replace(',', '_')}_eps{args.epsilon:g}"
    work.mkdir(parents=True, exist_ok=True)
    private = load_state(args.private, args.work, args.data)
    public = HierarchicalData.concat([load_state(s, args.work, args.data) for s in args.public.split(",")])
    runs = [run_once(private, public, work, args.epsilon, args.seed) for _ in range(args.repeats)]
    for r in runs:
        print(f"cpu {r['cpu_s']:.2f} s  wall {r['wall_s']:.2f} s  households {r['households']}  release {r['release']}  diagnostics {r['diagnostics']}")
    print(f"median cpu {statistics.median(r['cpu_s'] for r in runs):.2f} s, wall {statistics.median(r['wall_s'] for r in runs):.2f} s")
    if len({(r["release"], r["diagnostics"]) for r in runs}) != 1:
        print("the runs released different households: the measurements were not all read back", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
