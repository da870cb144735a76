"""Calibration of the 90 % intervals ``dprelease query`` attaches (issue 18 item 4; internal: it
reads the confidential inputs, so its output is benchmark/QA material, never a release).

For a finished release of a config: every marginal the run measured at a node (household-level
partition workloads at the state and PUMA nodes, household-size histograms at every node) is
queried from the release with ``tasks.release_query.query_release`` — the code a data user runs —
and each cell's 90 % interval is checked against the confidential answer. Reported per level:
cells, the share inside the interval (target 85–95 %), and the same share for the synthetic
count (how often the released microdata itself falls inside).

    python benchmarks/interval_calibration.py --config deploy/releases/acs2018_default.yaml --release releases/acs2018-default
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.hierarchical_data import HierarchicalData  # noqa: E402
from engine.queries import Workload, answer  # noqa: E402
from schemas.release_config import load_config  # noqa: E402
from tasks.ingest import load_input  # noqa: E402
from tasks.release_query import query_release  # noqa: E402

OUT = ROOT / "benchmarks" / "results"


def node_data(private: HierarchicalData, node: str) -> HierarchicalData:
    if node == "nation":
        return private
    parts = dict(p.split("=") for p in node.split("/"))
    mask = private.geo[:, 0] == int(parts["ST"])
    if "PUMA" in parts:
        mask &= private.geo[:, 1] == int(parts["PUMA"])
    return private.select(mask)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--release", required=True, help="the finished release directory of that config")
    ap.add_argument("--out", default=str(OUT / "interval_calibration.txt"))
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    private = HierarchicalData.concat([load_input(cfg, spec)[0] for spec in cfg.private])
    d = private.domain
    m = pq.read_table(Path(args.release) / "measurements.parquet", columns=["workload_id", "node", "level"]).to_pandas()
    m = m[(m.workload_id == "size_histogram") | (m.workload_id.str.startswith("group:") & m.workload_id.str.endswith("|"))]
    pairs = m.drop_duplicates(["workload_id", "node"])
    stats: dict[str, list[int]] = {}
    t0 = time.time()
    for wid, node, level in pairs[["workload_id", "node", "level"]].itertuples(index=False):
        margin = [d.size_attribute] if wid == "size_histogram" else wid[len("group:"):-1].split(",")
        where = {} if node == "nation" else dict(p.split("=") for p in node.split("/"))
        t = query_release(args.release, margin, "group", where)
        if "lower_90" not in t.columns:
            continue
        truth = answer(node_data(private, node), Workload("group", tuple(margin), ())).reshape(-1)
        if wid == "size_histogram":  # the release clips sizes at max_size, as the measurement did
            truth = truth[: len(t)]
        inside = (t.lower_90.to_numpy() <= truth) & (truth <= t.upper_90.to_numpy())
        synth_inside = (t.lower_90.to_numpy() <= t["count"].to_numpy()) & (t["count"].to_numpy() <= t.upper_90.to_numpy())
        s = stats.setdefault(level, [0, 0, 0])
        s[0] += truth.size
        s[1] += int(inside.sum())
        s[2] += int(synth_inside.sum())
    lines = [f"Interval calibration (issue 18 item 4): {args.config}, release {Path(args.release).name}, "
             f"{len(pairs)} measured marginals; {time.time() - t0:.0f} s.",
             "Per level: cells with a 90 % interval; share of confidential answers inside (target 85-95 %); "
             "share of the released synthetic counts inside.",
             f"  {'level':<8}{'cells':>8}{'truth inside':>15}{'synthetic inside':>19}"]
    for level in ("nation", "state", "puma"):
        if level in stats:
            n, a, b = stats[level]
            lines.append(f"  {level:<8}{n:>8}{a / n:>15.3f}{b / n:>19.3f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps({"config": args.config, "stats": stats}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
