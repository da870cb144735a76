"""Marginal queries against a published release alone (``dprelease query``).

Reads only the release directory — the partitioned microdata, ``domain.json`` and
``measurements.parquet`` — never the work directory. The answer is the marginal of the synthetic
microdata (persons, or households at group level), every cell of the domain in domain order
(zeros included), with its share.

Error estimates, two kinds:

- ``count_se``, ``count_lower_90``, ``count_upper_90``: the error of the released answer (the
  ``count`` column) as an estimate of the confidential one, read from the release's
  ``intervals.parquet`` (``tasks.intervals``, ``engine.synthesis``) where it holds this
  marginal at this node: the household-size histogram (``--margin NP --level group``) at every
  node (at a state or PUMA, whose sizes the synthesis fit, that fit's; at the nation the
  parametric bootstrap of the count-of-counts estimator), and every workload the synthesis
  measured at a state or PUMA node (the MAP update's error, engine.synthesis): a
  group-level partition (``group:A,B|``) at ``--level group``, a person workload counting every
  person (``person:A|B``) at ``--level person``.
- ``measured``, ``measured_sd``, ``measured_lower_90``, ``measured_upper_90``: where the run
  measured this very marginal at this very node (a group-level partition workload, or the
  household-size histogram), that noisy measurement — an unbiased estimate of the confidential
  answer whose noise standard deviation is published — merged by inverse variance when several
  stages measured it, and its 90 % interval ± 1.645 sd (Gaussian; the sd of a discrete Gaussian
  is at most its σ).

Other marginals (a sub-marginal of a measured one, a node where it was not measured, a filter
on non-geography columns) carry no error estimate: the published standard errors are per cell,
without the covariances a sum of cells would need, and the synthetic answer's error elsewhere
also holds model error that no published number bounds. The command line says so.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from engine.data import Attribute, Domain
from engine.errors import DPReleaseError
from engine.queries import Workload
from schemas.release_schema import PARTITION_SCHEMA

__all__ = ["QueryError", "Z90", "interval_ids", "node_of", "query_release", "released_nodes"]

Z90 = 1.6448536269514722  # standard normal 95th percentile: a two-sided 90 % interval

Level = Literal["person", "group"]


class QueryError(DPReleaseError, ValueError):
    """A query the release cannot answer (unknown attribute, bad filter, not a release)."""


def _domain(release: Path) -> Domain:
    path = release / "domain.json"
    if not path.exists():
        raise QueryError(f"{release} is not a dprelease release: it has no domain.json")
    return Domain.from_dict(json.loads(path.read_text()))


def node_of(where: dict[str, str], geography: list[str]) -> str | None:
    """The measurement node key a filter selects ("nation", "ST=50", "ST=50/PUMA=00100"), or
    None when the filter is not exactly a geography node (then no measurement matches)."""
    if set(where) - set(geography):
        return None
    parts = []
    for g in geography:
        if g not in where:
            break
        parts.append(f"{g}={where[g]}")
    if len(parts) != len(where):
        return None  # e.g. a PUMA without its state
    return "/".join(parts) if parts else "nation"


def released_nodes(release: Path) -> set[str]:
    """Every node key the release holds ("nation", "ST=50", "ST=50/PUMA=00100"): the nodes of the
    count-of-counts table (a node with no synthetic household is still there) and every partition
    of the household microdata."""
    nodes = {"nation"}
    coc = release / "count_of_counts.parquet"
    if coc.exists():
        nodes.update(str(n) for n in pq.read_table(coc, columns=["node"]).column("node").unique().to_pylist())
    households = release / "households"
    if households.is_dir():
        part = pads.partitioning(PARTITION_SCHEMA, flavor="hive")
        for fragment in pads.dataset(households, format="parquet", partitioning=part).get_fragments():
            keys = pads.get_partition_keys(fragment.partition_expression)
            if "ST" in keys:
                nodes.add(f"ST={keys['ST']}")
                if "PUMA" in keys:
                    nodes.add(f"ST={keys['ST']}/PUMA={keys['PUMA']}")
    return nodes


def _check_geography(release: Path, where: dict[str, str], geography: list[str]) -> None:
    """Refuse a geography filter that names no released node: a finer level without the coarser
    ones (PUMA codes repeat across states), or a node the release does not hold (an unreleased
    state answers all zeros, which reads as a released count of zero)."""
    named = [g for g in geography if g in where]
    for i, g in enumerate(geography):
        if g in where and (missing := [c for c in geography[:i] if c not in where]):
            raise QueryError(f"--where {g}={where[g]} needs {', '.join(f'--where {c}=…' for c in missing)}: "
                             f"{g} codes repeat across {', '.join(missing)}")
    if not named:
        return
    node = "/".join(f"{g}={where[g]}" for g in named)
    nodes = released_nodes(release)
    if node not in nodes:
        parent = node.rsplit("/", 1)[0] if "/" in node else None
        level = named[-1]
        siblings = sorted(n.rsplit("=", 1)[1] for n in nodes
                          if n.count("/") == node.count("/") and n != "nation" and (parent is None or n.startswith(parent + "/")))
        shown = ", ".join(siblings[:20]) + (f", … ({len(siblings)} in all)" if len(siblings) > 20 else "")
        raise QueryError(f"--where {node.replace('/', ' ')}: not a node of this release; its {level} codes"
                         f"{' in ' + parent if parent else ''}: {shown or 'none'}")


def _read(release: Path, what: str, columns: list[str], where: dict[str, str]) -> pd.DataFrame:
    part = pads.partitioning(PARTITION_SCHEMA, flavor="hive")
    ds = pads.dataset(release / what, format="parquet", partitioning=part)
    missing = [c for c in [*columns, *where] if c not in ds.schema.names]
    if missing:
        raise QueryError(f"{what} has no column {', '.join(missing)}; it has {', '.join(ds.schema.names)}")
    flt = None
    for k, v in where.items():
        term = pads.field(k) == pads.scalar(str(v)).cast(ds.schema.field(k).type)
        flt = term if flt is None else flt & term
    return ds.to_table(columns=list(dict.fromkeys(columns)), filter=flt).to_pandas()


def _attributes(domain: Domain, margin: list[str], level: Level) -> list[Attribute]:
    group_names = [a.name for a in domain.group]
    person_names = [a.name for a in domain.person]
    if len(set(margin)) != len(margin):
        raise QueryError("an attribute appears twice in --margin")
    attrs = []
    for name in margin:
        if name in group_names:
            attrs.append(domain.group_attribute(name))
        elif name in person_names and level == "person":
            attrs.append(domain.person_attribute(name))
        elif name in person_names:
            raise QueryError(f"{name} is a person attribute: query it with --level person")
        else:
            raise QueryError(f"unknown attribute {name!r}; group: {', '.join(group_names)}; person: {', '.join(person_names)}")
    return attrs


def _cell_key(parts: Iterable[str]) -> str:
    """One cell's codes in a canonical order ("A=1; B=2"), whatever the workload's attribute order."""
    return "; ".join(sorted(parts))


def _cell_keys(table: pd.DataFrame, margin: list[str]) -> pd.Series:
    """:func:`_cell_key` of every row of ``table``, built column-wise (attributes in name order)."""
    names = sorted(margin)
    key = names[0] + "=" + table[names[0]].astype(str)
    for name in names[1:]:
        key = key + f"; {name}=" + table[name].astype(str)
    return key


def _measured(release: Path, margin: list[str], level: Level, node: str | None, domain: Domain) -> pd.DataFrame | None:
    """The stored noisy measurements of exactly this marginal at this node, merged by inverse
    variance, indexed by canonical cell key: ``measured``, ``measured_sd`` (None when none)."""
    path = release / "measurements.parquet"
    if node is None or level != "group" or not path.exists():
        return None
    m = pq.read_table(path, columns=["workload_id", "node", "cell_codes", "noisy_value", "noise_sd"]).to_pandas()
    ids = {f"group:{','.join(p)}|" for p in itertools.permutations(margin)}
    if margin == [domain.size_attribute]:
        ids.add("size_histogram")
    m = m[(m.node == node) & m.workload_id.isin(ids)]
    if m.empty:
        return None
    w = 1.0 / m.noise_sd.astype(float) ** 2
    key = m.cell_codes.map(lambda c: _cell_key(str(c).split("; ")))
    merged = pd.DataFrame({"key": key, "w": w, "wy": w * m.noisy_value.astype(float)}).groupby("key")[["w", "wy"]].sum()
    return pd.DataFrame({"measured": merged.wy / merged.w, "measured_sd": 1.0 / np.sqrt(merged.w)})


def interval_ids(margin: list[str], level: Level | str, domain: Domain) -> set[str]:
    """The ``intervals.parquet`` marginals whose cells are exactly the count of ``margin`` at
    ``level`` (households at "group", persons at "person"): the plain workloads over those
    attributes in any order, and for the household size also the count-of-counts histogram."""
    group_names = {g.name for g in domain.group}
    g = [a for a in margin if a in group_names]
    p = [a for a in margin if a not in group_names]
    if level == "group":
        ids = {f"group:{','.join(x)}|" for x in itertools.permutations(g)} if not p else set()
        if margin == [domain.size_attribute]:
            ids.add("size_histogram")
        return ids
    return {f"person:{','.join(x)}|{','.join(y)}" for x in itertools.permutations(g) for y in itertools.permutations(p)}


def _released_intervals(release: Path, margin: list[str], level: Level, node: str | None, domain: Domain) -> pd.DataFrame | None:
    """The error estimates of the released answer of exactly this marginal at this node from
    ``intervals.parquet``, indexed by canonical cell key: ``count_se``, ``count_lower_90``,
    ``count_upper_90`` (None when the release holds none)."""
    path = release / "intervals.parquet"
    if node is None or not path.exists():
        return None
    ids = interval_ids(margin, level, domain)
    t = pq.read_table(path, columns=["node", "marginal", "cell_codes", "se", "lo90", "hi90"],
                      filters=[("node", "=", node)]).to_pandas()
    t = t[t.marginal.isin(ids)]
    if t.empty:
        return None
    # one source per cell: a state's or PUMA's size histogram is the synthesis fit's (group:NP|,
    # Laplace), sharper than the count-of-counts bootstrap's (size_histogram), which the nation has
    t = t[t.marginal == min(t.marginal.unique(), key=lambda m: (m == "size_histogram", m))]
    key = t.cell_codes.map(lambda c: _cell_key(str(c).split("; ")))
    return pd.DataFrame({"count_se": t.se.to_numpy(), "count_lower_90": t.lo90.to_numpy(), "count_upper_90": t.hi90.to_numpy()},
                        index=pd.Index(key.to_numpy()))


def _no_interval_reason(release: Path, margin: list[str], level: Level, node: str | None, where: dict[str, str]) -> str:
    """Why the released count of this marginal carries no error estimate, in words."""
    if node is None:
        other = sorted(set(where) - {k for k in where if k in ("ST", "PUMA")})
        return (f"the filter on {', '.join(other)} is not a geography node, and the release's error estimates are per node "
                "(a filtered count sums cells whose covariances are not published)")
    path = release / "intervals.parquet"
    if not path.exists():
        return "this release has no intervals.parquet"
    ids = set(pq.read_table(path, columns=["node", "marginal"], filters=[("node", "=", node)]).column("marginal").unique().to_pylist())
    wanted = set(margin)
    measured = [(wid, Workload.from_id(wid)) for wid in sorted(ids) if ":" in wid]  # size_histogram is no workload

    def attrs(w: Workload) -> set[str]:
        return set(w.group_attrs) | set(w.person_attrs)

    same = [(wid, w) for wid, w in measured if attrs(w) == wanted and w.level == level and (w.first or w.normalised)]
    if same:
        wid, w = same[0]
        what = " and ".join([f"over the first {w.first} persons of each household"] * bool(w.first) + ["normalised per household"] * w.normalised)
        return f"the run measured this marginal at {node} only {what} ({wid}), not as the released count of every record"
    wider = [wid for wid, w in measured if wanted < attrs(w)]
    if wider:
        return (f"it is a sum of cells of the measured {wider[0]} at {node}, and the published standard errors are per cell, "
                "without the covariances a sum needs")
    return (f"the run did not measure this marginal at {node}: the synthetic count's error there includes model error "
            "that no published number bounds")


def query_release(release_dir: str | Path, margin: list[str], level: Level, where: dict[str, str] | None = None) -> pd.DataFrame:
    """The marginal ``margin`` of the release at ``level`` ("person": persons, with their
    household's attributes joined; "group": households) among the records matching ``where``
    ({column: code}, e.g. {"ST": "50", "PUMA": "00100"}). Columns: one code and one label column
    per attribute, ``count``, ``share``, and where the run measured this marginal at this node
    ``measured``, ``measured_sd``, ``measured_lower_90``, ``measured_upper_90``, and where the
    release holds an error estimate of this marginal at this node ``count_se``,
    ``count_lower_90``, ``count_upper_90`` (module docstring); without those, ``attrs["no_interval"]``
    says why there is none. A geography filter must name a node the release holds (a PUMA with its
    state), else :class:`QueryError`."""
    release = Path(release_dir)
    where = {str(k): str(v) for k, v in (where or {}).items()}
    if level not in ("person", "group"):
        raise QueryError("--level must be person or group")
    if not margin:
        raise QueryError("--margin needs at least one attribute")
    domain = _domain(release)
    attrs = _attributes(domain, margin, level)
    geography, group_names = list(domain.geography), {g.name for g in domain.group}
    _check_geography(release, where, geography)
    group_cols = [a.name for a in attrs if a.name in group_names]
    hh_where = {k: v for k, v in where.items() if k in geography or k in group_names}
    if level == "group":
        if set(where) - set(hh_where):
            raise QueryError(f"--where {', '.join(sorted(set(where) - set(hh_where)))}: not a household column")
        rows = _read(release, "households", margin, where)
    else:
        person_cols = [a.name for a in attrs if a.name not in group_names]
        rows = _read(release, "persons", ["SERIALNO", *person_cols], {k: v for k, v in where.items() if k not in group_names})
        household_filters = [k for k in hh_where if k not in geography]
        if group_cols or household_filters:
            hh = _read(release, "households", ["SERIALNO", *group_cols, *household_filters], hh_where)
            rows = rows.merge(hh[["SERIALNO", *group_cols]], on="SERIALNO", how="inner")
    grid = pd.MultiIndex.from_product([list(a.codes) for a in attrs], names=margin)
    counts = rows[margin].astype(str).value_counts().reindex(grid, fill_value=0) if len(rows) else pd.Series(0, index=grid)
    out = counts.rename("count").reset_index()
    for a in attrs:
        out.insert(out.columns.get_loc(a.name) + 1, f"{a.name}_label", out[a.name].map(dict(zip(a.codes, a.labels))))
    out["count"] = out["count"].astype(np.int64)
    total = int(out["count"].sum())
    out["share"] = out["count"] / total if total else 0.0
    node = node_of(where, geography)
    cell = _cell_keys(out, margin)
    released = _released_intervals(release, margin, level, node, domain)
    if released is not None and cell.isin(released.index).all():
        for c in released.columns:
            out[c] = released.loc[cell, c].to_numpy()
    else:
        out.attrs["no_interval"] = _no_interval_reason(release, margin, level, node, where)
    measured = _measured(release, margin, level, node, domain)
    if measured is not None and cell.isin(measured.index).all():  # every cell measured (a K-capped size histogram may not be)
        out["measured"] = measured.loc[cell, "measured"].to_numpy()
        out["measured_sd"] = measured.loc[cell, "measured_sd"].to_numpy()
        out["measured_lower_90"] = out["measured"] - Z90 * out["measured_sd"]
        out["measured_upper_90"] = out["measured"] + Z90 * out["measured_sd"]
    return out
