"""The internal QA report: accuracy against the confidential data, never published.

Written to ``work/<name>/qa/`` (owner-only): ``report.html`` and ``report.md`` with PNG plots and
``metrics.json``. Contents: hierarchical 3-way query error (group and person level) per geography
level and the NIST 2-way L1 per PUMA, for the release and its baselines; the household-size
distributions (true vs released, per state); count-of-counts EMD per level when that stage ran; the
privacy budget by stage and level; a link to the release gate's Great Expectations Data Docs
(``qa/gx_data_docs/index.html``).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np

from engine.data import HierarchicalData, unique_rows
from engine.queries import k_way_workloads, query_errors_by_level, two_way_l1_by_candidate


def accuracy_table(true: HierarchicalData, candidates: dict[str, HierarchicalData], n_workloads: int = 60, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    wl = {lvl: k_way_workloads(true.domain, 3, lvl, limit=n_workloads, rng=rng) for lvl in ("group", "person")}
    geos = list(true.domain.geography)
    errors = {qlevel: query_errors_by_level(true, candidates, ws, geos) for qlevel, ws in wl.items()}
    l1 = two_way_l1_by_candidate(true, candidates, geos[-1], n_pairs=50, rng=np.random.default_rng(seed))
    rows = []
    for name in candidates:
        for geo in geos:
            for qlevel in wl:
                e = errors[qlevel][name][geo]
                rows.append({"method": name, "geography": geo, "metric": f"{qlevel}-level 3-way max error", "value": e["max_error"]})
                rows.append({"method": name, "geography": geo, "metric": f"{qlevel}-level 3-way mean error", "value": e["mean_error"]})
        rows.append({"method": name, "geography": geos[-1], "metric": "2-way marginal L1 (NIST)", "value": l1[name]["mean_l1"]})
    return rows


def _png(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _plots(qa_dir: Path, true: HierarchicalData, release: HierarchicalData, rows: list[dict], budget: dict, coc_emd: dict | None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    # accuracy by metric
    metrics = sorted({r["metric"] + " @" + r["geography"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(metrics) + 1.5))
    y = np.arange(len(metrics))
    h = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        vals = [next((r["value"] for r in rows if r["method"] == m and r["metric"] + " @" + r["geography"] == k), np.nan) for k in metrics]
        ax.barh(y + i * h, vals, height=h, label=m)
    ax.set_yticks(y + 0.4 - h / 2, metrics)
    ax.set_xlabel("error (lower is better)")
    ax.set_title("Accuracy against the confidential data")
    ax.legend()
    out.append(_png(fig, qa_dir / "accuracy.png"))
    plt.close(fig)
    # household sizes per state
    states = np.unique(true.geo[:, 0])
    M = true.domain.max_size
    cols = min(len(states), 8)  # a grid: 52 states in one row would be a 20,000-pixel strip
    rows_ = -(-len(states) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(3.2 * cols, 2.8 * rows_), squeeze=False)
    hist: dict[str, np.ndarray] = {}
    for data, label in ((true, "confidential"), (release, "release")):  # one pass per dataset, not a mask per state
        st_index = np.searchsorted(states, data.geo[:, 0])
        ok = (st_index < len(states)) & (states[np.minimum(st_index, len(states) - 1)] == data.geo[:, 0])
        flat = st_index[ok] * (M + 1) + np.minimum(data.sizes[ok], M)
        hist[label] = np.bincount(flat, minlength=len(states) * (M + 1)).reshape(len(states), M + 1)
    for i, ax in enumerate(axes.flat):
        if i >= len(states):
            ax.set_visible(False)
            continue
        for label, off in (("confidential", -0.2), ("release", 0.2)):
            ax.bar(np.arange(1, M + 1) + off, hist[label][i, 1:], width=0.4, label=label)
        ax.set_title(f"ST {states[i]:02d}")
        ax.set_xlabel("household size")
    axes[0][0].legend()
    out.append(_png(fig, qa_dir / "household_sizes.png"))
    plt.close(fig)
    # budget
    labels, alloc, spent = [], [], []
    for stage, s in budget["stages"].items():
        for level, lv in s["levels"].items():
            labels.append(f"{stage}\n{level}")
            alloc.append(lv["allocated_per_node_float"])
            spent.append(lv["spent_max_node_float"])
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(labels)), 3))
    x = np.arange(len(labels))
    ax.bar(x - 0.2, alloc, 0.4, label="allocated ρ per node")
    ax.bar(x + 0.2, spent, 0.4, label="spent ρ (max over nodes)")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title(f"Privacy budget (total ρ spent {budget['total']['spent_float']:.4g} of {budget['total']['allocated_float']:.4g})")
    ax.legend()
    out.append(_png(fig, qa_dir / "budget.png"))
    plt.close(fig)
    if coc_emd:
        fig, ax = plt.subplots(figsize=(5, 3))
        lv = list(coc_emd)
        ax.bar(lv, [coc_emd[k] for k in lv])
        ax.set_ylabel("mean EMD per node")
        ax.set_title("Count-of-counts error by level")
        out.append(_png(fig, qa_dir / "count_of_counts_emd.png"))
        plt.close(fig)
    return out


def coc_emd_by_level(table: tuple[list[str], np.ndarray, np.ndarray], true: HierarchicalData) -> dict[str, float]:
    """Mean EMD per node, per level, of a count-of-counts table (node keys, levels, (N, K+1)
    histograms; the released one: ``tasks.count_of_counts.release_histograms``) against the true
    histograms (cumulative L1 when the totals differ)."""
    from engine.count_of_counts import geography_hierarchy, size_histograms
    from engine.data import LEVELS as LEVEL_NAMES
    from engine.data import parse_node_key

    keys, level, released = table
    K = released.shape[1] - 1
    # the table's nodes are the declared geography's, which may hold PUMAs without private households
    h = geography_hierarchy(np.array([parse_node_key(k) for k, lv in zip(keys, level) if lv == 2], dtype=np.int64).reshape(-1, 2))
    exact = size_histograms(h, true.geo, true.sizes, K)
    order = np.array([h.index[k] for k in keys])
    # The release's household counts are DP estimates: with unequal totals the earth mover's
    # distance generalises to the L1 distance of the cumulative counts over sizes 0..K (equal to
    # the EMD of forms.emd_batch when the totals agree), which also charges the households the
    # release has too many or too few.
    e = np.abs(np.cumsum(exact[order] - released, axis=1)).sum(axis=1)
    return {LEVEL_NAMES[lv]: float(e[level == lv].mean()) for lv in np.unique(level)}


def household_count_errors(true: HierarchicalData, release: HierarchicalData) -> dict:
    """Released against confidential household counts per PUMA (the release's are DP estimates
    unless the invariant is declared): share of PUMAs that differ, mean and RMS difference."""
    nodes, exact = unique_rows(true.geo[:, :2], return_counts=True)
    rel_nodes, rel_counts = unique_rows(release.geo[:, :2], return_counts=True)
    released = dict(zip(map(tuple, rel_nodes.tolist()), rel_counts.tolist()))
    diff = np.array([released.get(tuple(n), 0) for n in nodes.tolist()], dtype=np.float64) - exact
    return {"pumas": int(len(nodes)), "share_differing": float(np.mean(diff != 0)), "mean_difference": float(diff.mean()),
            "mean_abs_difference": float(np.abs(diff).mean()), "rms_difference": float(np.sqrt(np.mean(diff ** 2)))}


def write_qa_report(qa_dir: Path, release_name: str, true: HierarchicalData, release: HierarchicalData, baselines: dict[str, HierarchicalData],
                    budget: dict, coc_emd: dict | None = None, docs_link: str | None = None) -> Path:
    """Write the report; ``docs_link`` is the release gate's Data Docs page relative to ``qa_dir``
    (rendered by publish, which may run at the same time)."""
    qa_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    rows = accuracy_table(true, {"release": release, **baselines})
    pngs = _plots(qa_dir, true, release, rows, budget, coc_emd)
    counts = household_count_errors(true, release)
    metrics = {"release": release_name, "accuracy": rows, "count_of_counts_mean_emd": coc_emd, "household_counts": counts, "budget": budget["total"]}
    (qa_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    md = [f"# Internal QA report: {release_name}", "", "**Confidential: computed against the private data. Never publish.**", "", "| method | geography | metric | value |", "|---|---|---|---|"]
    md += [f"| {r['method']} | {r['geography']} | {r['metric']} | {r['value']:.4f} |" for r in rows]
    if coc_emd:
        md += ["", "| count-of-counts level | mean EMD per node |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in coc_emd.items()]
    md += ["", "| PUMA household counts, released − confidential | value |", "|---|---|"] + [f"| {k} | {v:.4g} |" for k, v in counts.items()]
    if docs_link:
        md += ["", f"Release gate (Great Expectations): [Data Docs]({docs_link}) — every expectation on the synthetic tables and its result."]
    md += [""] + [f"![{p.stem}]({p.name})" for p in pngs]
    (qa_dir / "report.md").write_text("\n".join(md) + "\n")
    table = "".join(f"<tr><td>{html.escape(r['method'])}</td><td>{r['geography']}</td><td>{html.escape(r['metric'])}</td><td>{r['value']:.4f}</td></tr>" for r in rows)
    imgs = "".join(f'<h2>{p.stem.replace("_", " ")}</h2><img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">' for p in pngs)
    (qa_dir / "report.html").write_text(
        f"<!doctype html><meta charset='utf-8'><title>QA {html.escape(release_name)}</title>"
        f"<h1>Internal QA report: {html.escape(release_name)}</h1><p><b>Confidential: computed against the private data. Never publish.</b></p>"
        f"<table border=1 cellpadding=4><tr><th>method</th><th>geography</th><th>metric</th><th>value</th></tr>{table}</table>"
        + (f"<p>Release gate (Great Expectations): <a href='{html.escape(docs_link)}'>Data Docs</a> — every expectation on the synthetic tables and its result.</p>" if docs_link else "")
        + imgs
    )
    return qa_dir / "report.html"
