"""The release report: ``report.html``, one self-contained page a statistician opens from the
release directory.

It is made from released material only — the households and persons tables, the count-of-counts
table, ``intervals.parquet``, ``domain.json``, the release gate's result and the manifest's public
fields — so it is public, and ``write_release`` writes it before hashing so the manifest covers
it. Nothing is fetched when it is opened: the style sheet and the drawing script are inline, and
the per-node tables travel as compact JSON that the script draws as SVG bar charts, so a national
release (thousands of PUMAs) stays a few megabytes.

What it draws per node (nation, each state, each PUMA): the household-size histogram, the one-way
marginal of every attribute and every two-way marginal the synthesis measured at that level, as
released counts of the synthetic microdata; a count carries a 90 % error bar where
``intervals.parquet`` holds an estimate for exactly that count (the plain, not normalised,
workload at that node), and says it has none otherwise.
"""

from __future__ import annotations

import html
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.data import Attribute, Domain
from engine.queries import Workload
from tasks.release_query import interval_ids

__all__ = ["REPORT", "Marginal", "combined_tables", "node_tables", "render_report", "report_data", "report_marginals", "report_tables"]

REPORT = "report.html"
STATIC = Path(__file__).with_name("release_report_static")


@dataclass(frozen=True)
class Marginal:
    """A count table of the released microdata: households or persons by ``attrs``."""

    level: str  # "group" (households) or "person" (persons, their household's attributes joined)
    attrs: tuple[str, ...]


def _measured_marginals(workload_ids: list[str], domain: Domain) -> list[Marginal]:
    """The count tables of the measured workloads with at most two attributes: a group workload
    without person attributes counts households, a person workload persons (a group workload over
    person attributes counts something else and is left out)."""
    out = []
    for wid in workload_ids:
        if not wid.startswith(("group:", "person:")):
            continue
        w = Workload.from_id(wid)
        attrs = w.group_attrs + w.person_attrs
        if len(attrs) > 2 or (w.level == "group" and w.person_attrs):
            continue
        out.append(Marginal(w.level, attrs))
    return out


def report_marginals(domain: Domain, workload_ids: list[str]) -> list[Marginal]:
    """The size histogram, every attribute's one-way marginal (households for a household
    attribute, persons for a person attribute), then the measured two-way marginals, each once."""
    one_way = [Marginal("group", (domain.size_attribute,))]
    one_way += [Marginal("group", (a.name,)) for a in domain.group if a.name != domain.size_attribute]
    one_way += [Marginal("person", (a.name,)) for a in domain.person]
    two_way = [m for m in _measured_marginals(workload_ids, domain) if len(m.attrs) == 2]
    seen, out = set(), []
    for m in one_way + two_way:
        canon = (m.level, frozenset(m.attrs))
        if canon not in seen:
            seen.add(canon)
            out.append(m)
    return out


def _codes(table: pa.Table, attr: Attribute) -> np.ndarray:
    """Each row's index into the attribute's release codes."""
    idx = pc.index_in(table.column(attr.name).cast(pa.string()), value_set=pa.array(attr.codes))
    if idx.null_count:
        raise ValueError(f"column {attr.name} holds a code outside the domain's {list(attr.codes)}")
    return idx.to_numpy(zero_copy_only=False).astype(np.int64)


def _nodes(households: pa.Table) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """(state keys, PUMA keys, each household's state index, each household's PUMA index)."""
    st = households.column("ST").cast(pa.string()).to_numpy(zero_copy_only=False).astype(str)
    puma = households.column("PUMA").cast(pa.string()).to_numpy(zero_copy_only=False).astype(str)
    states, st_idx = np.unique(st, return_inverse=True)
    pumas, puma_idx = np.unique(np.char.add(np.char.add(st, "/PUMA="), puma), return_inverse=True)
    return [f"ST={s}" for s in states], [f"ST={p}" for p in pumas], st_idx, puma_idx


def _attribute(domain: Domain, name: str) -> Attribute:
    return domain.group_attribute(name) if name in {a.name for a in domain.group} else domain.person_attribute(name)


def node_tables(domain: Domain, households: pa.Table, persons: pa.Table, marginals: dict[str, list[Marginal]]) -> dict[str, dict]:
    """Per level ("nation", "state", "puma"): its node keys, each node's households and persons,
    and the counts of each of that level's ``marginals`` per node ((nodes, cells), cells in C order
    over the attributes)."""
    states, pumas, st_idx, puma_idx = _nodes(households)
    person_hh = pc.index_in(persons.column("SERIALNO"), value_set=households.column("SERIALNO"))
    if person_hh.null_count:
        raise ValueError("persons: a SERIALNO with no household")
    person_of = person_hh.to_numpy(zero_copy_only=False).astype(np.int64)
    group_names = {a.name for a in domain.group}
    code_cache: dict[tuple[str, str], np.ndarray] = {}

    def codes(level: str, name: str) -> np.ndarray:
        if (level, name) not in code_cache:
            if name in group_names:
                c = _codes(households, domain.group_attribute(name))
                code_cache[(level, name)] = c if level == "group" else c[person_of]
            else:
                code_cache[(level, name)] = _codes(persons, domain.person_attribute(name))
        return code_cache[(level, name)]

    levels = {"nation": (["nation"], np.zeros(households.num_rows, np.int64)), "state": (states, st_idx), "puma": (pumas, puma_idx)}
    out = {}
    for level, (keys, hh_node) in levels.items():
        n = len(keys)
        row_node = {"group": hh_node, "person": hh_node[person_of]}
        tables = []
        for m in marginals[level]:
            shape = tuple(_attribute(domain, a).size for a in m.attrs)
            cell = np.ravel_multi_index(tuple(codes(m.level, a) for a in m.attrs), shape)
            size = int(np.prod(shape))
            tables.append(np.bincount(row_node[m.level] * size + cell, minlength=n * size).reshape(n, size))
        out[level] = {"keys": keys, "households": np.bincount(hh_node, minlength=n), "persons": np.bincount(row_node["person"], minlength=n),
                      "tables": tables}
    return out


def _cell_index(domain: Domain, m: Marginal) -> dict[str, int]:
    """Every way ``intervals.parquet`` may write a cell of ``m`` ("A=x; B=y", the attributes in any
    order) -> the cell's C-order index over ``m.attrs``."""
    attrs = [_attribute(domain, a) for a in m.attrs]
    out = {}
    for c, cell in enumerate(itertools.product(*[a.codes for a in attrs])):
        named = dict(zip(m.attrs, cell))
        for order in itertools.permutations(m.attrs):
            out["; ".join(f"{a}={named[a]}" for a in order)] = c
    return out


def _interval_lookup(intervals: pa.Table | None, domain: Domain, marginals: list[Marginal]) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """(marginal index, node) -> {"cell": C-order cell index, "lo", "hi"} from ``intervals.parquet``:
    the rows of exactly that count (``tasks.release_query.interval_ids``); where a node has two
    sources of the size histogram, the synthesis fit's, as ``dprelease query`` shows."""
    if intervals is None or intervals.num_rows == 0:
        return {}
    t = intervals.select(["node", "marginal", "cell_codes", "lo90", "hi90"]).to_pandas()
    out: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for i, m in enumerate(marginals):
        rows = t[t.marginal.isin(interval_ids(list(m.attrs), m.level, domain))]
        fitted = set(rows.node[rows.marginal != "size_histogram"])
        rows = rows[(rows.marginal != "size_histogram") | ~rows.node.isin(fitted)]
        cell = rows.cell_codes.map(_cell_index(domain, m)).to_numpy()
        lo, hi = rows.lo90.to_numpy(), rows.hi90.to_numpy()
        for node, idx in rows.groupby("node", sort=False).indices.items():
            out[(i, str(node))] = {"cell": cell[idx].astype(np.int64), "lo": lo[idx], "hi": hi[idx]}
    return out


def _cell_bounds(iv: dict[str, np.ndarray] | None, size: int) -> tuple[list[float | None] | None, list[float | None] | None]:
    """(lo, hi) per cell in C order, rounded to 0.1 (None for a cell without a row), or (None, None)."""
    if iv is None:
        return None, None
    out = []
    for bound in ("lo", "hi"):
        x = np.full(size, np.nan)
        x[iv["cell"]] = iv[bound]
        out.append([None if np.isnan(v) else round(float(v), 1) for v in x])
    return out[0], out[1]


def _by_level(domain: Domain, workload: dict) -> dict[str, list[Marginal]]:
    """The report's marginals per level (the nation's are the states')."""
    return {lv: report_marginals(domain, list(workload.get(src) or [])) for lv, src in (("nation", "state"), ("state", "state"), ("puma", "puma"))}


def report_tables(domain_dict: dict, workload: dict, households: pa.Table, persons: pa.Table) -> dict[str, dict]:
    """:func:`node_tables` of the report's marginals over a part of the release that holds whole
    states (:func:`combined_tables` joins the parts)."""
    domain = Domain.from_dict(domain_dict)
    return node_tables(domain, households, persons, _by_level(domain, workload))


def combined_tables(parts: list[dict[str, dict]]) -> dict[str, dict]:
    """The node tables of a release from those of its parts (disjoint sets of whole states): the
    nation's counts summed, the states' and PUMAs' rows joined in key order."""
    out = dict(parts[0])
    if len(parts) == 1:
        return out
    nation = [p["nation"] for p in parts]
    out["nation"] = {"keys": nation[0]["keys"], "households": sum(t["households"] for t in nation), "persons": sum(t["persons"] for t in nation),
                     "tables": [sum(ts) for ts in zip(*(t["tables"] for t in nation))]}
    for level in ("state", "puma"):
        ts = [p[level] for p in parts]
        keys = [k for t in ts for k in t["keys"]]
        order = np.argsort(np.asarray(keys, dtype=object), kind="stable") if keys else np.zeros(0, np.int64)
        out[level] = {"keys": [keys[i] for i in order],
                      **{k: np.concatenate([t[k] for t in ts])[order] for k in ("households", "persons")},
                      "tables": [np.concatenate(m, axis=0)[order] for m in zip(*(t["tables"] for t in ts))]}
    return out


def report_data(domain_dict: dict, tables: dict[str, dict], intervals: pa.Table | None, workload: dict) -> dict:
    """The JSON the page's script draws, per level (nation, state, puma): its marginals (the
    nation's are the states', :func:`report_marginals` of that level's measured workloads) with
    their attributes' labels, and per node its households, persons, counts (``tables``:
    :func:`report_tables`, :func:`combined_tables`) and — where published — 90 % intervals."""
    domain = Domain.from_dict(domain_dict)
    by_level = _by_level(domain, workload)
    described = {a["name"]: a.get("description") for a in [*domain_dict["group"], *domain_dict["person"]]}
    levels = {}
    for level, t in tables.items():
        marginals = by_level[level]
        ivs = _interval_lookup(intervals, domain, marginals)
        spec = [{"unit": "households" if m.level == "group" else "persons",
                 "attrs": [{"name": a, "description": described.get(a), "labels": list(_attribute(domain, a).labels)} for a in m.attrs]}
                for m in marginals]
        nodes = {}
        for j, key in enumerate(t["keys"]):
            counts = [t["tables"][i][j] for i in range(len(marginals))]
            bounds = [_cell_bounds(ivs.get((i, key)), c.size) for i, c in enumerate(counts)]
            nodes[key] = {"households": int(t["households"][j]), "persons": int(t["persons"][j]), "counts": [c.tolist() for c in counts],
                          "lo": [b[0] for b in bounds], "hi": [b[1] for b in bounds]}
        levels[level] = {"marginals": spec, "nodes": nodes}
    return {"levels": levels}


# -- the static part of the page ---------------------------------------------------------------
def _e(x) -> str:
    return html.escape(str(x))


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:.4g}"


def _table(header: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _privacy(manifest: dict) -> str:
    priv = manifest.get("privacy") or {}
    ed = priv.get("epsilon_delta") or {}
    inv = manifest.get("invariants") or {}
    public = [i["file"] for i in manifest.get("inputs", []) if i.get("role") == "public"]
    unit = manifest.get("privacy_unit")
    items = []
    if ed:
        how = f" ({_e(ed['conversion'])} conversion from ρ-zCDP)" if ed.get("conversion") else ""
        items.append(f"The release satisfies (ε, δ)-differential privacy with <b>ε = {ed['epsilon']:.4g}</b> and <b>δ = {ed['delta']:g}</b>{how}.")
    if "rho" in priv:
        how = f" ({_e(priv['accounting'])})" if priv.get("accounting") else ""
        items.append(f"Privacy accounting is in zero-concentrated differential privacy: ρ = {_rho(priv['rho']):.4g} in total{how}.")
    if unit:
        items.append(f"The privacy unit is the <b>{_e(unit)}</b>: the guarantee covers adding, removing or changing one "
                     f"{_e(unit)} of the confidential survey file with everything recorded about it.")
    if public:
        items.append(f"Public inputs (not protected, used as the prior): {_e(', '.join(public))}.")
    if inv:
        declared = inv.get("declared") or []
        items.append("Declared invariants (released exactly, outside the guarantee): "
                     + (_e(", ".join(declared)) if declared else "none") + ". "
                     + " ".join(_e(_sentence(inv[k])) + "." for k in ("statement", "public_structure") if inv.get(k)))
    if not items:
        items.append("The manifest of this release holds no privacy statement.")
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _rho(value) -> float:
    from fractions import Fraction

    return float(Fraction(str(value)))


def _method(manifest: dict) -> str:
    syn = manifest.get("synthesizer") or {}
    coc = manifest.get("count_of_counts")
    ivs = manifest.get("intervals")
    parts = []
    if syn:
        parts.append(f"Synthesizer <b>{_e(syn.get('name', ''))}</b>: {_e(syn.get('description', ''))}.")
    if manifest.get("measurements"):
        parts.append("Every statistic of the confidential file that the synthesis uses was measured with calibrated noise "
                     "(each noisy measurement is published in measurements.parquet); the synthetic households were then sampled from "
                     "distributions fitted to those measurements and to the public prior. Everything after the measurements is "
                     "post-processing, so it costs no privacy.")
    if coc:
        parts.append(f"Household counts and size histograms per node: {_e(coc.get('method', ''))}.")
    if ivs:
        parts.append(f"Error bars: {_e(ivs.get('table_semantics', ''))}. They show the 90 % interval of the released count as an "
                     "estimate of the confidential count; a count without a bar has no published estimate.")
    return "".join(f"<p>{p}</p>" for p in parts)


def _validation(gate: dict | None) -> str:
    if gate is None:
        return "<p>This release carries no release-gate result.</p>"
    rows = []
    for table, c in sorted(gate.get("checkpoints", {}).items()):
        for vr in c.get("validation_results", []):
            for r in vr.get("results", []):
                cfg = r.get("expectation_config", {})
                kw = cfg.get("kwargs", {})
                cols = kw.get("column") or ", ".join(x for x in (kw.get("column_A"), kw.get("column_B")) if x) or ", ".join(kw.get("column_list", []) or [])
                rows.append([table, cfg.get("type", ""), cols, cfg.get("description") or "", "passed" if r.get("success") else "FAILED"])
    verdict = "passed" if gate.get("success") else "FAILED"
    return (f"<p>Before publishing, the release tables were checked by Great Expectations {_e(gate.get('great_expectations_version', ''))} "
            f"(result in validation/gx_release.json): <b>{verdict}</b>, {len(rows)} expectations.</p>"
            "<details><summary>Every expectation</summary>" + _table(["table", "expectation", "column(s)", "what it checks", "result"], rows, "gx")
            + "</details>")


def _variables(domain_dict: dict) -> str:
    """Every variable with its codes and labels, and its description where domain.json has one."""
    attrs = [(a, unit) for kind, unit in (("group", "household"), ("person", "person")) for a in domain_dict[kind]]
    described = any(a.get("description") for a, _ in attrs)
    rows = []
    for a, unit in attrs:
        pairs = "; ".join(f"{c} = {lab}" if c != lab else c for c, lab in zip(a["codes"], a["labels"]))
        rows.append([a["name"], unit, *([a.get("description") or ""] if described else []), pairs])
    return _table(["variable", "record", *(["description"] if described else []), "codes"], rows, "vars")


def _query(domain: Domain, data: dict) -> str:
    """Commands and code run from the release directory (the page does not know where it was moved
    to, nor, so that a replay writes the same bytes, the release's name), with this release's first PUMA."""
    st, puma = (part.split("=", 1)[1] for part in next(iter(data["levels"]["puma"]["nodes"]), "ST=01/PUMA=00100").split("/"))
    person = [a.name for a in domain.person][:2]
    lines = [f"dprelease query . --margin {domain.size_attribute} --level group --where ST={st}",
             f"dprelease query . --margin {','.join(person)} --level person --where ST={st} --where PUMA={puma} --format csv"]
    py = (
        "import pyarrow as pa, pyarrow.dataset as ds\n"
        'part = ds.partitioning(pa.schema([("ST", pa.string()), ("PUMA", pa.string())]), flavor="hive")\n'
        'households = ds.dataset("households", format="parquet", partitioning=part).to_table().to_pandas()\n'
        'persons = ds.dataset("persons", format="parquet", partitioning=part).to_table().to_pandas()\n'
        'persons = persons.merge(households, on=["ST", "PUMA", "SERIALNO"])  # each person with their household\n'
        f'print(households.groupby(["ST", "{domain.size_attribute}"]).size())'
    )
    return ("<p>From the command line, in the release directory (a count with its published 90 % interval where one exists):</p><pre>"
            + _e("\n".join(lines)) + "</pre>"
            "<p>With pandas, in the release directory (ST and PUMA are codes: read them as strings so that leading zeros stay):</p><pre>"
            + _e(py) + "</pre>")


def _released(manifest: dict, data: dict) -> str:
    lv = {level: v["nodes"] for level, v in data["levels"].items()}
    nation = lv["nation"]["nation"]
    rows = [["nation", 1, _fmt(nation["households"]), _fmt(nation["persons"])],
            ["state", len(lv["state"]), "", ""], ["PUMA", len(lv["puma"]), "", ""]]
    per_state = [[k.removeprefix("ST="), sum(1 for p in lv["puma"] if p.startswith(k + "/")), _fmt(v["households"]), _fmt(v["persons"])]
                 for k, v in lv["state"].items()]
    return (_table(["level", "nodes", "synthetic households", "synthetic persons"], rows)
            + "<p>The totals are counts of the synthetic sample; no interval is published for them (see the size histograms "
              "below for the per-size intervals).</p>"
            + _table(["state (ST)", "PUMAs", "synthetic households", "synthetic persons"], per_state, "states")
            + _table(["file", "what it holds"], [[f, what] for f, what in FILES if _ships(f, manifest)], "files"))


FILES = [
    ("households/ST=…/PUMA=…/", "the synthetic households, one Parquet partition per PUMA"),
    ("persons/ST=…/PUMA=…/", "the synthetic persons, joined to their household by SERIALNO"),
    ("domain.json", "every variable's codes and labels"),
    ("count_of_counts.parquet", "the household-size histogram of every node (nation, state, PUMA)"),
    ("measurements.parquet", "every noisy measurement the run made, with its noise scale"),
    ("intervals.parquet", "the 90 % intervals of the released counts shown in this report"),
    ("validation/gx_release.json", "the result of the checks run before publishing"),
    ("manifest.json", "configuration, privacy accounting, inputs, code versions and the SHA-256 of every file"),
    ("audit.jsonl", "the run's hash-chained audit log (checked by dprelease audit verify)"),
    ("report.html", "this page"),
]


def _ships(name: str, manifest: dict) -> bool:
    """Whether a file of :data:`FILES` is part of this release, by the manifest's entries."""
    optional = {"count_of_counts.parquet": "count_of_counts", "measurements.parquet": "measurements", "intervals.parquet": "intervals",
                "validation/gx_release.json": "validation"}
    return name not in optional or bool(manifest.get(optional[name]))


def render_report(manifest: dict, domain_dict: dict, tables: dict[str, dict], intervals: pa.Table | None, gate: dict | None) -> str:
    """The page: public manifest fields, the domain, the release tables and their intervals only —
    not the release's name nor the config's paths, which a replay of the same measurements under
    another name changes (the page is then byte-identical, like every other release file)."""
    data = report_data(domain_dict, tables, intervals, manifest.get("workload") or {})
    domain = Domain.from_dict(domain_dict)
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    sections = [
        ("sample", "Read this first",
         "<p class=\"warn\">The microdata are a <b>synthetic sample of households</b>, drawn to resemble the survey's "
         "households; they are <b>unweighted</b>. A count of synthetic records is not an estimate of the population: it is on "
         "the scale of the survey sample, not of the people living in an area.</p>"
         + (f"<p>{_e(manifest['description'])}</p>" if manifest.get("description") else "")),
        ("released", "What was released", _released(manifest, data)),
        ("privacy", "Privacy guarantee", _privacy(manifest)),
        ("states", "Distributions: nation and states",
         "<p>Bars: released counts of the synthetic microdata. Black whiskers: the published 90 % interval of that count as an "
         "estimate of the confidential count, where the release has one. The PUMAs follow in the next section.</p>"
         '<div class="pick"><label>Nation or state <select id="state-select"></select></label></div><div id="state-view"></div>'),
        ("pumas", "Distributions: PUMAs",
         '<div class="pick"><label>PUMA <select id="puma-select"></select></label></div><div id="puma-view"></div>'),
        ("method", "How the tables were made", _method(manifest)),
        ("query", "How to query the release", _query(domain, data)),
        ("validation", "Checks before publishing", _validation(gate)),
        ("variables", "Variables", _variables(domain_dict)),
    ]
    nav = " · ".join(f'<a href="#{k}">{_e(t)}</a>' for k, t, _ in sections)
    body = "".join(f'<section id="{k}"><h2>{_e(t)}</h2>{c}</section>' for k, t, c in sections)
    css = (STATIC / "report.css").read_text()
    js = (STATIC / "report.js").read_text()
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Release report</title>'
            f"<style>{css}</style></head><body><header><h1>Release report</h1><nav>{nav}</nav></header>{body}"
            f'<script type="application/json" id="report-data">{blob}</script><script>{js}</script></body></html>\n')

