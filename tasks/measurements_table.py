"""The release's ``measurements.parquet``: every noisy measurement of the run, one row per cell.

The rows come from the run's :class:`~engine.privacy.MeasurementStore` alone (the
noisy vectors and their public metadata: stage, level, node, workload, mechanism, noise scale,
sensitivity, ρ charged), so the file is post-processing of differentially private outputs and
costs no privacy. Nothing is taken from the confidential data, and no run time is written.

Cells are labelled from the measurement's workload id and the public domain:

- a marginal workload (``group:…|…`` / ``person:…|…``, :class:`engine.queries.Workload`): the
  cell's attribute values in the C order of the answer vector (group attributes first),
  ``cell_codes = "TEN=1; SEX=2"`` in release codes, ``cell_labels`` in the domain's labels;
- the household sizes (``size_histogram``: households of size k; ``size_at_least``: of size ≥ k):
  cell k−1 is size k, ``NP=k`` / ``NP>=k`` (the last histogram entry counts sizes ≥ K when K is
  below the domain's maximum size);
- a household count (``households``): one cell;
- an exponential-mechanism selection (``select:<candidates>:<digest>``): one cell, the chosen
  candidate's index.

The table is sorted by key and cell, and every column is a function of the stored measurements and
the domain: a replay from the same store writes the same bytes (``tests/test_closure.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.data import Domain
from engine.privacy import MeasurementRecord, MeasurementStore
from engine.queries import Workload
from schemas.release_schema import MEASUREMENTS_SCHEMA

__all__ = ["cell_labels", "manifest_entry", "measurements_table", "store_measurements_table"]

TABLE = "measurements.parquet"
SENSITIVITY_NORM = {"discrete_gaussian": "L2", "gaussian": "L2", "discrete_laplace": "L1", "exponential_mechanism": "score"}


def _strings(values) -> pa.Array:
    return pa.array(np.asarray(values, dtype=object), pa.string())


def _workload_cells(w: Workload, domain: Domain, n: int) -> tuple[pa.Array, pa.Array]:
    attrs = [domain.group_attribute(a) for a in w.group_attrs] + [domain.person_attribute(a) for a in w.person_attrs]
    shape = w.shape(domain)
    if int(np.prod(shape, dtype=np.int64)) != n:
        raise ValueError(f"workload {w.id}: {n} noisy cells, but the domain gives {int(np.prod(shape))} ({shape})")
    idx = np.unravel_index(np.arange(n, dtype=np.int64), shape)
    codes, labels = [], []
    for a, i in zip(attrs, idx):
        at = pa.array(i)
        codes.append(pc.take(_strings([f"{a.name}={c}" for c in a.codes]), at))
        labels.append(pc.take(_strings([f"{a.name}: {lab}" for lab in a.labels]), at))
    return pc.binary_join_element_wise(*codes, "; "), pc.binary_join_element_wise(*labels, "; ")


def _size_cells(form: str, domain: Domain, n: int) -> tuple[pa.Array, pa.Array]:
    k = np.arange(1, n + 1).astype(str)
    np_ = domain.size_attribute
    if form == "at_least":
        return _strings(np.char.add(f"{np_}>=", k)), _strings(np.char.add("households of size at least ", k))
    codes = np.char.add(f"{np_}=", k).astype(object)
    labels = np.char.add("households of size ", k).astype(object)
    if n < domain.max_size:  # sizes above K were counted as K
        codes[-1], labels[-1] = f"{np_}>={n}", f"households of size at least {n}"
    return _strings(codes), _strings(labels)


@lru_cache(maxsize=4096)
def cell_labels(workload_id: str, n: int, domain: Domain) -> tuple[pa.Array, pa.Array]:
    """(cell_codes, cell_labels) of the ``n`` cells of a measurement of ``workload_id`` (cached:
    every node of a level has the same cells; Arrow arrays are immutable)."""
    if workload_id in ("size_histogram", "size_at_least"):
        return _size_cells(workload_id.removeprefix("size_"), domain, n)
    if workload_id == "households" or workload_id.startswith("select:"):
        if n != 1:
            raise ValueError(f"a {workload_id!r} measurement has one cell, got {n}")
        if workload_id == "households":
            return pa.nulls(1, pa.string()), _strings(["households"])
        n_candidates = workload_id.split(":")[1]
        return pa.nulls(1, pa.string()), _strings([f"chosen candidate (0-based index of {n_candidates} candidate workloads)"])
    if workload_id.startswith(("group:", "person:")):
        return _workload_cells(Workload.from_id(workload_id), domain, n)
    raise ValueError(f"no cell labels for measurements of {workload_id!r}")


def _noise_sd(m: MeasurementRecord) -> float | None:
    return None if m.mechanism == "exponential_mechanism" else float(np.sqrt(m.variance))


def measurements_table(measurements: Iterable[MeasurementRecord], domain: Domain) -> pa.Table:
    """One row per cell of every measurement, sorted by key and cell (schema
    :data:`schemas.release_schema.MEASUREMENTS_SCHEMA`). The noisy values are the stored vectors'
    entries, unchanged (as float64)."""
    ms = sorted(measurements, key=lambda m: m.key)
    if len({m.key for m in ms}) != len(ms):
        raise ValueError("duplicate measurement keys")
    if not ms:
        return MEASUREMENTS_SCHEMA.empty_table()
    counts = np.array([m.noisy_answer.size for m in ms], dtype=np.int64)
    row_of = pa.array(np.repeat(np.arange(len(ms), dtype=np.int64), counts))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    cells = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)

    def per_measurement(values, typ) -> pa.Array:
        return pc.take(pa.array(values, typ), row_of)

    labelled, memo = [], {}
    for m, n in zip(ms, counts.tolist()):
        if (m.workload_id, n) not in memo:
            memo[(m.workload_id, n)] = cell_labels(m.workload_id, n, domain)
        labelled.append(memo[(m.workload_id, n)])
    columns = {
        "key": per_measurement([m.key for m in ms], pa.string()),
        "stage": per_measurement([m.stage for m in ms], pa.string()),
        "level": per_measurement([m.level for m in ms], pa.string()),
        "node": per_measurement([m.node for m in ms], pa.string()),
        "workload_id": per_measurement([m.workload_id for m in ms], pa.string()),
        "cell": pa.array(cells.astype(np.int32)),
        "cell_codes": pa.chunked_array([c for c, _ in labelled], pa.string()).combine_chunks(),
        "cell_labels": pa.chunked_array([lab for _, lab in labelled], pa.string()).combine_chunks(),
        "noisy_value": pa.array(np.concatenate([np.asarray(m.noisy_answer).ravel().astype(np.float64) for m in ms])),
        "mechanism": per_measurement([m.mechanism for m in ms], pa.string()),
        "noise_scale": per_measurement([float(m.scale) for m in ms], pa.float64()),
        "noise_sd": per_measurement([_noise_sd(m) for m in ms], pa.float64()),
        "sensitivity": per_measurement([float(m.sensitivity) for m in ms], pa.float64()),
        "sensitivity_norm": per_measurement([SENSITIVITY_NORM[m.mechanism] for m in ms], pa.string()),
        "epsilon": per_measurement([None if m.epsilon is None else float(m.epsilon) for m in ms], pa.float64()),
        "rho": per_measurement([str(m.rho) for m in ms], pa.string()),
        "rho_float": per_measurement([float(m.rho) for m in ms], pa.float64()),
    }
    return pa.table(columns, schema=MEASUREMENTS_SCHEMA)


def store_measurements_table(store: MeasurementStore, domain: Domain) -> pa.Table:
    """The table of every completed measurement in ``store`` (each vector's hash verified)."""
    return measurements_table(store.all(), domain)


def manifest_entry(table: pa.Table) -> dict:
    """The manifest's short description of ``measurements.parquet``."""
    return {
        "table": TABLE,
        "rows": table.num_rows,
        "measurements": len(pc.unique(table.column("key"))),
        "table_semantics": "every noisy measurement of the run as stored in its measurement store, one row per cell "
                           "(stage, level, node, workload and cell labels, noisy value, mechanism, noise scale and sd, "
                           "sensitivity, rho charged per measurement); differentially private outputs only, no exact "
                           "value; column descriptions in the Parquet schema's field metadata",
    }
