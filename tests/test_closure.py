"""The closure test: a release is a function of (config, public inputs, sampling seed,
stored noisy measurements) alone.

A run on a small private input is replayed with the private input replaced by a neighbour —
without the only household of one PUMA, its households in shuffled order — reusing the first run's
ledger and measurement store. Every release file must be byte-identical, and the manifest and the
audit log equal once what names the run is set aside (:func:`release_fingerprint`): the PUMA left without private
households is still a node (the geography is declared, not read off the rows), released from the
same noisy measurements. Two negative controls: with the ``puma_household_counts`` invariant
declared, the exact PUMA counts leak into the release and the replay without the household
differs; with the nodes read off the private rows again, the replay loses the PUMA and differs.

Under the person unit a replay on an input with one housing unit without its householder and
another with a second one is byte-identical too.

Starts Prefect and a local Dask cluster seven times on ~1,000 households: marked ``flow``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from engine.data._geography import node_key
from tests.conftest import ACS2018

pytestmark = pytest.mark.flow

N_PRIVATE = 1000  # households of Vermont kept as the private input
N_PUBLIC = 2500  # households of New Hampshire kept as the public input
# what names a run rather than depends on its data: the release's name and time, where its files are
# (the config's paths and name), and the private input's own identity (its file name and keyed hash,
# a function of the file under the agency's secret key)
RUN_NAMES = ("release", "published_at")
CONFIG_PATHS = ("name", "output_dir", "work_dir", "private")
PRIVATE_IDENTITY = ("file", "hmac_sha256", "hmac_key_id", "housing")
AUDIT_RUN_FIELDS = ("seq", "time", "prev", "hash", "release", "config_sha256", "manifest_sha256")


def _household_blocks(zip_path: Path, member: str, n: int) -> tuple[str, list[list[str]]]:
    """The header and the first ``n`` housing-unit households (their person lines) of a PUMS file."""
    with zipfile.ZipFile(zip_path) as z:
        lines = z.open(member).read().decode().splitlines()
    header, blocks, index = lines[0], [], {}
    for line in lines[1:]:
        serial = line.split(",")[1]
        if "HU" not in serial:
            continue
        if serial not in index:
            if len(blocks) == n:
                continue
            index[serial] = len(blocks)
            blocks.append([])
        blocks[index[serial]].append(line)
    return header, blocks


def _write(path: Path, header: str, blocks: list[list[str]]) -> str:
    path.write_text("\n".join([header, *(line for b in blocks for line in b)]) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_root) -> dict[str, str]:
    d = tmp_path_factory.mktemp("closure-inputs")
    header, blocks = _household_blocks(ACS2018 / "csv_pvt.zip", "psam_p50.csv", N_PRIVATE)
    puma = header.split(",").index("PUMA")
    pumas = [b[0].split(",")[puma] for b in blocks]
    # one PUMA (the smallest here) keeps a single household, with several persons; the neighbour removes it
    lonely = min(sorted(set(pumas)), key=pumas.count)
    only = next(i for i, b in enumerate(blocks) if pumas[i] == lonely and len(b) > 1)
    blocks = [b for i, b in enumerate(blocks) if pumas[i] != lonely or i == only]
    neighbour = [b for b in blocks if b[0].split(",")[puma] != lonely]
    order = np.random.default_rng(7).permutation(len(neighbour))
    pub_header, pub_blocks = _household_blocks(ACS2018 / "csv_pnh.zip", "psam_p33.csv", N_PUBLIC)
    return {
        "original": _write(d / "private.csv", header, blocks),
        # the neighbour, its households also shuffled: one replay checks both (the release must not
        # depend on the input's order either)
        "removed": _write(d / "private_minus_one.csv", header, [neighbour[i] for i in order]),
        "public": _write(d / "public.csv", pub_header, pub_blocks),
        "lonely": node_key((50, int(lonely))),
        # person unit: one housing unit without its householder, another with a second one (each
        # left out at ingestion, so the release must not see them)
        "householders": _write(d / "private_householders.csv", header, _householder_neighbour(header, blocks)),
    }


def _householder_neighbour(header: str, blocks: list[list[str]]) -> list[list[str]]:
    """``blocks`` with the householder (RELP 00) of the first multi-person household removed and a
    second householder (a copy of the next one's, with a new person number) added to the next."""
    cols = header.split(",")
    relp, sporder = cols.index("RELP"), cols.index("SPORDER")
    multi = [i for i, b in enumerate(blocks) if len(b) > 1]
    out = [list(b) for b in blocks]
    a, b = multi[0], multi[1]
    out[a] = [line for line in out[a] if line.split(",")[relp] != "00"]
    head = next(line.split(",") for line in out[b] if line.split(",")[relp] == "00")
    head[sporder] = f"{len(out[b]) + 1:02d}"
    out[b].append(",".join(head))
    assert len(out[a]) == len(blocks[a]) - 1 and len(out[b]) == len(blocks[b]) + 1
    return out


def _config(tmp: Path, name: str, private: str, public: str, **over) -> Path:
    cfg = {
        "name": name,
        "private": [{"path": private}],
        "public": [{"path": public}],
        "budget": {"epsilon": 1.0, "delta": 1e-10},
        "advanced": {"allocation": {  # one public state: the synthesis shares given, not simulated
            "stages": {"count_of_counts": 0.2, "state_synthesis": 0.4, "puma_synthesis": 0.4}, "synthesis_split": "fixed",
            "levels": {"count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5}, "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}},
        }},
        "sampling_seed": 20181,
        "output_dir": str(tmp / "releases"),
        "work_dir": str(tmp / "work"),
        **over,
    }
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _run(cfg: Path) -> None:
    from flows.cli import main

    assert main(["run", str(cfg)]) == 0


def _replay(tmp: Path, source: str, name: str, private: str, public: str, **over) -> Path:
    """Run ``name`` on ``private`` with the ledger and the measurements of run ``source``."""
    src, dst = tmp / "work" / source, tmp / "work" / name
    dst.mkdir(parents=True, mode=0o700)
    shutil.copy2(src / "ledger.jsonl", dst / "ledger.jsonl")
    shutil.copytree(src / "measurements", dst / "measurements")
    _run(_config(tmp, name, private, public, **over))
    return tmp / "releases" / name


def normalised_manifest(manifest: dict) -> dict:
    """The manifest without what names the run (:data:`RUN_NAMES`, :data:`CONFIG_PATHS`, the
    private inputs' :data:`PRIVATE_IDENTITY`): everything else — the config's settings, the public
    inputs' hashes, the private inputs' roles and layouts, every output's hash — must not depend on
    which neighbouring private input the run read."""
    out = {k: v for k, v in manifest.items() if k not in RUN_NAMES}
    out["config"] = {k: v for k, v in manifest["config"].items() if k not in CONFIG_PATHS}
    out["inputs"] = [i if i["role"] == "public" else {k: v for k, v in i.items() if k not in PRIVATE_IDENTITY}
                     for i in manifest["inputs"]]
    return out


def normalised_audit(path: Path) -> dict[str, list]:
    """The audit log's events without their chain, times and the run's names (:data:`AUDIT_RUN_FIELDS`):
    the run's events in order, and its charges as a sorted list (a replay finds every charge in the
    ledger it was given and copies them all at its first stage's end, where the first run copied
    each stage's at its end)."""
    events = [{k: v for k, v in json.loads(line).items() if k not in AUDIT_RUN_FIELDS} for line in path.read_text().splitlines() if line.strip()]
    charges = sorted((e for e in events if e["event"] == "charge"), key=lambda e: json.dumps(e, sort_keys=True))
    return {"events": [e for e in events if e["event"] != "charge"], "charges": charges}


def release_fingerprint(release: Path) -> dict[str, str]:
    """SHA-256 of every release file; the manifest and the audit log normalised
    (:func:`normalised_manifest`, :func:`normalised_audit`)."""
    out = {p.relative_to(release).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(release.rglob("*")) if p.is_file() and p.name not in ("manifest.json", "audit.jsonl")}
    manifest = normalised_manifest(json.loads((release / "manifest.json").read_text()))
    out["manifest.json (normalised)"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    out["audit.jsonl (normalised)"] = hashlib.sha256(json.dumps(normalised_audit(release / "audit.jsonl"), sort_keys=True).encode()).hexdigest()
    return out


def _differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, inputs, _shared_prefect_server_is_up, _session_dask_cluster):
    """The first run (a module fixture runs before the tests' own fixtures: it asks for the
    session's Prefect server and Dask cluster itself)."""
    tmp = tmp_path_factory.mktemp("closure")
    _run(_config(tmp, "a", inputs["original"], inputs["public"]))
    return tmp


def test_replay_on_the_neighbour_without_a_pumas_only_household_is_byte_identical(first_run, inputs):
    tmp = first_run
    reference = release_fingerprint(tmp / "releases" / "a")
    assert any(k.startswith("households/") for k in reference) and "count_of_counts.parquet" in reference
    assert "measurements.parquet" in reference
    assert inputs["lonely"] in _coc_nodes(tmp / "releases" / "a")
    replay = _replay(tmp, "a", "a-removed", inputs["removed"], inputs["public"])
    assert _differences(reference, release_fingerprint(replay)) == []
    # negative controls of the manifest's and the audit log's comparison: an exact count of the
    # private input, or its plain hash, put into either makes the replay differ
    for leak in ("manifest", "audit"):
        leaked = tmp / f"leaked-{leak}"
        shutil.copytree(replay, leaked)
        if leak == "manifest":
            m = json.loads((leaked / "manifest.json").read_text())
            next(i for i in m["inputs"] if i["role"] == "private")["sha256"] = hashlib.sha256(Path(inputs["removed"]).read_bytes()).hexdigest()
            (leaked / "manifest.json").write_text(json.dumps(m))
        else:
            with (leaked / "audit.jsonl").open("a") as f:
                f.write(json.dumps({"event": "ingest", "households": N_PRIVATE - 1}) + "\n")
        assert _differences(reference, release_fingerprint(leaked)) in (["manifest.json (normalised)"], ["audit.jsonl (normalised)"])
    # nothing was measured again: the replay charged exactly what the first run charged
    ledgers = [(tmp / "work" / n / "ledger.jsonl").read_text() for n in ("a", "a-removed")]
    assert ledgers[0] == ledgers[1]


@pytest.fixture(scope="module")
def person_run(tmp_path_factory, inputs, _shared_prefect_server_is_up, _session_dask_cluster):
    tmp = tmp_path_factory.mktemp("closure-person")
    _run(_config(tmp, "p", inputs["original"], inputs["public"], privacy_unit="person"))
    return tmp


def test_person_unit_replay_without_a_householder_and_with_a_second_one_is_byte_identical(person_run, inputs):
    """Under the person unit a householder is protected like every person: removing one, or adding
    a second one, changes what ingestion keeps, never the release beyond its measurements."""
    tmp = person_run
    reference = release_fingerprint(tmp / "releases" / "p")
    replay = _replay(tmp, "p", "p-householders", inputs["householders"], inputs["public"], privacy_unit="person")
    assert _differences(reference, release_fingerprint(replay)) == []


def _coc_nodes(release: Path) -> set[str]:
    return set(pq.read_table(release / "count_of_counts.parquet", columns=["node"]).column("node").to_pylist())


def test_negative_control_an_invariant_breaks_closure(first_run, inputs):
    """With exact PUMA household counts declared invariant, the same replay differs: the test
    above would catch an exact count reaching the release."""
    tmp = first_run
    inv = {"invariants": ["puma_household_counts"]}
    with_all = release_fingerprint(_replay(tmp, "a", "inv-original", inputs["original"], inputs["public"], **inv))
    without_one = release_fingerprint(_replay(tmp, "a", "inv-removed", inputs["removed"], inputs["public"], **inv))
    diff = _differences(with_all, without_one)
    assert "count_of_counts.parquet" in diff and any(k.startswith("households/") for k in diff)


def test_negative_control_nodes_read_off_the_private_rows_break_closure(first_run, inputs, monkeypatch):
    """With the release's nodes read off the private rows again (what the run did before its
    geography was declared), the replay on the neighbour loses the PUMA whose only household it
    removed: the test above would catch the node set leaking."""
    import dask
    from distributed import LocalCluster

    from engine.data import Geography, HierarchicalData

    def nodes_of_the_rows(cfg, private_npz):
        geo = HierarchicalData.from_npz(private_npz).geo[:, :2]
        return Geography(tuple(int(x) for x in row) for row in np.unique(geo, axis=0))

    monkeypatch.setattr("flows.release.release_geography", nodes_of_the_rows)  # the flow's, in this process
    tmp = first_run
    # a cluster of threads in this process (quicker to start than the run's own)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            dask.config.set({"scheduler-address": cluster.scheduler_address}):
        replay = _replay(tmp, "a", "leak-removed", inputs["removed"], inputs["public"])
    assert "count_of_counts.parquet" in _differences(release_fingerprint(tmp / "releases" / "a"), release_fingerprint(replay))
    assert inputs["lonely"] not in _coc_nodes(replay)


def test_the_engine_api_on_the_runs_stored_measurements_draws_the_flows_microdata(first_run, tmp_path):
    """One composition: :func:`engine.synthesize_state`, given what the flow's tasks were given — the
    run's synthesis settings, plan, sampling seed, household counts (the count-of-counts stage's) and
    a copy of its ledger and stored measurements — draws byte for byte the households and persons
    the flow drew; nothing is charged again. The negative control: another sampling seed differs."""
    import engine as dp
    from flows.release import node_counts
    from schemas.release_config import load_config
    from tasks.context import budget_plan
    from tasks.ingest import release_geography

    work = first_run / "work" / "a"
    cfg = load_config(first_run / "a.yaml")
    private_npz, public_npz = work / "inputs" / "private-merged.npz", work / "inputs" / "public-merged.npz"
    public = dp.HierarchicalData.from_npz(public_npz)
    split = work / "synthesis_split.json"
    if split.exists():  # the plan the run spent: its public simulation's split, when it ran one
        cfg = cfg.with_allocation(cfg.allocation.with_state_fraction(Fraction(json.loads(split.read_text())["state_fraction"])))
    shutil.copy2(work / "ledger.jsonl", tmp_path / "ledger.jsonl")
    shutil.copytree(work / "measurements", tmp_path / "measurements")
    ledger = dp.PrivacyLedger(tmp_path / "ledger.jsonl", budget_plan(cfg))
    charges = len(ledger.charges())
    session = dp.PrivateSession(dp.HierarchicalData.from_npz(private_npz), cfg.privacy_unit, ledger,
                                dp.MeasurementStore(tmp_path / "measurements"), geography=release_geography(cfg, str(private_npz)))
    counts_path = str(work / "nodes" / "count_of_counts" / "hierarchy.npz")
    counts = {**node_counts(counts_path, "state"), **node_counts(counts_path, "puma")}  # what the flow's tasks were given
    settings = cfg.synthesis_settings(public.domain)

    def engine_release(seed: int) -> dp.HierarchicalData:
        return dp.synthesize_state(session, 50, public, settings, seed=seed, counts=counts, sizes_measured=True).data

    flow = dp.HierarchicalData.concat([dp.HierarchicalData.from_npz(p) for p in sorted((work / "nodes" / "synthesis").glob("*.npz"))])
    engine = engine_release(cfg.sampling_seed)
    assert engine.n_households == flow.n_households > 0
    for name in ("group", "person", "geo", "person_household"):
        assert np.array_equal(getattr(engine, name), getattr(flow, name)), name
    assert len(ledger.charges()) == charges  # every measurement read back, none made anew
    assert not np.array_equal(engine_release(cfg.sampling_seed + 1).group, flow.group)
