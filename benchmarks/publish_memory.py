"""Peak memory and time of publishing a large release, one state at a time against all at once.

Builds node files like the PUMA stage's (``RunPaths.node_path`` names) by replicating the shared
Vermont 2018 households: ``--states`` states of ``--pumas`` PUMAs, each PUMA a re-keyed copy of
``--share`` of Vermont's households (default: 50 x 10 PUMAs x half of Vermont, about 680,000
households and 500 PUMAs). Then publishes them with ``write_release`` (the release gate, the
contract, the count-of-counts table, the report), each mode in a fresh process:

- ``parts``: ``ReleaseParts.from_node_files``, the publish stage's way (one state in memory);
- ``whole``: the same node files concatenated into one part, as publishing held the release before.

Reports the peak resident set size of the publishing process (``ru_maxrss``) and its wall time.

    python benchmarks/publish_memory.py [--states 50] [--pumas 10] [--share 0.5] [--modes parts,whole]

Inputs and releases live in a temporary directory that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.count_of_counts import geography_hierarchy, size_histograms  # noqa: E402
from engine.data import HierarchicalData, node_key  # noqa: E402
from schemas.domain_spec import load_domain_spec  # noqa: E402
from schemas.ingestion import HouseholdRules, load_person_file  # noqa: E402
from tasks.count_of_counts import as_table  # noqa: E402
from tasks.release_parts import ReleaseParts  # noqa: E402
from tasks.run_context import RunPaths  # noqa: E402

VERMONT = ROOT.parent / "shared" / "data" / "acs2018_1yr" / "csv_pvt.zip"


def build(directory: Path, states: int, pumas: int, share: float) -> list[str]:
    """Node files of ``states`` x ``pumas`` PUMAs, each a re-keyed copy of the first ``share`` of Vermont."""
    data, _ = load_person_file(VERMONT, load_domain_spec(), HouseholdRules())
    copy = data.take(np.arange(int(data.n_households * share)))
    paths = RunPaths(directory / "work", directory / "release")
    files = []
    for st in range(1, states + 1):
        for p in range(1, pumas + 1):
            out = paths.node_path("synthesis", node_key((st, 100 * p)))
            out.parent.mkdir(parents=True, exist_ok=True)
            copy.with_geo(np.tile([st, 100 * p], (copy.n_households, 1))).to_npz(out)
            files.append(str(out))
    return files


def publish(files: list[str], release: Path, mode: str) -> dict:
    from schemas.release_expectations import ReleaseGateRun, ReleaseGeography, householder_of
    from tasks.publish import write_release

    start = time.perf_counter()
    parts = ReleaseParts.from_node_files(files)
    if mode == "whole":
        parts = ReleaseParts(parts.domain, (lambda: HierarchicalData.concat(list(ReleaseParts.from_node_files(files))),))
    leaves = np.array([(int(Path(f).stem[2:4]), int(Path(f).stem.split("PUMA")[1])) for f in files])
    h = geography_hierarchy(leaves)
    K = parts.domain.max_size
    H = sum(size_histograms(h, part.geo, part.sizes, K) for part in parts)
    coc = as_table(list(h.keys), h.level, H)
    geography = ReleaseGeography(tuple(map(tuple, leaves.tolist())))
    householder = householder_of(load_domain_spec(), parts.domain)
    manifest = write_release(release, parts, {"release": "bench"}, count_of_counts=coc,
                             gate=lambda with_coc: ReleaseGateRun(parts.domain, geography, householder, with_coc))
    return {"mode": mode, "seconds": round(time.perf_counter() - start, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "outputs": len(manifest["outputs"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=50)
    ap.add_argument("--pumas", type=int, default=10)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--modes", default="parts,whole", help="comma-separated: parts, whole (both: their files compared)")
    ap.add_argument("--publish", nargs=2, metavar=("DIR", "MODE"), help=argparse.SUPPRESS)  # the measured child process
    args = ap.parse_args()
    if not 1 <= args.states <= 99:
        ap.error("--states: 1..99 (ST is two digits)")
    if args.publish:
        d = Path(args.publish[0])
        files = json.loads((d / "files.json").read_text())
        print(json.dumps(publish(files, d / f"release-{args.publish[1]}", args.publish[1])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files = build(d, args.states, args.pumas, args.share)
        (d / "files.json").write_text(json.dumps(files))
        n = sum(HierarchicalData.from_npz(f).n_households for f in files[: args.pumas]) * args.states
        print(f"{args.states} states, {len(files)} PUMAs, {n} households")
        results = []
        modes = args.modes.split(",")
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--publish", str(d), mode], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"publishing ({mode}) failed:\n{out.stderr}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(results[-1], flush=True)
        if modes != ["parts", "whole"]:
            return
        outputs = json.loads((d / "release-parts" / "manifest.json").read_text())["outputs"]
        differ = [f for f in outputs if (d / "release-parts" / f).read_bytes() != (d / "release-whole" / f).read_bytes()]
        print(f"the two releases' {len(outputs)} files are identical" if not differ else f"{len(differ)} files differ, e.g. {differ[:3]}")


if __name__ == "__main__":
    main()
