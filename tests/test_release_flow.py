"""End to end: the release flow on real data (Prefect + a local Dask cluster). Slow: few tests."""

import contextlib
import itertools
import json
import logging
import os
import sqlite3
import stat
import zipfile
from datetime import UTC, datetime
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from tests.confidential_scan import (
    Needles,
    findings,
    non_confidential_work_files,
    prefect_database,
    prefect_server_home,
    scan_database,
    scan_files,
    scan_prefect_home,
    settle_prefect,
)
from tests.conftest import ACS2018

pytestmark = pytest.mark.flow


def small_config(tmp_path, data_root, advanced=None, **over):
    """Vermont private, New Hampshire public; ``advanced``: overrides beside the allocation (one
    public state: the synthesis shares are given, the split simulation needs two)."""
    cfg = {
        "name": "e2e",
        "data_root": str(data_root),
        "private": [{"path": "acs2018_1yr/csv_pvt.zip"}],
        "public": [{"path": "acs2018_1yr/csv_pnh.zip"}],
        "budget": {"epsilon": 1.0},
        "advanced": {"allocation": {
            "stages": {"count_of_counts": 0.1, "state_synthesis": 0.45, "puma_synthesis": 0.45},
            "levels": {"count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5}, "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}},
            "synthesis_split": "fixed",
        }, **(advanced or {})},
        "output_dir": str(tmp_path / "releases"),
        "work_dir": str(tmp_path / "work"),
    }
    cfg.update(over)
    p = tmp_path / "release.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _flow_runs_since(client, since):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime

    return client.read_flow_runs(flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)))


def artifact_texts(since) -> list[str]:
    """The data (tables and markdown) of every Prefect artifact of the flow runs started after
    ``since`` (the test session's Prefect server also holds the other tests' runs), as text."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        ids = [r.id for r in _flow_runs_since(client, since)]
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)))
        return [f"{a.key}\n{a.description}\n{a.data if isinstance(a.data, str) else json.dumps(a.data)}" for a in arts]


def flow_run_parameters(since) -> list[str]:
    """The parameters of every flow run started after ``since``, as stored by Prefect (its
    database is not confidential storage)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return [json.dumps(r.parameters, default=str) for r in _flow_runs_since(client, since)]


def test_release_end_to_end(tmp_path, data_root, capfd, own_local_cluster, monkeypatch):
    from flows.cli import main

    cfg = small_config(tmp_path, data_root)
    started = datetime.now(UTC)
    # the run logs at dprelease's default level (INFO; the suite's is WARNING), in this process and
    # in the Dask workers it spawns, so that the scan below reads every line an operator would
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "INFO")
    prefect_logger = logging.getLogger("prefect")
    level = prefect_logger.level
    prefect_logger.setLevel(logging.INFO)
    try:
        assert main(["run", str(cfg)]) == 0
    finally:
        prefect_logger.setLevel(level)
    console = [capfd.readouterr()]
    rel = tmp_path / "releases" / "e2e"
    manifest = json.loads((rel / "manifest.json").read_text())
    assert manifest["synthesizer"]["name"] == "prior_update"
    assert manifest["stages"] == ["ingest", "select_workload", "choose_prior_strength_floor", "count_of_counts", "choose_puma_attributes",
                                  "state_synthesis", "puma_synthesis", "publish"]
    # the PUMA attributes: at least the configured number, as many one-way PUMA workloads as chosen, never the size
    # attribute (the count-of-counts stage measures every PUMA's size histogram)
    from engine.queries._queries import Workload

    chosen, expl = manifest["synthesizer"]["puma_attributes"], manifest["workload"]["explanation"]
    assert chosen["puma_attributes"] >= manifest["synthesizer"]["settings"]["puma_attributes"]
    assert len(expl["puma_attributes"]) == chosen["puma_attributes"]
    assert set(expl["puma_attributes"]) == set(expl["puma_attribute_ranking"][: chosen["puma_attributes"]])
    assert "NP" not in expl["puma_attribute_ranking"]
    measured = [Workload.from_id(w) for w in manifest["workload"]["puma"]]
    assert {w.attrs[0] for w in measured if len(w.attrs) == 1} == set(expl["puma_attributes"])
    # one public state cannot be played against others: the simulation runs, records no floor
    floor = manifest["synthesizer"]["prior_strength_floor"]
    assert floor["floor"] == 0.0 and floor["played"] == [] and floor["candidates"] == manifest["synthesizer"]["settings"]["strength_candidates"]
    assert manifest["workload"]["state"] and manifest["workload"]["puma"]
    # the ledger: every stage spent, never beyond the plan
    led = manifest["privacy"]["ledger"]
    for st in ("count_of_counts", "state_synthesis", "puma_synthesis"):
        assert 0 < led["stages"][st]["spent_float"] <= led["stages"][st]["allocated_float"]
    assert Fraction(led["total"]["spent"]) <= Fraction(led["total"]["allocated"])
    assert manifest["privacy"]["epsilon_delta"]["epsilon"] <= 1.0 + 1e-9
    assert {i["role"] for i in manifest["inputs"]} == {"private", "public"}
    # the declared geography: the private file's state, every PUMA of the public list for it
    from engine.data._geography import node_key
    from schemas.geography import shipped_puma_list

    assert manifest["geography"]["states"] == ["50"] and manifest["geography"]["puma_list"] == "puma_2010"
    assert manifest["geography"]["pumas"] == [node_key(p) for p in shipped_puma_list().restricted([50]).pumas]
    assert "git_commit" in manifest["code"] and manifest["libraries"]["prefect"].startswith("3.8")
    from tasks.publish import read_release

    households, persons = read_release(rel)
    # the data dictionary beside the domain; no weights were asked for, and the release says so
    dictionary = json.loads((rel / "domain.json").read_text())["dictionary"]
    assert {c["name"] for c in dictionary["tables"]["households"]} == set(households.column_names)  # partition keys last on reading
    assert "WEIGHT" not in households.column_names and not manifest["weights"]["weighted"]
    assert dictionary["weights"] == manifest["weights"]["statement"] and "unweighted synthetic sample" in dictionary["weights"]
    # one partition per Vermont PUMA, zero-padded strings
    assert set(households.column("PUMA").to_pylist()) == {"00100", "00200", "00300", "00400"}
    assert set(households.column("ST").to_pylist()) == {"50"}
    # count-of-counts: consistent across levels, and the release has exactly those households
    coc = pd.read_parquet(rel / "count_of_counts.parquet")
    by = coc.pivot_table(index="node", columns="size", values="households", aggfunc="sum")
    pumas = [n for n in by.index if "PUMA" in n]
    assert (by.loc[pumas].sum() == by.loc["ST=50"]).all() and (by.loc["ST=50"] == by.loc["nation"]).all()
    assert (coc.households >= 0).all()
    hh = households.to_pandas()
    got = hh.groupby(["PUMA", "NP"]).size()
    for node in pumas:
        puma = node.split("PUMA=")[1]
        for size, n in by.loc[node].items():
            assert got.get((puma, size), 0) == n
    assert main(["audit", "verify", str(rel)]) == 0
    # the release report: hashed like every output, offline, and drawn by a real browser (where one is installed)
    from tests.test_release_report import check_release_report

    assert "report.html" in manifest["outputs"]
    check_release_report(rel, tmp_path)
    # work directory is owner-only; gate result kept with the run
    work = tmp_path / "work" / "e2e"
    # measurements.parquet: hashed in the manifest, and the run's measurement store one for one
    # (every stored measurement, nothing else, each cell's value the stored noisy answer)
    from engine.privacy._measurements import MeasurementStore
    from tasks.publish import sha256_file

    assert manifest["outputs"]["measurements.parquet"] == sha256_file(rel / "measurements.parquet")
    meas = pq.read_table(rel / "measurements.parquet").to_pandas()
    store = MeasurementStore(work / "measurements")
    stored = {k: store.get(k) for k in store.keys()}
    assert set(meas.key) == set(stored) and len(meas) == sum(m.noisy_answer.size for m in stored.values())
    assert manifest["measurements"]["rows"] == len(meas) and manifest["measurements"]["measurements"] == len(stored)
    assert {m.stage for m in stored.values()} == {"count_of_counts", "state_synthesis", "puma_synthesis"}
    for key, rows in meas.groupby("key", sort=False):
        m = stored[key]
        assert rows.cell.tolist() == list(range(m.noisy_answer.size)), key
        assert np.array_equal(rows.noisy_value.to_numpy(), m.noisy_answer.astype(np.float64)), key
        assert (rows.stage == m.stage).all() and (rows.node == m.node).all() and (rows.rho == str(m.rho)).all()
    assert meas.cell_labels.notna().all()
    # synthesis fits the raw size measurements (their noise independent, of the stored σ), not the
    # post-processed consistent histograms
    from engine.data._geography import node_key
    from tasks.count_of_counts import size_measurements

    for level in ("state", "puma"):
        sizes = size_measurements(str(work / "nodes" / "count_of_counts" / "hierarchy.npz"), level)
        assert sizes
        for node, (hist, sd) in sizes.items():
            m = stored[f"count_of_counts/{node_key(node)}/sizes"]
            assert np.array_equal(hist, m.noisy_answer.astype(np.float64)) and sd == np.sqrt(m.variance)
    # intervals.parquet: hashed; an error estimate beside every count-of-counts cell and every
    # measured workload's cells at its node; dprelease query shows it
    assert manifest["outputs"]["intervals.parquet"] == sha256_file(rel / "intervals.parquet")
    iv = pq.read_table(rel / "intervals.parquet").to_pandas()
    assert manifest["intervals"]["rows"] == len(iv) and (iv.se >= 0).all() and (iv.lo90 <= iv.hi90).all()
    coc_iv = iv[iv.table == "count_of_counts"].set_index(["node", "cell"]).released
    assert coc_iv.to_dict() == {(n, s - 1): float(v) for n, s, v in zip(coc.node, coc["size"], coc.households)}
    marg = iv[iv.table == "marginal"]
    assert set(marg.marginal[marg.level == "puma"]) >= set(manifest["workload"]["puma"])
    # the state's: the public-chosen workloads and those its adaptive rounds chose (the default's rounds ran)
    from engine.synthesis._settings import DEFAULT_ADAPTIVE

    state_measured = meas[(meas.stage == "state_synthesis") & (meas.mechanism != "exponential_mechanism")]
    assert (meas.mechanism == "exponential_mechanism").sum() == DEFAULT_ADAPTIVE.rounds
    assert set(marg.marginal[marg.level == "state"]) - {"group:NP|"} == (set(manifest["workload"]["state"]) | set(state_measured.workload_id)) - {"group:NP|"}
    assert set(state_measured.workload_id) - set(manifest["workload"]["state"]) - {"group:NP|"}
    assert main(["query", str(rel), "--margin", "NP", "--level", "group", "--where", "ST=50"]) == 0
    console.append(capfd.readouterr())
    assert "count_lower_90" in console[-1].out
    assert stat.S_IMODE(os.stat(work).st_mode) == 0o700
    # the manifest names the private input by its keyed hash only, the public one by its plain hash
    named = {i["role"]: i for i in manifest["inputs"]}
    assert "sha256" not in named["private"] and len(named["private"]["hmac_sha256"]) == 64
    assert named["public"]["sha256"] == json.loads((work / "inputs" / "public-00.json").read_text())["sha256"]
    assert json.loads((work / "validation.json").read_text())["success"] is True
    # no confidential identifier or record reaches the release or a Prefect artifact
    with zipfile.ZipFile(ACS2018 / "csv_pvt.zip") as z:
        raw_lines = z.open("psam_p50.csv").read().decode().splitlines()[1:]
    serials = {line.split(",")[1] for line in raw_lines}
    records = [line.encode() for line in raw_lines]
    blob = b"".join(p.read_bytes() for p in rel.rglob("*") if p.is_file())
    artifacts = artifact_texts(started)
    assert any(a.startswith("e2e-ledger") for a in artifacts), artifacts
    assert any(a.startswith("e2e-summary") for a in artifacts), artifacts
    blob_artifacts = "\n".join(artifacts).encode()
    # exact confidential statistics (the exclusion report) stay in the work directory, never in
    # Prefect's database through flow-run parameters
    params = "\n".join(flow_run_parameters(started))
    assert "dprelease-release" in params or "config_path" in params
    private_report = json.loads((work / "run_summary.json").read_text())["inputs"][0]
    assert private_report["persons_read"] > 0
    assert "persons_read" not in params and "group_quarters_persons" not in params
    for b in (blob, blob_artifacts):
        assert not any(s.encode() in b for s in serials)
        assert not any(r in b for r in records)
    # a finished release is never overwritten
    assert main(["run", str(cfg)]) == 2
    console.append(capfd.readouterr())
    assert "never overwritten" in console[-1].err
    # nothing derived from the private input where an operator reads: every table of Prefect's
    # database (parameters, task runs, logs, artifacts, events), Prefect's home (result storage,
    # server log), the console, the release and the work directory's non-confidential files
    db = prefect_database()
    assert db is not None and db.exists(), "the scan needs the local Prefect server's SQLite database"
    settle_prefect(db, str(cfg))
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:  # the run's log lines are among what is scanned
        assert con.execute("SELECT count(*) FROM log WHERE message LIKE 'published % synthetic households%'").fetchone()[0] >= 1
    published = {(int(st), int(pu)): int(n) for (st, pu), n in hh.groupby(["ST", "PUMA"]).size().items()}
    # the report publishes the released microdata's counts (checked cell by cell against the microdata in
    # tests/test_release_report.py): a synthetic count may land on an exact total by chance
    from tests.test_release_report import embedded_data

    levels = embedded_data((rel / "report.html").read_text())["levels"].values()
    report_counts = {int(c) for lv in levels for nd in lv["nodes"].values() for c in [nd["households"], nd["persons"], *itertools.chain(*nd["counts"])]}
    needles = Needles.of_private_input(work, published, {len(hh), persons.num_rows, *(int(n) for n in hh.groupby("ST").size()), *report_counts})
    assert needles.hashes and len(needles.puma_counts) >= 2 and needles.totals  # enough left to find
    # the refused rerun never reached Prefect (refused before it starts: flows.preflight), so no
    # stored exception is expected here; reading stored results is tested in test_confidential_scan
    in_home, _ = scan_prefect_home(prefect_server_home(), needles)
    leaks = scan_database(db, needles, str(cfg)) + in_home
    leaks += scan_files(non_confidential_work_files(work) + sorted(p for p in rel.rglob("*") if p.is_file()), needles)
    leaks += findings("console", "\n".join(c.out + c.err for c in console), needles)
    assert not leaks, leaks


def test_bad_input_fails_the_run_and_publishes_nothing(tmp_path, data_root, capsys):
    from flows.cli import main

    bad = tmp_path / "bad.csv"
    with zipfile.ZipFile(ACS2018 / "csv_pvt.zip") as z:
        lines = z.open("psam_p50.csv").read().decode().splitlines()[:200]
    cells = lines[5].split(",")
    cells[lines[0].split(",").index("SEX")] = "7"
    lines[5] = ",".join(cells)
    bad.write_text("\n".join(lines) + "\n")
    cfg = small_config(tmp_path, data_root, private=[{"path": str(bad)}])
    assert main(["run", str(cfg)]) != 0
    err = capsys.readouterr().err
    assert "bad.csv, line 6, column SEX" in err
    assert not (tmp_path / "releases" / "e2e").exists()


def _worker_cache_sizes() -> int:
    """(in a Dask worker) the entries of the caches the synthesis fills (``flows.release.drop_worker_caches``)."""
    from tasks import context, synthesize

    return sum(c.cache_info().currsize for c in (*synthesize.worker_caches(), *context.worker_caches()))


def test_the_non_default_options_run_end_to_end(tmp_path, data_root):
    """One run through the options the default release does not take: the person privacy unit,
    the discrete-Laplace count-of-counts, a group_counts stage beside it, the average consistency,
    fewer adaptive rounds with another share, and weights. The ledger and the audit must hold as on
    the default path."""
    from flows.cli import main

    # public household totals the households are weighted to (made up, of the size of Vermont's ACS
    # estimates). Person totals are left to the calibration's own tests: whether a synthetic PUMA's
    # sizes can reach a given persons-per-household ratio depends on the draw, so made-up person
    # totals would make this test fail by chance
    totals = tmp_path / "vt_totals.csv"
    totals.write_text("ST,PUMA,households\n50,100,61000\n50,00200,64500\n50,300,66000\n50,400,70500\n50,,262000\n")
    cfg = small_config(
        tmp_path, data_root, privacy_unit="person", weights={"totals": str(totals)},
        advanced={
            "synthesis": {"adaptive": {"rounds": 2, "share": 0.2}},
            "count_of_counts": {"mechanism": "laplace", "consistency": "average"},
            "allocation": {
                "stages": {"group_counts": 0.05, "count_of_counts": 0.05, "state_synthesis": 0.45, "puma_synthesis": 0.45},
                "levels": {"group_counts": {"puma": 1.0}, "count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5},
                           "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}},
                "synthesis_split": "fixed",
            },
        },
    )
    assert main(["run", str(cfg)]) == 0
    address = os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address:  # the session's shared cluster outlives the run: its workers gave back their synthesis caches
        from distributed import Client

        with Client(address, set_as_default=False) as client:
            assert set(client.run(_worker_cache_sizes).values()) == {0}
    rel = tmp_path / "releases" / "e2e"
    manifest = json.loads((rel / "manifest.json").read_text())
    led = manifest["privacy"]["ledger"]
    for st in ("group_counts", "count_of_counts", "state_synthesis", "puma_synthesis"):
        assert 0 < led["stages"][st]["spent_float"] <= led["stages"][st]["allocated_float"], st
    assert manifest["config"]["privacy_unit"] == "person"
    meas = pq.read_table(rel / "measurements.parquet").to_pandas()
    assert "discrete_laplace" in set(meas.mechanism) and "discrete_gaussian" in set(meas.mechanism)
    selections = meas[meas.mechanism == "exponential_mechanism"]
    # adaptive rounds at the state level only: a PUMA's noise drowns what they would find
    assert set(selections.level) == {"state"} and len(selections) == 2 * meas.node[meas.level == "state"].nunique()
    assert not any(";first=" in w for w in manifest["workload"]["state"] + manifest["workload"]["puma"])
    # an error estimate beside every workload a node's fit used, the adaptively chosen ones included
    iv = pq.read_table(rel / "intervals.parquet").to_pandas()
    marg = iv[iv.table == "marginal"]
    for level, stage in (("state", "state_synthesis"), ("puma", "puma_synthesis")):
        used = meas[(meas.stage == stage) & (meas.mechanism != "exponential_mechanism")]
        at_level = marg[marg.level == level]
        # beside them, a PUMA's size marginal (fitted from its count-of-counts histogram, measured or not)
        size = {(n, "group:NP|") for n in at_level.node}
        assert set(zip(used.node, used.workload_id)) - size == set(zip(at_level.node, at_level.marginal)) - size
        assert level == "state" or size <= set(zip(at_level.node, at_level.marginal))
        assert level == "puma" or len(set(used.workload_id)) > len(manifest["workload"][level])  # the rounds' workloads are among them
    from tasks.publish import read_release, sha256_file

    households, persons = read_release(rel)
    assert households.num_rows > 0 and persons.num_rows >= households.num_rows
    # weights.totals: a calibrated WEIGHT, the totals file a public input, the dictionary says so
    hh, pp = households.to_pandas(), persons.to_pandas()
    assert hh.groupby("PUMA").WEIGHT.sum().to_dict() == pytest.approx({"00100": 61000, "00200": 64500, "00300": 66000, "00400": 70500}, rel=1e-7)
    assert (pp.groupby("SERIALNO").WEIGHT.first().reindex(hh.SERIALNO).to_numpy() == hh.WEIGHT.to_numpy()).all()  # a person carries their household's
    assert {"role": "public", "use": "weight totals", "file": "vt_totals.csv", "path": str(totals),
            "sha256": sha256_file(totals)} in manifest["inputs"] and manifest["weights"]["weighted"]
    assert json.loads((rel / "domain.json").read_text())["dictionary"]["weights"].startswith("The microdata are a synthetic sample; WEIGHT")
    assert main(["audit", "verify", str(rel)]) == 0


def test_the_hgem_synthesizer_runs_end_to_end(tmp_path, data_root):
    """``synthesizer: hgem`` (tiny model settings) through the whole release: the gate's checks
    hold (one householder per household among them), the ledger spends within the plan and the
    audit verifies."""
    from flows.cli import main

    cfg = small_config(
        tmp_path, data_root, synthesizer="hgem",
        advanced={"hgem": {"rounds": 1, "batch_size": 16, "z_dim": 4, "hidden": [16], "max_update_steps": 5, "initial_update_steps": 5,
                           "pretrain_steps": 5, "kway_per_group_count": 1, "support_per_household": 1},
                  "allocation": None},  # H-GEM's default allocation
    )
    assert main(["run", str(cfg)]) == 0
    rel = tmp_path / "releases" / "e2e"
    manifest = json.loads((rel / "manifest.json").read_text())
    assert manifest["synthesizer"]["name"] == "hgem"
    gate = json.loads((rel / "validation" / "gx_release.json").read_text())
    assert gate["success"] is True and set(gate["checkpoints"]) == {"households", "persons"}  # no count_of_counts stage
    led = manifest["privacy"]["ledger"]
    for st in ("hgem", "puma_synthesis", "group_counts"):
        assert 0 < led["stages"][st]["spent_float"] <= led["stages"][st]["allocated_float"], st
    assert Fraction(led["total"]["spent"]) <= Fraction(led["total"]["allocated"])
    from tasks.publish import read_release

    households, persons = read_release(rel)
    pp = persons.to_pandas()
    relp = json.loads((rel / "domain.json").read_text())["person"]
    householder = next(a["codes"][a["labels"].index("Householder")] for a in relp if a["name"] == "RELP_GROUP")
    heads = pp[pp.RELP_GROUP == householder]
    assert heads.SERIALNO.is_unique and set(heads.SERIALNO) == set(households.column("SERIALNO").to_pylist())
    assert (heads.SPORDER == 1).all()
    assert main(["audit", "verify", str(rel)]) == 0
