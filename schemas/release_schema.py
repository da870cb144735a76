"""Arrow schemas of the public release, and the conversion of HierarchicalData into them.

The release speaks PUMS: ``ST`` (2-digit string), ``PUMA`` (5-digit zero-padded string),
``SERIALNO`` (synthetic), ``NP`` and ``SPORDER`` (integers), and every other attribute as its short
release code (a PUMS code such as SEX = "2", a bin's range such as AGEP_BAND = "25-34", a group's
number such as HISP_ORIGIN = "2"; ``domain.json`` maps codes to labels). ``ST`` and ``PUMA`` are the
hive partition keys: read the datasets back with them typed as strings (:data:`PARTITION_SCHEMA`),
or ``00100`` becomes 100. Every column carries a ``description`` in its field metadata; an optional
``WEIGHT`` column (``tasks.weights``) holds calibrated household weights.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.data import Attribute, Domain, HierarchicalData

PARTITION_SCHEMA = pa.schema([("ST", pa.string()), ("PUMA", pa.string())])
# the release's own columns (the attributes' descriptions come from the domain spec)
RELEASE_COLUMNS = {
    "ST": "state code: 2-digit FIPS code as a zero-padded string (a hive partition key: read it as a string)",
    "PUMA": "public use microdata area code: 5-digit zero-padded string, unique only together with ST "
            "(a hive partition key: read it as a string)",
    "SERIALNO": "synthetic household serial number: SY + ST + PUMA + a 7-digit counter within the PUMA; "
                "it identifies a synthetic household and matches no PUMS record",
    "SPORDER": "person number within the synthetic household, 1..NP; person 1 is the householder",
}
WEIGHT = "WEIGHT"
WEIGHT_DESCRIPTION = ("household weight calibrated by raking to the public totals named in the manifest's weights entry "
                      "(post-processing of the released microdata); a person's weight is their household's")
COUNT_OF_COUNTS_COLUMNS = {
    "level": (pa.string(), "the geography level: nation, state or puma"),
    "node": (pa.string(), "the geography node: nation, ST=xx or ST=xx/PUMA=xxxxx"),
    "size": (pa.int16(), "household size (number of persons), 1..max_household_size"),
    "households": (pa.int64(), "number of released households of this size at the node (equal to the microdata's count)"),
}
COUNT_OF_COUNTS_SCHEMA = pa.schema(
    [pa.field(name, typ, metadata={"description": doc}) for name, (typ, doc) in COUNT_OF_COUNTS_COLUMNS.items()]
)
# measurements.parquet: every noisy measurement of the run, one row per cell (tasks/measurements_table.py)
MEASUREMENTS_COLUMNS = {
    "key": (pa.string(), "the measurement's key in the run's store: <stage>/<node>/[<tag>/]<name>"),
    "stage": (pa.string(), "the pipeline stage that measured it (a budget stage of the plan)"),
    "level": (pa.string(), "the geography level charged: nation, state or puma"),
    "node": (pa.string(), "the geography node: nation, ST=xx or ST=xx/PUMA=xxxxx"),
    "workload_id": (pa.string(), "group:<group attrs>|<person attrs> or person:…|… (a marginal workload), "
                                 "size_histogram, size_at_least, households, or select:<candidates>:<digest>"),
    "cell": (pa.int32(), "index of the cell in the measured vector (C order over the workload's attributes; size k at cell k-1)"),
    "cell_codes": (pa.string(), "the cell as release codes, 'ATTR=code; ATTR=code' (NP=k, NP>=k for sizes); null for "
                                "household counts and selections"),
    "cell_labels": (pa.string(), "the cell in words (domain labels)"),
    "noisy_value": (pa.float64(), "the noisy answer of the cell as stored (for a selection, the chosen candidate's index)"),
    "mechanism": (pa.string(), "discrete_gaussian, gaussian, discrete_laplace or exponential_mechanism"),
    "noise_scale": (pa.float64(), "sigma (Gaussian), b (discrete Laplace), or 2*sensitivity/epsilon (exponential mechanism)"),
    "noise_sd": (pa.float64(), "standard deviation of one cell's noise (an upper bound for the discrete Gaussian); "
                               "null for the exponential mechanism"),
    "sensitivity": (pa.float64(), "sensitivity of the whole measured vector, in the norm of sensitivity_norm"),
    "sensitivity_norm": (pa.string(), "L2 (Gaussian), L1 (discrete Laplace) or score (exponential mechanism)"),
    "epsilon": (pa.float64(), "epsilon of a pure-DP mechanism (discrete Laplace, exponential mechanism); null otherwise"),
    "rho": (pa.string(), "rho-zCDP charged for the whole measurement (repeated on each of its cells), exact fraction"),
    "rho_float": (pa.float64(), "rho as a float"),
}
MEASUREMENTS_SCHEMA = pa.schema(
    [pa.field(name, typ, metadata={"description": doc}) for name, (typ, doc) in MEASUREMENTS_COLUMNS.items()]
)
# intervals.parquet: an error estimate beside every released answer of the count-of-counts table
# and of the measured marginals at their nodes (tasks/intervals.py, engine/synthesis/_uncertainty.py)
INTERVALS_COLUMNS = {
    "table": (pa.string(), "count_of_counts (a household-size histogram of count_of_counts.parquet) or marginal "
                           "(a workload the synthesis measured at this node, answered by the released microdata)"),
    "level": (pa.string(), "the geography level: nation, state or puma"),
    "node": (pa.string(), "the geography node: nation, ST=xx or ST=xx/PUMA=xxxxx"),
    "marginal": (pa.string(), "size_histogram, or the workload id (group:<group attrs>|<person attrs>, person:…|…;first=k)"),
    "cell": (pa.int32(), "index of the cell (C order over the workload's attributes; size k at cell k-1)"),
    "cell_codes": (pa.string(), "the cell as release codes, 'ATTR=code; ATTR=code' (NP=k for sizes)"),
    "released": (pa.float64(), "the released answer: the cell's count in the released microdata"),
    "se": (pa.float64(), "standard error of the released answer as an estimate of the confidential one"),
    "bias": (pa.float64(), "estimated bias of the estimator (bootstrap mean minus released; 0 for the analytic form)"),
    "lo90": (pa.float64(), "lower end of the 90 % interval: released - bias - 1.645 se, floored at 0"),
    "hi90": (pa.float64(), "upper end of the 90 % interval: released - bias + 1.645 se"),
    "method": (pa.string(), "parametric_bootstrap (count-of-counts estimator rerun on simulated measurements), "
                            "map_eb (the MAP update's error, its prior's error estimated by empirical Bayes from the noisy answers) "
                            "or measurement_sd (IDE rule)"),
}
INTERVALS_SCHEMA = pa.schema(
    [pa.field(name, typ, metadata={"description": doc}) for name, (typ, doc) in INTERVALS_COLUMNS.items()]
)


def _field(name: str, typ: pa.DataType, description: str) -> pa.Field:
    return pa.field(name, typ, metadata={"description": description} if description else None)


def _fixed(*names: str) -> list[pa.Field]:
    return [_field(n, pa.int8() if n == "SPORDER" else pa.string(), RELEASE_COLUMNS[n]) for n in names]


def household_schema(domain: Domain) -> pa.Schema:
    fields = _fixed("ST", "PUMA", "SERIALNO")
    for a in domain.group:
        fields.append(_field(a.name, pa.int8() if a.name == domain.size_attribute else pa.string(), a.description))
    return pa.schema(fields)


def person_schema(domain: Domain) -> pa.Schema:
    return pa.schema(_fixed("ST", "PUMA", "SERIALNO", "SPORDER") + [_field(a.name, pa.string(), a.description) for a in domain.person])


def weight_field() -> pa.Field:
    return _field(WEIGHT, pa.float64(), WEIGHT_DESCRIPTION)


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
