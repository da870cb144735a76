"""Calibration of the release's 90 % intervals (internal: it reads the
confidential inputs, so its output is benchmark/QA material, never a release).

For a finished release of a config, per level (nation, state, PUMA), the share of confidential
answers inside the 90 % intervals (target 85–95 %) of:

- ``measured``: the noisy measurement of a marginal the run measured at a node (household-level
  partition workloads at the state and PUMA nodes, household-size histograms at every node), as
  ``dprelease query`` attaches it (``tasks.release_query.query_release``, the code a data user
  runs), with the share of the released synthetic counts inside the same interval;
- ``count_of_counts``: the released household-size histograms, interval from the parametric
  bootstrap of the count-of-counts estimator (``intervals.parquet``, ``table = count_of_counts``);
- ``marginal``: the released (synthetic) answers of every workload the synthesis measured at a
  state or PUMA node, interval from the MAP update's error (empirical-Bayes prior error)
  (``intervals.parquet``, ``table = marginal``), split into the size histogram the fit took in
  (``group:NP|``), the other household-level partitions (``group:…|``), the household-level
  "contains" workloads (``group:…|…``) and the person-level ones (``person:…``).

    python benchmarks/interval_calibration.py --config deploy/releases/acs2018_default.yaml --release releases/acs2018-default

Repeat ``--config``/``--release`` to pool several releases: the 12 states, each private once,
are the default release (6 private, 6 public) and the same config with the roles swapped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.data import HierarchicalData  # noqa: E402
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


def measured_coverage(release: Path, private: HierarchicalData) -> dict[str, list[int]]:
    """{level: [cells, truth inside, synthetic inside]} of the measured marginals' intervals."""
    d = private.domain
    m = pq.read_table(release / "measurements.parquet", columns=["workload_id", "node", "level"]).to_pandas()
    m = m[(m.workload_id == "size_histogram") | (m.workload_id.str.startswith("group:") & m.workload_id.str.endswith("|"))]
    stats: dict[str, list[int]] = {}
    for wid, node, level in m.drop_duplicates(["workload_id", "node"])[["workload_id", "node", "level"]].itertuples(index=False):
        margin = [d.size_attribute] if wid == "size_histogram" else wid[len("group:"):-1].split(",")
        where = {} if node == "nation" else dict(p.split("=") for p in node.split("/"))
        t = query_release(release, margin, "group", where)
        if "measured_lower_90" not in t.columns:
            continue
        truth = answer(node_data(private, node), Workload("group", tuple(margin), ())).reshape(-1)[: len(t)]
        lo, hi, count = t.measured_lower_90.to_numpy(), t.measured_upper_90.to_numpy(), t["count"].to_numpy()
        s = stats.setdefault(level, [0, 0, 0])
        s[0] += truth.size
        s[1] += int(((lo <= truth) & (truth <= hi)).sum())
        s[2] += int(((lo <= count) & (count <= hi)).sum())
    return stats


def kind(table: str, marginal: str) -> str:
    if table == "count_of_counts":
        return "count_of_counts (bootstrap)"
    if marginal == "group:NP|":
        return "marginal: size histogram"
    if marginal.startswith("group:") and marginal.endswith("|"):
        return "marginal: group partitions"
    return "marginal: contains (group)" if marginal.startswith("group:") else "marginal: person"


def interval_coverage(release: Path, private: HierarchicalData) -> pd.DataFrame:
    """One row per (kind, level): cells, truth inside, mean se, mean |released − truth|."""
    iv = pq.read_table(release / "intervals.parquet").to_pandas()
    size = Workload("group", (private.domain.size_attribute,), ())
    truth = np.empty(len(iv))
    for (node, marginal), idx in iv.groupby(["node", "marginal"], sort=False).indices.items():
        w = size if marginal == "size_histogram" else Workload.from_id(marginal)
        truth[idx] = np.asarray(answer(node_data(private, node), w), dtype=np.float64).reshape(-1)[iv.cell.to_numpy()[idx]]
    iv["inside"] = (iv.lo90 <= truth) & (truth <= iv.hi90)
    iv["abs_error"] = np.abs(iv.released - truth)
    iv["kind"] = [kind(t, m) for t, m in zip(iv.table, iv.marginal)]
    return (iv.groupby(["kind", "level"]).agg(cells=("inside", "size"), inside=("inside", "mean"), mean_se=("se", "mean"),
                                             mean_abs_error=("abs_error", "mean")).reset_index())


LEVEL_ORDER = {"nation": 0, "state": 1, "puma": 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, action="append", help="a release config (repeat, with one --release each)")
    ap.add_argument("--release", required=True, action="append", help="the finished release directory of that config")
    ap.add_argument("--out", default=str(OUT / "interval_calibration.txt"))
    args = ap.parse_args(argv)
    if len(args.config) != len(args.release):
        ap.error("give one --release per --config")
    t0 = time.time()
    measured: dict[str, list[int]] = {}
    covs, n_households = [], 0
    for config, release in zip(args.config, args.release):
        cfg = load_config(config)
        private = HierarchicalData.concat([load_input(cfg, spec, "private")[0] for spec in cfg.private])
        n_households += private.n_households
        for level, counts in measured_coverage(Path(release), private).items():
            measured[level] = [a + b for a, b in zip(measured.get(level, [0, 0, 0]), counts)]
        covs.append(interval_coverage(Path(release), private))
    cov = pd.concat(covs)
    cov["inside_n"] = cov.inside * cov.cells
    cov["se_n"], cov["err_n"] = cov.mean_se * cov.cells, cov.mean_abs_error * cov.cells
    cov = cov.groupby(["kind", "level"]).sum(numeric_only=True).reset_index()
    cov["inside"], cov["mean_se"], cov["mean_abs_error"] = cov.inside_n / cov.cells, cov.se_n / cov.cells, cov.err_n / cov.cells
    cov = cov.sort_values(["kind", "level"], key=lambda c: c.map(LEVEL_ORDER) if c.name == "level" else c)
    runs = "; ".join(f"{c} -> {Path(r).name}" for c, r in zip(args.config, args.release))
    lines = [f"Interval calibration: {runs}; {n_households} confidential households; {time.time() - t0:.0f} s.",
             "Share of confidential answers inside the 90 % intervals (target 85-95 %), per level, pooled over the releases.",
             "",
             "Measured marginals (dprelease query's 'measured' columns): the noisy measurement +- 1.645 sd;",
             "'synthetic inside': share of the released synthetic counts inside the same interval.",
             f"  {'level':<8}{'cells':>8}{'truth inside':>15}{'synthetic inside':>19}"]
    for level in ("nation", "state", "puma"):
        if level in measured:
            n, a, b = measured[level]
            lines.append(f"  {level:<8}{n:>8}{a / n:>15.3f}{b / n:>19.3f}")
    lines += ["",
              "Released answers (intervals.parquet, dprelease query's count_* columns): count-of-counts by parametric bootstrap,",
              "synthetic marginals of the measured workloads by the MAP update's error (empirical-Bayes prior error).",
              f"  {'kind':<30}{'level':<8}{'cells':>8}{'truth inside':>15}{'mean se':>10}{'mean |error|':>14}"]
    for r in cov.itertuples(index=False):
        lines.append(f"  {r.kind:<30}{r.level:<8}{int(r.cells):>8}{r.inside:>15.3f}{r.mean_se:>10.2f}{r.mean_abs_error:>14.2f}")
    per_level = cov.groupby("level")[["cells", "inside_n"]].sum()
    lines += ["", "Every released interval of a level together (all kinds above):",
              f"  {'level':<8}{'cells':>8}{'truth inside':>15}"]
    for level in ("nation", "state", "puma"):
        if level in per_level.index:
            n, a = per_level.loc[level]
            lines.append(f"  {level:<8}{int(n):>8}{a / n:>15.3f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    keep = ["kind", "level", "cells", "inside", "mean_se", "mean_abs_error"]
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"configs": args.config, "releases": args.release, "measured": measured, "released": cov[keep].to_dict(orient="records")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
