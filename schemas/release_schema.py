"""Arrow schemas of the public release, and the conversion of HierarchicalData into them.

The release speaks PUMS: ``ST`` (2-digit string), ``PUMA`` (5-digit zero-padded string),
``SERIALNO`` (synthetic), ``NP`` and ``SPORDER`` (integers), and every other attribute as its release
code (a PUMS code such as SEX = "2", or a bin label such as AGEP_BAND = "25-34"). ``ST`` and
``PUMA`` are the hive partition keys: read the datasets back with them typed as strings
(:data:`PARTITION_SCHEMA`), or ``00100`` becomes 100.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.domain import Attribute, Domain
from engine.hierarchical_data import HierarchicalData

PARTITION_SCHEMA = pa.schema([("ST", pa.string()), ("PUMA", pa.string())])
COUNT_OF_COUNTS_SCHEMA = pa.schema(
    [("level", pa.string()), ("node", pa.string()), ("size", pa.int16()), ("households", pa.int64())]
)


def household_schema(domain: Domain) -> pa.Schema:
    fields = [pa.field("ST", pa.string()), pa.field("PUMA", pa.string()), pa.field("SERIALNO", pa.string())]
    for a in domain.group:
        fields.append(pa.field(a.name, pa.int8() if a.name == domain.size_attribute else pa.string()))
    return pa.schema(fields)


def person_schema(domain: Domain) -> pa.Schema:
    fields = [pa.field("ST", pa.string()), pa.field("PUMA", pa.string()), pa.field("SERIALNO", pa.string()), pa.field("SPORDER", pa.int8())]
    fields += [pa.field(a.name, pa.string()) for a in domain.person]
    return pa.schema(fields)


def _decode(attr: Attribute, codes: np.ndarray) -> pa.Array:
    dictionary = pa.array(list(attr.codes), type=pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), dictionary).cast(pa.string())


def _padded(values: np.ndarray, width: int) -> pa.Array:
    return pa.array(np.char.zfill(values.astype(np.int64).astype(str), width).astype(object), type=pa.string())


def synthetic_serials(geo: np.ndarray) -> np.ndarray:
    """Synthetic SERIALNO per household: ``SY`` + ST(2) + PUMA(5) + 7-digit counter in the PUMA."""
    n = len(geo)
    if n == 0:
        return np.array([], dtype=object)
    key = geo[:, 0].astype(np.int64) * 100000 + geo[:, 1]
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sk)) + 1]
    counter = np.empty(n, dtype=np.int64)
    counter[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    st = np.char.zfill(geo[:, 0].astype(str), 2)
    puma = np.char.zfill(geo[:, 1].astype(str), 5)
    cnt = np.char.zfill((counter + 1).astype(str), 7)
    return np.char.add(np.char.add(np.char.add("SY", st), puma), cnt).astype(object)


def to_tables(data: HierarchicalData) -> tuple[pa.Table, pa.Table]:
    """(households, persons) Arrow tables in the release schemas."""
    d = data.domain
    st = _padded(data.geo[:, 0], 2)
    puma = _padded(data.geo[:, 1], 5)
    serial = pa.array(synthetic_serials(data.geo), type=pa.string())
    hh_cols = [st, puma, serial]
    for j, a in enumerate(d.group):
        col = data.group[:, j]
        hh_cols.append(pa.array((col + 1).astype(np.int8)) if a.name == d.size_attribute else _decode(a, col))
    households = pa.Table.from_arrays(hh_cols, schema=household_schema(d))
    idx = pa.array(data.person_household)
    p_cols = [st.take(idx), puma.take(idx), serial.take(idx), pa.array((data.person_slot + 1).astype(np.int8))]
    p_cols += [_decode(a, data.person[:, j]) for j, a in enumerate(d.person)]
    persons = pa.Table.from_arrays(p_cols, schema=person_schema(d))
    return households, persons
