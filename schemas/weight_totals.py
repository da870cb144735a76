"""The public totals file that household weights are calibrated to (the config's ``weights.totals``).

A CSV with a header row and the columns ``ST``, ``PUMA``, ``households`` and optionally
``persons``: one row per PUMA (``ST`` and ``PUMA`` codes, as in PUMS, leading zeros optional) and,
optionally, one row per state with ``PUMA`` empty. ``households`` and ``persons`` are public
estimates of the number of households and of persons in households (for example the published ACS
estimates). Rows of nodes the release does not cover are ignored. It is a public input: its SHA-256
is recorded in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from engine.errors import DPReleaseError

COLUMNS = ("ST", "PUMA", "households", "persons")
REQUIRED = ("ST", "PUMA", "households")


class WeightTotalsError(DPReleaseError, ValueError):
    pass


@dataclass(frozen=True)
class WeightTotals:
    """Per PUMA (``puma``: index ``(ST, PUMA)`` as ints) and per state (``state``: index ``ST``):
    the ``households`` and, when the file has the column, ``persons`` totals."""

    path: Path
    puma: pd.DataFrame
    state: pd.DataFrame
    has_persons: bool


def _numbers(df: pd.DataFrame, column: str, path: Path, pattern: str, what: str, allow_empty: bool = False) -> pd.Series:
    text = df[column].str.strip()
    ok = text.str.fullmatch(pattern) | ((text == "") if allow_empty else False)
    if not ok.all():
        line = int(df.index[~ok][0]) + 2  # header is line 1
        raise WeightTotalsError(f"{path}: line {line}, column {column}: expected {what}")
    return text


def read_weight_totals(path: str | Path) -> WeightTotals:
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise WeightTotalsError(f"{path}: cannot read the weight totals CSV ({type(e).__name__}: {e})") from None
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in REQUIRED if c not in df.columns]
    unknown = [c for c in df.columns if c not in COLUMNS]
    if missing or unknown:
        raise WeightTotalsError(f"{path}: line 1: expected the columns {', '.join(REQUIRED)} and optionally persons; "
                                + (f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"))
    if df.empty:
        raise WeightTotalsError(f"{path}: no rows; expected one row per PUMA")
    st = _numbers(df, "ST", path, r"\d{1,2}", "a state code of 1-2 digits").astype(int)
    puma = _numbers(df, "PUMA", path, r"\d{1,5}", "a PUMA code of 1-5 digits, or empty for a state's total", allow_empty=True)
    number = r"\d+(\.\d*)?([eE][+-]?\d+)?"
    has_persons = "persons" in df.columns
    values = pd.DataFrame({c: _numbers(df, c, path, number, "a number >= 0").astype(float)
                           for c in ("households", "persons") if c in df.columns})
    for c in values:
        bad = ~np.isfinite(values[c].to_numpy())
        if bad.any():
            raise WeightTotalsError(f"{path}: line {int(df.index[bad][0]) + 2}, column {c}: expected a finite number >= 0")
    is_state = puma == ""
    keys = pd.DataFrame({"ST": st, "PUMA": puma.where(~is_state, "0").astype(int)})
    dup = keys.duplicated()
    if dup.any():
        line = int(df.index[dup][0]) + 2
        raise WeightTotalsError(f"{path}: line {line}: a second row for ST {st[dup].iloc[0]}"
                                + ("" if is_state[dup].iloc[0] else f" PUMA {keys.PUMA[dup].iloc[0]:05d}"))
    puma_rows = pd.concat([keys, values], axis=1)[~is_state].set_index(["ST", "PUMA"])
    state_rows = pd.concat([keys.ST, values], axis=1)[is_state].set_index("ST")
    return WeightTotals(path, puma_rows, state_rows, has_persons)
