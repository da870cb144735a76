"""The closure test: a release is a function of (config, public inputs, sampling seed,
stored noisy measurements) alone.

A run on a small private input is replayed with the private input replaced by a neighbour —
without the only household of one PUMA, its households in shuffled order — reusing the first run's
ledger and measurement store. Every release file must be byte-identical (the manifest compared
without the fields that name the release, its time and its inputs): the PUMA left without private
households is still a node (the geography is declared, not read off the rows), released from the
same noisy measurements. Two negative controls: with the ``puma_household_counts`` invariant
declared, the exact PUMA counts leak into the release and the replay without the household
differs; with the nodes read off the private rows again, the replay loses the PUMA and differs.

Starts Prefect and a local Dask cluster five times on ~1,000 households: marked ``flow``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from engine.geography import node_key
from tests.conftest import ACS2018

pytestmark = pytest.mark.flow

N_PRIVATE = 1000  # households of Vermont kept as the private input
N_PUBLIC = 2500  # households of New Hampshire kept as the public input
VOLATILE_MANIFEST_FIELDS = ("release", "published_at", "inputs", "config")


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
    }


def _config(tmp: Path, name: str, private: str, public: str, **over) -> Path:
    cfg = {
        "name": name,
        "private": [{"path": private}],
        "public": [{"path": public}],
        "budget": {"epsilon": 1.0, "delta": 1e-10},
        "allocation": {
            "stages": {"count_of_counts": 0.2, "state_synthesis": 0.4, "puma_synthesis": 0.4},
            "levels": {"count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5}, "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}},
        },
        "synthesizer": "prior_update",
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


def release_fingerprint(release: Path) -> dict[str, str]:
    """SHA-256 of every release file, and of the manifest without its volatile fields (the audit
    log records times and input identities only, and is left out)."""
    out = {p.relative_to(release).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(release.rglob("*")) if p.is_file() and p.name not in ("manifest.json", "audit.jsonl")}
    manifest = json.loads((release / "manifest.json").read_text())
    core = {k: v for k, v in manifest.items() if k not in VOLATILE_MANIFEST_FIELDS}
    out["manifest.json (without release, published_at, inputs, config)"] = hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()
    return out


def _differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, inputs):
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
    # nothing was measured again: the replay charged exactly what the first run charged
    ledgers = [(tmp / "work" / n / "ledger.jsonl").read_text() for n in ("a", "a-removed")]
    assert ledgers[0] == ledgers[1]


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
    """With the geography read off the private rows again (what the session did before it was
    declared), the replay on the neighbour loses the PUMA whose only household it removed: the
    test above would catch the node set leaking."""
    import dask
    from distributed import LocalCluster

    from engine.privacy.session import PrivateSession

    def nodes_of_the_rows(self, level):
        k = {"state": 1, "puma": 2}[level]
        return [tuple(int(x) for x in row) for row in np.unique(self._PrivateSession__data.geo[:, :k], axis=0)]

    monkeypatch.setattr(PrivateSession, "nodes", nodes_of_the_rows)
    tmp = first_run
    # the tasks run on a cluster of threads in this process, so that they see the patch
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            dask.config.set({"scheduler-address": cluster.scheduler_address}):
        replay = _replay(tmp, "a", "leak-removed", inputs["removed"], inputs["public"])
    assert "count_of_counts.parquet" in _differences(release_fingerprint(tmp / "releases" / "a"), release_fingerprint(replay))
    assert inputs["lonely"] not in _coc_nodes(replay)
