"""The release gate: a Great Expectations suite over the synthetic ``households``, ``persons`` and
``count_of_counts`` tables, run as GX checkpoints before anything is published.

Checked, each as a named GX expectation:
- column set, order and types of every table (the release schemas);
- every attribute code in the domain; NP 1..M; SPORDER 1..M;
- SERIALNO well-formed and unique per household, and the SERIALNO of every person a household's;
- SPORDER unique within a household and ≤ NP, NP equal to the household's person count (so
  SPORDER runs exactly 1..NP);
- exactly one householder per household (when the release keeps the relationship attribute; the
  resident of a one-person group-quarters household, under ``group_quarters:
  single_person_households``, counts as its householder);
- ST and (ST, PUMA) in the configured geography (the public PUMAs of the run's counts result);
- count-of-counts: one row per node and size, nodes in the geography, sizes 1..M, households
  non-negative integers, children summing to their parent at every level, and equal to the
  household sizes of the released microdata.

Cross-table checks are expectations on derived columns computed first (vectorised pandas), named
after what they hold: ``geography_node`` (``ST=xx/PUMA=xxxxx``) on both microdata tables,
``persons_in_household`` and ``householders`` on households,
``household_NP`` on persons, ``children_households`` and ``released_households`` on
count_of_counts. The tables describe synthetic data only, so the result (``SUMMARY`` format) may
show synthetic values; it ships with the release as ``validation/gx_release.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.data import LEVELS, Domain, node_key
from engine.errors import DPReleaseError
from schemas.gx_suites import dumps, expectations, failures
from schemas.release_schema import COUNT_OF_COUNTS_SCHEMA, household_schema, person_schema

GATE = "release"


class ReleaseGateError(DPReleaseError, ValueError):
    """The release gate refused to publish; ``result`` holds the GX result document."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result

    def __reduce__(self):  # pickled with its result (Prefect stores a failed run's exception)
        return type(self), (self.args[0], self.result)


@dataclass(frozen=True)
class ReleaseGeography:
    """The configured geography: the (state, PUMA) codes the release may contain."""

    pumas: tuple[tuple[int, int], ...]

    @classmethod
    def from_node_keys(cls, keys) -> ReleaseGeography:
        from engine.data import parse_node_key

        nodes = [parse_node_key(str(k)) for k in keys]
        return cls(tuple(sorted({(int(n[0]), int(n[1])) for n in nodes if len(n) == 2})))

    @property
    def states(self) -> list[str]:
        return sorted({f"{st:02d}" for st, _ in self.pumas})

    @property
    def puma_keys(self) -> list[str]:
        return [node_key(p) for p in self.pumas]

    @property
    def node_keys(self) -> list[str]:
        states = sorted({(st,) for st, _ in self.pumas})
        return [node_key(())] + [node_key(s) for s in states] + [node_key(p) for p in self.pumas]


@dataclass(frozen=True)
class Householder:
    """The person attribute and release codes that mark the householder (the RELP_GROUP code of
    the Householder group) and a group-quarters resident (who heads a one-person group-quarters
    household)."""

    attribute: str
    code: str
    group_quarters: tuple[str, ...] = ()


def householder_of(spec, domain: Domain) -> Householder | None:
    """The householder marker of a domain spec, if the release keeps the relationship attribute."""
    names = {a.name for a in domain.person}
    for name, a in spec.person_attributes.items():
        if a.source != spec.relationship_column or name not in names:
            continue
        attr = a.attribute(name)
        members = [[int(c)] for c in a.codes] if a.codes is not None else [list(g.codes) for g in a.groups or []]
        if a.bins is not None or len(members) != len(attr.codes):
            continue

        def release_codes(source_codes, *, attr=attr, members=members) -> list[str]:  # this attribute, bound now
            return [code for code, m in zip(attr.codes, members) if any(c in m for c in source_codes)]

        head = release_codes([spec.householder_code])
        if len(head) == 1:
            return Householder(name, head[0], tuple(c for c in release_codes(spec.group_quarters_codes) if c != head[0]))
    return None


# -- derived columns ----------------------------------------------------------------------------
def _node_keys(st: pd.Series, puma: pd.Series) -> dict[str, pd.Series]:
    """Every row's node key per level (:func:`engine.data.node_key`, on the distinct (ST, PUMA)
    pairs). A code that is not a number gets a key no node has, so the checks that use it fail."""

    def key(*codes: str) -> str:
        try:
            return node_key(tuple(int(c) for c in codes))
        except ValueError:
            return "invalid:" + "/".join(codes)

    # each column factorised alone, then the pairs of their integer codes (a MultiIndex of
    # strings would hash millions of tuples at national size)
    st_code, st_values = pd.factorize(st.astype(str))
    puma_code, puma_values = pd.factorize(puma.astype(str))
    n_puma = max(len(puma_values), 1)
    uniq, pair = np.unique(st_code.astype(np.int64) * n_puma + puma_code, return_inverse=True)
    pairs = [(str(st_values[c // n_puma]), str(puma_values[c % n_puma])) for c in uniq]
    keys = {"state": [key(s) for s, _ in pairs], "puma": [key(s, p) for s, p in pairs]}
    return {"nation": pd.Series(node_key(()), index=st.index),
            **{lv: pd.Series(np.asarray(k, dtype=object)[pair] if len(k) else np.zeros(0, object), index=st.index) for lv, k in keys.items()}}


def _has(df: pd.DataFrame, *columns: str) -> bool:
    return all(c in df.columns for c in columns)


def release_frames(households: pa.Table, persons: pa.Table, count_of_counts: pa.Table | None, domain: Domain,
                   householder: Householder | None = None) -> dict[str, pd.DataFrame]:
    """The tables as pandas frames with the derived columns of the cross-table checks. A derived
    column whose source columns are missing is left empty (the column-list expectation names
    what is missing)."""
    hh, pp = households.to_pandas(), persons.to_pandas()
    size = domain.size_attribute
    for df in (hh, pp):
        df["geography_node"] = _node_keys(df["ST"], df["PUMA"])["puma"] if _has(df, "ST", "PUMA") else None
    linked = _has(hh, "SERIALNO", size) and _has(pp, "SERIALNO")
    if linked:  # households and persons joined on SERIALNO by integer codes (a string map is slow at national size)
        codes, uniques = pd.factorize(pd.concat([hh["SERIALNO"], pp["SERIALNO"]], ignore_index=True))
        n_codes = len(uniques) + 1  # a missing SERIALNO (code −1) gets the last code, which no household reads
        hh_code, pp_code = codes[: len(hh)], np.where(codes[len(hh):] < 0, n_codes - 1, codes[len(hh):])

        def per_household(person_mask: np.ndarray | None = None) -> np.ndarray:
            """Persons (matching ``person_mask``) per household row."""
            c = pp_code if person_mask is None else pp_code[person_mask]
            return np.where(hh_code >= 0, np.bincount(c, minlength=n_codes)[hh_code], 0)

        hh["persons_in_household"] = per_household().astype(np.int64)
    else:
        hh["persons_in_household"] = np.nan
    if householder is not None:
        if linked and _has(pp, householder.attribute):
            rel = pp[householder.attribute]
            heads = per_household(np.asarray((rel == householder.code).fillna(False), dtype=bool))
            gq = per_household(np.asarray(rel.isin(householder.group_quarters).fillna(False), dtype=bool))
            gq_heads = np.where(hh["persons_in_household"] == 1, gq, 0)
            hh["householders"] = (heads + gq_heads).astype(np.int64)
        else:
            hh["householders"] = np.nan
    if linked:
        size_of = hh[size].astype(np.int64).to_numpy()
        first = np.full(n_codes, -1, dtype=np.int64)  # each SERIALNO's first household row
        first[hh_code[::-1]] = np.arange(len(hh))[::-1]
        first[-1] = -1
        row = first[pp_code]
        pp["household_NP"] = np.where(row >= 0, size_of[np.maximum(row, 0)], np.nan).astype(np.float64) if len(hh) else np.nan
    else:
        pp["household_NP"] = np.nan
    frames = {"households": hh, "persons": pp}
    if count_of_counts is not None:
        frames["count_of_counts"] = count_of_counts_frame(count_of_counts, released_sizes(hh, domain.size_attribute))
    return frames


def released_sizes(households: pd.DataFrame, size: str) -> pd.Series | None:
    """Households per (node, size) at every level of a households frame (None without its key
    columns): summed over a release's parts, the counts the count-of-counts table must equal."""
    if not _has(households, "ST", "PUMA", size):
        return None
    keys = _node_keys(households["ST"], households["PUMA"])
    return pd.concat([pd.DataFrame({"node": keys[lv], "size": households[size].astype(np.int64)}) for lv in LEVELS]).value_counts()


def count_of_counts_frame(count_of_counts: pa.Table, released: pd.Series | None) -> pd.DataFrame:
    """The count-of-counts table with its derived columns: its children's sum per node and size,
    and ``released`` (:func:`released_sizes`) per node and size."""
    coc = count_of_counts.to_pandas()
    if _has(coc, "level", "node", "size", "households") and released is not None:
        key = pd.MultiIndex.from_arrays([coc["node"].astype(str), coc["size"].astype(np.int64)])
        child = coc[coc["level"] != "nation"]
        parent = np.where(child["level"] == "state", "nation", child["node"].astype(str).str.rsplit("/", n=1).str[0])
        children = child["households"].groupby([parent, child["size"].astype(np.int64).to_numpy()]).sum()
        coc["children_households"] = np.where(coc["level"] == "puma", np.nan, children.reindex(key).fillna(0).to_numpy(np.float64))
        coc["released_households"] = released.reindex(key).fillna(0).astype(np.int64).to_numpy()
    else:
        coc["children_households"] = coc["released_households"] = np.nan
    return coc


# -- the suites ---------------------------------------------------------------------------------
def _columns_and_types(schema: pa.Schema, derived: list[str]) -> list:
    E = expectations()
    out = [E.ExpectTableColumnsToMatchOrderedList(column_list=[f.name for f in schema] + derived,
                                                  description="the release schema's columns, in order (then the gate's derived columns)")]
    for f in schema:
        type_ = "str" if pa.types.is_string(f.type) else str(f.type.to_pandas_dtype().__name__)
        out.append(E.ExpectColumnValuesToBeOfType(column=f.name, type_=type_, description=f"{f.name} is {f.type}"))
    return out


def _geography(geo: ReleaseGeography) -> list:
    E = expectations()
    return [
        E.ExpectColumnValuesToBeInSet(column="ST", value_set=geo.states, description="ST is a state of the configured geography"),
        E.ExpectColumnValuesToMatchRegex(column="PUMA", regex=r"^\d{5}$", description="PUMA is 5 digits"),
        E.ExpectColumnValuesToBeInSet(column="geography_node", value_set=geo.puma_keys,
                                      description="(ST, PUMA) is a PUMA of the configured geography"),
        E.ExpectColumnValuesToMatchRegex(column="SERIALNO", regex=r"^SY\d{14}$", description="SERIALNO is synthetic: SY + ST + PUMA + 7 digits"),
    ]


def _codes(attrs) -> list:
    return [expectations().ExpectColumnValuesToBeInSet(column=a.name, value_set=list(a.codes), description=f"{a.name} is a code of the domain")
            for a in attrs]


def release_expectations(domain: Domain, geography: ReleaseGeography, householder: Householder | None = None,
                         count_of_counts: bool = True) -> dict[str, list]:
    """{table: [GX expectations]} of the release gate."""
    E = expectations()
    M, size = domain.max_size, domain.size_attribute
    hh_derived = ["geography_node", "persons_in_household"] + (["householders"] if householder else [])
    households = _columns_and_types(household_schema(domain), hh_derived) + _geography(geography)
    households += [
        E.ExpectColumnValuesToBeUnique(column="SERIALNO", description="SERIALNO is unique per household"),
        E.ExpectColumnValuesToBeBetween(column=size, min_value=1, max_value=M, description=f"{size} is 1..{M}"),
        E.ExpectColumnPairValuesToBeEqual(column_A=size, column_B="persons_in_household",
                                          description=f"{size} equals the number of persons with the household's SERIALNO"),
    ]
    households += _codes(a for a in domain.group if a.name != size)
    if householder is not None:
        households.append(E.ExpectColumnValuesToBeInSet(column="householders", value_set=[1],
                                                        description=f"exactly one householder ({householder.attribute} = {householder.code}) per household"))
    persons = _columns_and_types(person_schema(domain), ["geography_node", "household_NP"]) + _geography(geography)
    persons += [
        E.ExpectColumnValuesToNotBeNull(column="household_NP", description="every person's SERIALNO is a released household's"),
        E.ExpectColumnValuesToBeBetween(column="SPORDER", min_value=1, max_value=M, description=f"SPORDER is 1..{M}"),
        E.ExpectCompoundColumnsToBeUnique(column_list=["SERIALNO", "SPORDER"], description="SPORDER is unique within its household"),
        E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="household_NP", column_B="SPORDER", or_equal=True, ignore_row_if="either_value_is_missing",
                                                  description=f"SPORDER is at most the household's {size} (with the count check: SPORDER runs 1..{size})"),
    ]
    persons += _codes(domain.person)
    out = {"households": households, "persons": persons}
    if count_of_counts:
        nodes = geography.node_keys
        coc = _columns_and_types(COUNT_OF_COUNTS_SCHEMA, ["children_households", "released_households"])
        coc += [
            E.ExpectTableRowCountToEqual(value=len(nodes) * M, description=f"one row per node of the geography and size 1..{M}"),
            E.ExpectCompoundColumnsToBeUnique(column_list=["node", "size"], description="one row per node and size"),
            E.ExpectColumnValuesToBeInSet(column="level", value_set=list(LEVELS), description="level is nation, state or puma"),
            E.ExpectColumnValuesToBeInSet(column="node", value_set=nodes, description="node is the nation, a state or a PUMA of the configured geography"),
            E.ExpectColumnValuesToBeBetween(column="size", min_value=1, max_value=M, description=f"size is 1..{M}"),
            E.ExpectColumnValuesToBeBetween(column="households", min_value=0, description="households are non-negative (integers: the type check)"),
            E.ExpectColumnPairValuesToBeEqual(column_A="households", column_B="children_households", ignore_row_if="either_value_is_missing",
                                              description="the nation's and every state's counts equal the sum of their children's, size by size"),
            E.ExpectColumnPairValuesToBeEqual(column_A="households", column_B="released_households",
                                              description="the counts equal the household sizes of the released microdata, node by node"),
        ]
        out["count_of_counts"] = coc
    return out


class ReleaseGateRun:
    """The release gate over a release given in parts (one state's households and persons at a
    time, so that no process holds the whole microdata): each part is validated as it comes
    (:meth:`check`, refusing at the first failing part), the count-of-counts table at the end
    against the released sizes summed over the parts, and the parts' results are combined into
    the one result document the whole tables give (:class:`schemas.gx_suites.SuiteRunner`).
    Cross-table checks join a part's persons to its own households: a part holds whole
    households, and a SERIALNO carries its state."""

    def __init__(self, domain: Domain, geography: ReleaseGeography, householder: Householder | None = None,
                 count_of_counts: bool = True, docs_dir: Path | None = None):
        from schemas.gx_suites import SuiteRunner

        self.domain, self.householder, self.docs_dir = domain, householder, docs_dir
        self._runner = SuiteRunner(GATE, release_expectations(domain, geography, householder, count_of_counts), "SUMMARY", docs_dir)
        self._released: list[pd.Series | None] = []

    def check(self, households: pa.Table, persons: pa.Table) -> None:
        """Validate one part's tables; raises :class:`ReleaseGateError` when an expectation fails."""
        frames = release_frames(households, persons, None, self.domain, self.householder)
        if not all([self._runner.validate(table, frames[table])["success"] for table in ("households", "persons")]):
            self._refuse()
        self._released.append(released_sizes(frames["households"], self.domain.size_attribute))

    def finish(self, count_of_counts: pa.Table | None) -> bytes:
        """Validate the count-of-counts table (when the suite has one) and return the canonical
        JSON result of the whole release; raises :class:`ReleaseGateError` when anything failed."""
        if count_of_counts is not None:
            parts = self._released
            released = None if any(p is None for p in parts) else \
                pd.concat(parts).groupby(level=[0, 1]).sum() if parts else pd.Series(dtype=np.int64)
            if not self._runner.validate("count_of_counts", count_of_counts_frame(count_of_counts, released))["success"]:
                self._refuse()
        document = self._runner.document()
        if not document["success"]:
            self._refuse(document)
        return dumps(document)

    def _refuse(self, document: dict | None = None) -> None:
        document = self._runner.document() if document is None else document
        lines = "\n".join(f"  {f}" for f in failures(document))
        docs = f" (Data Docs: {Path(self.docs_dir) / 'index.html'})" if self.docs_dir is not None else ""
        raise ReleaseGateError(f"release gate (Great Expectations) refused to publish{docs}; failed expectations:\n{lines}", document)


def run_release_gate(households: pa.Table, persons: pa.Table, count_of_counts: pa.Table | None, domain: Domain,
                     geography: ReleaseGeography, householder: Householder | None = None, docs_dir: Path | None = None) -> bytes:
    """Validate the whole release tables at once (:class:`ReleaseGateRun` with one part; Data Docs
    into ``docs_dir``). Returns the canonical JSON result to ship; raises :class:`ReleaseGateError`
    naming every failed expectation and its table when any fails."""
    gate = ReleaseGateRun(domain, geography, householder, count_of_counts is not None, docs_dir)
    gate.check(households, persons)
    return gate.finish(count_of_counts)
