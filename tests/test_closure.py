"""The closure test (issue 14): a release is a function of (config, public inputs, sampling seed,
stored noisy measurements) alone.

A run on a small private input is replayed with the private input replaced by a different dataset
on the same geography — one household removed, and the same households in shuffled order —
reusing the first run's ledger and measurement store. Every release file must be byte-identical
(the manifest compared without the fields that name the release, its time and its inputs). The
negative control declares the ``puma_household_counts`` invariant: then the exact PUMA counts leak
into the release, and the replay without one household differs.

Starts Prefect and a local Dask cluster five times on ~1,000 households: marked ``flow``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

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
    # remove one multi-person household from a PUMA that keeps others (the geography is unchanged)
    drop = next(i for i, b in enumerate(blocks) if len(b) > 1 and pumas.count(pumas[i]) > 1)
    order = np.random.default_rng(7).permutation(len(blocks))
    pub_header, pub_blocks = _household_blocks(ACS2018 / "csv_pnh.zip", "psam_p33.csv", N_PUBLIC)
    return {
        "original": _write(d / "private.csv", header, blocks),
        "removed": _write(d / "private_minus_one.csv", header, blocks[:drop] + blocks[drop + 1 :]),
        "shuffled": _write(d / "private_shuffled.csv", header, [blocks[i] for i in order]),
        "public": _write(d / "public.csv", pub_header, pub_blocks),
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


def test_replay_on_neighbouring_and_shuffled_data_is_byte_identical(first_run, inputs):
    tmp = first_run
    reference = release_fingerprint(tmp / "releases" / "a")
    assert any(k.startswith("households/") for k in reference) and "count_of_counts.parquet" in reference
    assert "measurements.parquet" in reference
    for variant in ("removed", "shuffled"):
        replay = _replay(tmp, "a", f"a-{variant}", inputs[variant], inputs["public"])
        assert _differences(reference, release_fingerprint(replay)) == [], variant
    # nothing was measured again: the replays charged exactly what the first run charged
    ledgers = [(tmp / "work" / n / "ledger.jsonl").read_text() for n in ("a", "a-removed", "a-shuffled")]
    assert ledgers[0] == ledgers[1] == ledgers[2]


def test_negative_control_an_invariant_breaks_closure(first_run, inputs):
    """With exact PUMA household counts declared invariant, the same replay differs: the test
    above would catch an exact count reaching the release."""
    tmp = first_run
    inv = {"invariants": ["puma_household_counts"]}
    with_all = release_fingerprint(_replay(tmp, "a", "inv-original", inputs["original"], inputs["public"], **inv))
    without_one = release_fingerprint(_replay(tmp, "a", "inv-removed", inputs["removed"], inputs["public"], **inv))
    diff = _differences(with_all, without_one)
    assert "count_of_counts.parquet" in diff and any(k.startswith("households/") for k in diff)
