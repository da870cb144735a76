"""In-code contract of the public release tables (pandera), checked before anything is written.

Every column of the release schemas is present (and nothing else); every attribute value is one of
the domain's release codes; ST is 2 digits and PUMA 5 digits; NP is 1..M; SPORDER is 1..NP of its
household; SERIALNO is unique per household and carries its household's ST and PUMA (so the
release, checked one state at a time, has unique SERIALNOs across states). A violation is a bug in the pipeline, never a
property of the input, so the error names the table, column and check (no cell values).
"""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow

from engine.data import Domain
from engine.errors import DPReleaseError


class ReleaseContractError(DPReleaseError, ValueError):
    pass


def _schemas(domain: Domain) -> tuple[pa.DataFrameSchema, pa.DataFrameSchema]:
    geo = {
        "ST": pa.Column(str, pa.Check.str_matches(r"^\d{2}$")),
        "PUMA": pa.Column(str, pa.Check.str_matches(r"^\d{5}$")),
        "SERIALNO": pa.Column(str, pa.Check.str_matches(r"^SY\d{14}$")),
    }
    hh = dict(geo)
    hh["SERIALNO"] = pa.Column(str, pa.Check.str_matches(r"^SY\d{14}$"), unique=True)
    for a in domain.group:
        if a.name == domain.size_attribute:
            hh[a.name] = pa.Column(int, pa.Check.in_range(1, domain.max_size))
        else:
            hh[a.name] = pa.Column(str, pa.Check.isin(list(a.codes)))
    pp = dict(geo, SPORDER=pa.Column(int, pa.Check.in_range(1, domain.max_size)))
    for a in domain.person:
        pp[a.name] = pa.Column(str, pa.Check.isin(list(a.codes)))
    return pa.DataFrameSchema(hh, strict=True, coerce=False), pa.DataFrameSchema(pp, strict=True, coerce=False)


def _check(schema: pa.DataFrameSchema, df: pd.DataFrame, table: str) -> None:
    try:
        schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        fc = e.failure_cases
        lines = sorted({f"{table}: column {c}: failed {chk}" for c, chk in zip(fc["column"], fc["check"])})
        raise ReleaseContractError("release contract violated:\n" + "\n".join(lines)) from None


def validate_release_tables(households: pa_arrow.Table, persons: pa_arrow.Table, domain: Domain) -> None:
    hh_schema, p_schema = _schemas(domain)
    hh = households.to_pandas()
    pp = persons.to_pandas()
    for df in (hh, pp):
        for c in ("NP", "SPORDER"):
            if c in df:
                df[c] = df[c].astype("int64")
    _check(hh_schema, hh, "households")
    _check(p_schema, pp, "persons")
    if not (hh["SERIALNO"].str.slice(2, 9) == hh["ST"] + hh["PUMA"]).all():
        raise ReleaseContractError("release contract violated:\nhouseholds: SERIALNO must carry the household's ST and PUMA (SY + ST + PUMA + counter)")
    sizes = pp.groupby("SERIALNO", sort=False).SPORDER.agg(["count", "max"])
    np_by_serial = hh.set_index("SERIALNO").NP
    joined = sizes.join(np_by_serial, how="outer")
    if joined.isna().any().any() or not ((joined["count"] == joined.NP) & (joined["max"] == joined.NP)).all():
        raise ReleaseContractError("release contract violated:\npersons: SPORDER must run 1..NP within each household, and every person's SERIALNO must be a household's")
