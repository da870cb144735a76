"""measurements.parquet: every noisy measurement of the run, one row per cell,
labelled from the workload and the domain, every value read from the measurement store."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine.data._geography import Geography
from engine.privacy._budget import BudgetPlan
from engine.privacy._ledger import PrivacyLedger
from engine.privacy._measurements import MeasurementIntegrityError, MeasurementStore
from engine.privacy._session import PrivateSession, size_counts, size_counts_sensitivity
from engine.queries._queries import Workload, answer
from schemas.release_schema import MEASUREMENTS_SCHEMA
from tasks.measurements_table import cell_labels, manifest_entry, measurements_table, store_measurements_table
from tests.engine.test_hierarchical_data import random_data

LEVELS = {"nation": Fraction(1, 5), "state": Fraction(3, 10), "puma": Fraction(1, 2)}
WIDE = Workload("group", ("NP", "TEN"), ("SEX",))  # 4·2·2 = 16 cells, measured with large noise
PERSONS = Workload("person", ("TEN",), ("SEX", "AGE"))  # 2·2·2 = 8 cells
LOW_RHO = Fraction(1, 2000)  # σ = √2/√(2ρ) ≈ 44.7 on counts of a few dozen


@pytest.fixture
def data():
    return random_data(np.random.default_rng(11), n=300, M=4)


@pytest.fixture
def store(tmp_path, data) -> MeasurementStore:
    """A store with measurements of every kind the pipeline makes: marginal workloads (group and
    person level), size histogram (household unit), size at-least counts (discrete Laplace; the
    form the table reads, at its whole-household sensitivity — the session measures the histogram,
    the cheaper form under both units), a household count and an exponential-mechanism selection."""
    ledger = PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(5000, {"s": 1}, {"s": LEVELS}))
    store = MeasurementStore(tmp_path / "m")
    geography = Geography.of([(10, 100), (10, 200), (10, 300)])  # random_data's PUMAs
    hh = PrivateSession(data, "household", ledger, store, geography=geography)
    hh.measure_workload("s", "state", (10,), WIDE, LOW_RHO)
    hh.measure_workload("s", "puma", (10, 200), PERSONS, Fraction(1, 10), tag="round-1")
    hh.measure_sizes("s", "nation", (), 4, Fraction(1, 10))
    state = data.select(data.node_mask((10,)))
    store.measure_laplace(key="s/ST=10/sizes", ledger=ledger, stage="s", level="state", node="ST=10", workload_id="size_at_least",
                          true_answer=size_counts(state.sizes, 4), l1_sensitivity=size_counts_sensitivity(4, "person", "at_least")[0],
                          rho=Fraction(1, 10))
    hh.measure_household_count("s", "puma", (10, 100), Fraction(1, 10))
    ws = [Workload("group", ("TEN",)), Workload("person", (), ("SEX",)), Workload("group", ("NP",))]
    hh.select_worst_workload("s", "state", (10,), "round-2", ws, [300.0, 600.0, 300.0], np.zeros(2 + 2 + 4), 1.0, 1.0 / 100)
    return store


def rows_of(table: pa.Table, key: str) -> dict[str, list]:
    return table.filter(pc.equal(table.column("key"), key)).to_pydict()


def test_one_row_per_cell_every_value_from_the_store(store, data):
    table = store_measurements_table(store, data.domain)
    assert table.schema.equals(MEASUREMENTS_SCHEMA, check_metadata=True)
    stored = {k: store.get(k) for k in store.keys()}
    assert len(stored) == 6
    assert table.num_rows == sum(m.noisy_answer.size for m in stored.values())
    # every key of the store, nothing else, in key order, cells 0..n-1 within each
    keys = table.column("key").to_pylist()
    assert sorted(set(keys)) == sorted(stored) and keys == sorted(keys)
    for key, m in stored.items():
        r = rows_of(table, key)
        n = m.noisy_answer.size
        assert r["cell"] == list(range(n))
        # the value written is the stored noisy answer, entry for entry
        assert np.array_equal(np.asarray(r["noisy_value"]), m.noisy_answer.astype(np.float64)), key
        for col, want in (("stage", m.stage), ("level", m.level), ("node", m.node), ("workload_id", m.workload_id),
                          ("mechanism", m.mechanism), ("noise_scale", m.scale), ("sensitivity", m.sensitivity),
                          ("rho", str(m.rho)), ("rho_float", float(m.rho)), ("epsilon", m.epsilon)):
            assert r[col] == [want] * n, (key, col)
        assert Fraction(r["rho"][0]) == m.rho
    # the large-noise workload: what is written is the noisy answer, not the exact one (all 16
    # discrete Gaussian draws of σ ≈ 45 being 0 has probability < 1e-25)
    wide = stored["s/ST=10/" + WIDE.id]
    exact = answer(data.select(data.node_mask((10,))), WIDE)
    written = np.asarray(rows_of(table, wide.key)["noisy_value"])
    assert wide.scale > 40 and not np.array_equal(written, exact)


def test_cell_labels_follow_the_workload_and_the_domain(store, data):
    table = store_measurements_table(store, data.domain)
    d = data.domain
    # marginal workloads: C order over (group attributes, then person attributes), release codes and labels
    for w, key in ((WIDE, "s/ST=10/" + WIDE.id), (PERSONS, "s/ST=10/PUMA=00200/round-1/" + PERSONS.id)):
        attrs = [d.group_attribute(a) for a in w.group_attrs] + [d.person_attribute(a) for a in w.person_attrs]
        codes = ["; ".join(f"{a.name}={c}" for a, c in zip(attrs, cell)) for cell in itertools.product(*(a.codes for a in attrs))]
        labels = ["; ".join(f"{a.name}: {lab}" for a, lab in zip(attrs, cell)) for cell in itertools.product(*(a.labels for a in attrs))]
        r = rows_of(table, key)
        assert r["cell_codes"] == codes and r["cell_labels"] == labels and len(codes) == w.n_cells(d)
    assert rows_of(table, "s/ST=10/" + WIDE.id)["cell_codes"][5] == "NP=2; TEN=1; SEX=2"
    # sizes: cell k-1 is size k, in the form measured
    hist, at_least = rows_of(table, "s/nation/sizes"), rows_of(table, "s/ST=10/sizes")
    assert hist["workload_id"][0] == "size_histogram" and hist["cell_codes"] == ["NP=1", "NP=2", "NP=3", "NP=4"]
    assert hist["cell_labels"][2] == "households of size 3" and hist["noise_sd"] == hist["noise_scale"]
    assert at_least["workload_id"][0] == "size_at_least" and at_least["cell_codes"] == ["NP>=1", "NP>=2", "NP>=3", "NP>=4"]
    lap = store.get("s/ST=10/sizes")
    assert at_least["mechanism"][0] == "discrete_laplace" and at_least["sensitivity_norm"][0] == "L1"
    assert at_least["noise_sd"][0] == pytest.approx(np.sqrt(lap.variance)) and at_least["epsilon"][0] == lap.epsilon
    # a household count: one cell, no codes
    g = rows_of(table, "s/ST=10/PUMA=00100/households")
    assert g["cell"] == [0] and g["cell_codes"] == [None] and g["cell_labels"] == ["households"]
    assert g["sensitivity_norm"] == ["L2"] and g["noise_sd"] == g["noise_scale"]
    # a selection: the chosen candidate's index, no noise sd
    sel = rows_of(table, "s/ST=10/round-2/select")
    assert sel["mechanism"] == ["exponential_mechanism"] and sel["noise_sd"] == [None] and sel["sensitivity_norm"] == ["score"]
    assert sel["noisy_value"][0] in (0.0, 1.0, 2.0) and "of 3 candidate" in sel["cell_labels"][0]
    # a histogram below the domain's maximum size: its last entry counts sizes >= K
    codes, _ = cell_labels("size_histogram", 3, d)
    assert codes.to_pylist() == ["NP=1", "NP=2", "NP>=3"]


def test_unknown_or_inconsistent_measurements_are_refused(data):
    with pytest.raises(ValueError, match="no cell labels"):
        cell_labels("mystery", 2, data.domain)
    with pytest.raises(ValueError, match="the domain gives 16"):
        cell_labels(WIDE.id, 15, data.domain)
    with pytest.raises(ValueError, match="one cell"):
        cell_labels("households", 2, data.domain)
    with pytest.raises(KeyError):
        cell_labels("group:NOPE|", 2, data.domain)


def test_deterministic_and_read_through_the_verified_store(store, data, tmp_path):
    a = store_measurements_table(store, data.domain)
    b = measurements_table(list(reversed(store.all())), data.domain)
    assert a.equals(b)
    pq.write_table(a, tmp_path / "a.parquet", compression="zstd")
    pq.write_table(b, tmp_path / "b.parquet", compression="zstd")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert measurements_table([], data.domain).schema.equals(MEASUREMENTS_SCHEMA)
    entry = manifest_entry(a)
    assert entry["rows"] == a.num_rows and entry["measurements"] == 6 and entry["table"] == "measurements.parquet"
    # a vector altered in the store is refused, never published
    stem = MeasurementStore._stem("s/nation/sizes")
    with np.load(store.directory / f"{stem}.npz") as z:
        noisy, meta = z["noisy"].copy(), z["meta"].copy()
    np.savez(store.directory / f"{stem}.npz", noisy=noisy + 1, meta=meta)
    with pytest.raises(MeasurementIntegrityError):
        store_measurements_table(store, data.domain)


def test_published_hashed_and_verified(store, data, tmp_path, vermont):
    from tasks.audit import AuditLog, verify_release
    from tasks.publish import sha256_file, write_release

    table = store_measurements_table(store, data.domain)
    (tmp_path / "work").mkdir()
    audit = AuditLog(tmp_path / "work" / "audit.jsonl")
    audit.append("run_start", release="t")
    rel = tmp_path / "rel"
    vt, _ = vermont
    manifest = write_release(rel, vt.take(np.arange(100)), {"release": "t"}, measurements=table, audit=audit)
    path = rel / "measurements.parquet"
    assert manifest["outputs"]["measurements.parquet"] == sha256_file(path)
    assert json.loads((rel / "manifest.json").read_text())["outputs"]["measurements.parquet"] == sha256_file(path)
    back = pq.read_table(path)
    assert back.equals(table) and back.schema.field("noise_sd").metadata[b"description"]
    assert verify_release(rel) == []
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 1
    path.write_bytes(bytes(b))
    assert any("measurements.parquet" in p for p in verify_release(rel))
