"""Where do the released household totals leave the confidential ones? Stage by stage, per PUMA,
state and nation, for releases already run (``python -m flows.cli run <config> --name <name>``):

  raw        the sum of the node's noisy size histogram (one measurement of its household count)
  consistent the household counts merged by inverse variance and made consistent (integer least squares)
  fitted     each node's total fitted jointly with its posterior (``engine.synthesis``; the
             synthesis diagnostics beside each posterior; PUMAs and states)
  held       the PUMAs' fitted totals held to their state's consistent count, replayed from the
             stored fits (``engine.synthesis.totals_to_parent``)
  released   the household sizes of the released microdata (``count_of_counts.parquet``)

each minus the confidential count (from ``work/<name>/inputs/private-merged.npz``: internal QA, which
may compare against the confidential data; the output is not a release). Per level: the mean error
with its standard error over the nodes, the RMS error, and over all the runs given, the mean of the
per-run means. Everything but ``held`` is read, nothing is refitted or measured again.

Then, pooled over every node of every release given (releases with different private states, e.g. the
default release and the same config with its private and public states swapped, so all 12 shared states
are private once): the mean released − confidential error per level, its standard error over the
nodes, and the DP standard deviation of one node's household count (``households_sd`` of the
count-of-counts hierarchy, the root mean square over the nodes). The totals are unbiased when the
pooled mean is within its standard error's noise of zero; the release's own check is that it lies
within one DP standard deviation of a node's count.

    python benchmarks/household_total_bias.py bias-1 bias-2 bias-3
    python benchmarks/household_total_bias.py bias-default-{1,2,3} bias-swapped-{1,2,3} --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from engine.data import LEVELS, HierarchicalData, node_key, parse_node_key
from engine.synthesis import totals_to_parent
from tasks.run_context import RunPaths

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("raw", "consistent", "fitted", "held", "released")


def fitted_total(work: Path, node: tuple[int, ...]) -> float:
    """The total the node's synthesis fitted (its diagnostics), NaN where none was recorded."""
    stage = "synthesis" if len(node) == 2 else "state_posterior"
    path = RunPaths(work, ROOT / "releases" / work.name).node_path(stage, node_key(node)).with_suffix(".json")
    if not path.exists():
        return float("nan")
    return float(json.loads(path.read_text())["diagnostics"].get("total", {}).get("fitted", float("nan")))


def trace(name: str) -> dict[str, dict[str, np.ndarray]]:
    """{level: {stage: error per node}} of one release, with the DP standard deviation of each node's
    household count under the stage name ``dp_sd``."""
    work, release = ROOT / "work" / name, ROOT / "releases" / name
    geo = HierarchicalData.from_npz(work / "inputs" / "private-merged.npz").geo
    with np.load(work / "nodes" / "count_of_counts" / "hierarchy.npz", allow_pickle=False) as z:
        keys, level, consistent, raw = [str(k) for k in z["keys"]], z["level"], z["households"], z["raw_histograms"].sum(axis=1)
        dp_sd = z["households_sd"]
    released_table = pq.read_table(release / "count_of_counts.parquet").to_pandas().groupby("node")["households"].sum()
    nodes = [parse_node_key(k) for k in keys]
    confidential = np.array([np.all(geo[:, : len(n)] == np.array(n, dtype=geo.dtype), axis=1).sum() for n in nodes])
    fitted = np.array([fitted_total(work, n) if n else float("nan") for n in nodes])
    held = np.full(len(nodes), np.nan)
    pumas = np.flatnonzero(level == 2)
    for state in {nodes[i][0] for i in pumas}:
        ids = np.array([i for i in pumas if nodes[i][0] == state])
        held[ids] = totals_to_parent(fitted[ids], consistent[ids])
    for lv in (1, 0):  # a parent's held total is its children's sum
        for i in np.flatnonzero(level == lv):
            held[i] = held[[j for j in range(len(nodes)) if level[j] == lv + 1 and nodes[j][: len(nodes[i])] == nodes[i]]].sum()
    released = np.array([released_table.get(k, np.nan) for k in keys], dtype=np.float64)
    values = dict(zip(STAGES, (raw, consistent, fitted, held, released)))
    return {LEVELS[lv]: {**{s: (v - confidential)[level == lv] for s, v in values.items()}, "dp_sd": dp_sd[level == lv]}
            for lv in range(3)}


def pooled(runs: dict[str, dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per level and stage, over every node of every run: the number of nodes, the mean error, its standard
    error over the nodes, the RMS error, and the RMS of the nodes' DP standard deviations."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for lv in LEVELS:
        sd = np.concatenate([t[lv]["dp_sd"] for t in runs.values()])
        out[lv] = {}
        for stage in STAGES:
            e = np.concatenate([t[lv][stage] for t in runs.values()])
            e = e[~np.isnan(e)]
            if e.size == 0:
                continue
            out[lv][stage] = {"nodes": int(e.size), "mean": float(e.mean()),
                              "se": float(e.std(ddof=1) / np.sqrt(e.size)) if e.size > 1 else float("nan"),
                              "rms": float(np.sqrt(np.mean(e**2))), "dp_sd": float(np.sqrt(np.mean(sd**2)))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", help="release names (work/<name>, releases/<name>)")
    ap.add_argument("--json", type=Path, default=None, help="write the pooled summary here")
    args = ap.parse_args()
    runs = {n: trace(n) for n in args.names}
    for lv in LEVELS:
        print(f"{lv}: released − confidential households")
        for stage in STAGES:
            cells, means = [], []
            for n, t in runs.items():
                e = t[lv][stage]
                if np.all(np.isnan(e)):
                    continue
                se = e.std(ddof=1) / np.sqrt(e.size) if e.size > 1 else float("nan")
                cells.append(f"{n} {e.mean():+8.2f} ±{se:6.2f} rms {np.sqrt(np.mean(e**2)):7.2f}")
                means.append(e.mean())
            if cells:
                print(f"  {stage:10s} " + " | ".join(cells) + f" | mean over runs {np.mean(means):+8.2f}")
    summary = pooled(runs)
    print(f"pooled over {len(runs)} releases: mean ± s.e. over the nodes, RMS, DP s.d. of one node's count")
    for lv, stages in summary.items():
        for stage, r in stages.items():
            print(f"  {lv:6s} {stage:10s} n {r['nodes']:4d}  mean {r['mean']:+8.2f} ± {r['se']:6.2f}  "
                  f"rms {r['rms']:7.2f}  dp s.d. {r['dp_sd']:7.2f}  mean/dp s.d. {r['mean'] / r['dp_sd']:+.3f}")
    if args.json:
        args.json.write_text(json.dumps({"releases": list(runs), "pooled": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
