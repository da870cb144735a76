"""From validated PUMS person files to HierarchicalData, applying the explicit household rules.

Rules (configurable in the release config, reported in the run summary — nothing is dropped
silently):
- ``group_quarters``: ``exclude`` (default) drops group-quarters persons (RELP 16/17) and counts
  them; ``single_person_households`` keeps each GQ person as a one-person household in which the
  person is the "householder".
- ``oversize`` (households above the size cap M): ``clip`` (default) keeps the householder and the
  next M−1 persons by SPORDER and counts the persons removed; ``exclude`` drops the whole household
  and counts households and persons.
- ``householders`` (a housing unit without exactly one householder): ``refuse`` (the household
  unit) makes it an input error; ``exclude`` (the person unit, where removing one person — the
  householder — or adding a second householder must still give a release) drops the whole unit
  and counts units and persons. Every household encoded therefore has its householder first.

What each rule makes of a neighbour (one household, or one person, added or removed) is worked
out in ``docs/privacy.md`` and charged by ``engine.queries.Workload.sensitivity`` and
``engine.privacy._session.size_counts_sensitivity``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine.data import HierarchicalData, clip_sizes, householder_first_order
from schemas.domain_spec import DomainSpec
from schemas.pums_reader import PersonTable, householder_counts, read_person_file


@dataclass(frozen=True)
class HouseholdRules:
    max_household_size: int = 8
    group_quarters: Literal["exclude", "single_person_households"] = "exclude"
    oversize: Literal["clip", "exclude"] = "clip"
    householders: Literal["refuse", "exclude"] = "refuse"


def encode_person_table(t: PersonTable, spec: DomainSpec, rules: HouseholdRules) -> tuple[HierarchicalData, dict]:
    """Apply the rules to one validated table and encode it. Returns (data, exclusion report)."""
    hh = t.cols["_household"]
    relp = t.cols[spec.relationship_column]
    report = {
        "file": t.name,
        "sha256": t.sha256,
        "layout": t.layout,
        "survey_years": None if t.survey_years is None else list(t.survey_years),
        "persons_read": int(len(hh)),
        "units_read": int(t.n_households),
        "group_quarters_persons": int(t.is_gq.sum()),
        "group_quarters_rule": rules.group_quarters,
        "group_quarters_persons_excluded": 0,
        "vacant_units_skipped": int(t.vacant_units),
        "oversize_rule": rules.oversize,
        "oversize_households": 0,
        "oversize_persons_removed": 0,
        "oversize_households_excluded": 0,
        "householders_rule": rules.householders,
        "units_without_one_householder_excluded": 0,
        "persons_of_units_without_one_householder": 0,
    }
    keep = np.ones(len(hh), dtype=bool)
    is_head = relp == spec.householder_code
    if rules.householders == "exclude":
        headless = householder_counts(hh, relp, t.is_gq, spec.householder_code, t.n_households) != 1
        drop = headless[hh] & ~t.is_gq
        report["units_without_one_householder_excluded"] = int(np.unique(hh[drop]).size)
        report["persons_of_units_without_one_householder"] = int(drop.sum())
        keep &= ~drop
    if rules.group_quarters == "exclude":
        keep &= ~t.is_gq
        report["group_quarters_persons_excluded"] = int(t.is_gq.sum())
    else:
        is_head = is_head | t.is_gq  # each GQ person is its own unit (unique SERIALNO)
    order = householder_first_order(hh, t.cols["SPORDER"], is_head)
    order = order[keep[order]]
    _, hh_new = np.unique(hh[order], return_inverse=True)
    counts = np.bincount(hh_new)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    over = counts > rules.max_household_size
    report["oversize_households"] = int(over.sum())
    if over.any():
        if rules.oversize == "clip":
            kept, offsets = clip_sizes(offsets, rules.max_household_size)
            report["oversize_persons_removed"] = int((~kept).sum())
            order = order[kept]
        else:
            drop = over[hh_new]
            report["oversize_households_excluded"] = int(over.sum())
            report["oversize_persons_removed"] = int(drop.sum())
            order = order[~drop]
        _, hh_new = np.unique(hh[order], return_inverse=True)
    cols = {c: v[order] for c, v in t.cols.items() if c != "_household"}
    data, counts_ = spec.encode(cols, hh_new.astype(np.int64), rules.max_household_size)
    report["households_encoded"] = counts_["households"]
    report["persons_encoded"] = counts_["persons"]
    return data, report


def load_person_file(path, spec: DomainSpec, rules: HouseholdRules, layout: str = "auto", housing=None) -> tuple[HierarchicalData, dict]:
    table = read_person_file(path, spec, layout=layout, housing=housing, householders=rules.householders)
    return encode_person_table(table, spec, rules)
