"""The input suite: a value-free Great Expectations check of the encoded inputs (what was read).

A second check, after the reader's own validator, on the ``HierarchicalData`` every input was
encoded into, per role (``private`` and ``public``, the files of a role merged), as GX
checkpoints over two tables per role:
- ``<role>_households``: geography codes within the domain spec's ranges, every household
  attribute code in 0..size−1, ``persons`` (the household's person rows) 1..M and equal to the
  size attribute (``NP_persons`` = code + 1), and, when the relationship attribute is kept,
  exactly one householder, who comes first (``householders``, ``first_is_householder``; the
  resident of a one-person group-quarters household counts as its householder);
- ``<role>_persons``: every person attribute code in 0..size−1, the position in the household
  (``slot``) 0..M−1.

Value-free: the result format is ``BOOLEAN_ONLY`` (no observed values, no unexpected values, no
row indices), every expectation's parameters come from the domain spec only (never from the
data: no counts, no observed sets), exception messages and tracebacks are left out, and no Data
Docs are rendered (they would show the dataframe's fingerprint). The result stays in the owner-only
work directory (``gx_inputs.json``); a failure names the table and the expectation only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from engine.data import HierarchicalData
from engine.errors import DPReleaseError
from engine.privacy import write_atomic
from schemas.gx_suites import dumps, expectations, failures, run_suites

GATE = "inputs"
RESULT_FORMAT = "BOOLEAN_ONLY"


class InputGateError(DPReleaseError, ValueError):
    """The encoded inputs failed the value-free input suite."""


def householder_index(spec, data: HierarchicalData) -> tuple[int, int, list[int]] | None:
    """(person attribute column, encoded householder code, encoded group-quarters codes), if the
    relationship attribute is kept."""
    from schemas.release_expectations import householder_of

    h = householder_of(spec, data.domain)
    if h is None:
        return None
    attr = data.domain.person_attribute(h.attribute)
    return data.domain.person_index(h.attribute), attr.codes.index(h.code), [attr.codes.index(c) for c in h.group_quarters]


def input_frames(data: HierarchicalData, householder: tuple[int, int, list[int]] | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(households, persons) frames of encoded codes, with the derived structure columns."""
    d = data.domain
    hh = pd.DataFrame({name: data.geo[:, j].astype(np.int64) for j, name in enumerate(d.geography)})
    for j, a in enumerate(d.group):
        hh[a.name] = data.group[:, j].astype(np.int64)
    sizes = data.sizes
    hh["persons"] = sizes.astype(np.int64)
    hh["NP_persons"] = hh[d.size_attribute] + 1
    pp = pd.DataFrame({a.name: data.person[:, j].astype(np.int64) for j, a in enumerate(d.person)})
    pp["slot"] = data.person_slot
    if householder is not None:
        col, code, gq = householder
        alone = np.repeat(sizes == 1, sizes)
        is_head = (data.person[:, col] == code) | (np.isin(data.person[:, col], gq) & alone)
        hh["householders"] = np.add.reduceat(is_head.astype(np.int64), data.person_offsets[:-1]) if len(sizes) else np.zeros(0, np.int64)
        hh["first_is_householder"] = is_head[data.person_offsets[:-1]] if len(sizes) else np.zeros(0, bool)
    return hh, pp


def input_expectations(spec, data: HierarchicalData, householder: tuple[int, int, list[int]] | None) -> tuple[list, list]:
    """(household expectations, person expectations); parameters from the domain spec only."""
    E = expectations()
    d = data.domain
    M = d.max_size
    derived = ["persons", "NP_persons"] + (["householders", "first_is_householder"] if householder else [])
    hh = [E.ExpectTableColumnsToMatchOrderedList(column_list=list(d.geography) + [a.name for a in d.group] + derived,
                                                 description="geography, household attributes, derived structure columns")]
    for g in d.geography:
        src = spec.source_columns[g]
        hh.append(E.ExpectColumnValuesToBeBetween(column=g, min_value=src.min, max_value=src.max, description=f"{g} is {src.describe()}"))
    hh += [E.ExpectColumnValuesToBeBetween(column=a.name, min_value=0, max_value=a.size - 1, description=f"{a.name} is an encoded code 0..{a.size - 1}")
           for a in d.group]
    hh += [
        E.ExpectColumnValuesToBeBetween(column="persons", min_value=1, max_value=M, description=f"every household has 1..{M} persons"),
        E.ExpectColumnPairValuesToBeEqual(column_A="NP_persons", column_B="persons", description=f"{d.size_attribute} equals the household's number of persons"),
    ]
    if householder:
        hh += [
            E.ExpectColumnValuesToBeInSet(column="householders", value_set=[1], description="exactly one householder per household"),
            E.ExpectColumnValuesToBeInSet(column="first_is_householder", value_set=[True], description="the householder is the household's first person"),
        ]
    pp = [E.ExpectTableColumnsToMatchOrderedList(column_list=[a.name for a in d.person] + ["slot"], description="person attributes, position in the household")]
    pp += [E.ExpectColumnValuesToBeBetween(column=a.name, min_value=0, max_value=a.size - 1, description=f"{a.name} is an encoded code 0..{a.size - 1}")
           for a in d.person]
    pp.append(E.ExpectColumnValuesToBeBetween(column="slot", min_value=0, max_value=M - 1, description=f"a person's position in the household is 0..{M - 1}"))
    return hh, pp


def run_input_gate(inputs: dict[str, HierarchicalData], spec, result_path: Path) -> dict:
    """Validate the encoded inputs per role (``{role: data}``), write the value-free result
    document (:func:`schemas.gx_suites.result_document`) to ``result_path`` (the work directory)
    and return it; raises :class:`InputGateError` naming each failed expectation and table."""
    tables = {}
    for role, data in inputs.items():
        householder = householder_index(spec, data)
        hh, pp = input_frames(data, householder)
        hh_exp, pp_exp = input_expectations(spec, data, householder)
        tables[f"{role}_households"] = (hh, hh_exp)
        tables[f"{role}_persons"] = (pp, pp_exp)
    document = run_suites(GATE, tables, RESULT_FORMAT, value_free=True)
    payload = dumps(document)
    write_atomic(Path(result_path), lambda f: f.write(payload))
    if not document["success"]:
        lines = "\n".join(f"  {f}" for f in failures(document))
        raise InputGateError(f"the encoded inputs failed the input suite (Great Expectations; no values shown; result: {result_path}):\n{lines}")
    return document
