"""A real Dask cluster: a scheduler and two `dask worker` processes started from
another working directory and with another environment than the client, as on other machines.
A small release runs through `--dask-address` and has the structure of a LocalCluster run; a
second run loses a worker mid-stage and still completes, with no measurement charged twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from tests.test_release_flow import small_config

pytestmark = pytest.mark.flow

DASK = str(Path(sys.executable).with_name("dask"))


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.file = tmp / "scheduler.json"
        elsewhere = tmp / "elsewhere"
        elsewhere.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE", "PREFECT"))}
        env["HOME"] = str(elsewhere)
        self.scheduler = subprocess.Popen([DASK, "scheduler", "--scheduler-file", str(self.file), "--port", "0",
                                           "--dashboard-address", ":0"], cwd=elsewhere, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            if self.file.exists() and self.file.stat().st_size:
                break
            time.sleep(0.1)
        self.address = json.loads(self.file.read_text())["address"]
        self.workers = [subprocess.Popen([DASK, "worker", "--scheduler-file", str(self.file), "--nthreads", "1",
                                          "--no-dashboard", "--local-directory", str(elsewhere / f"w{i}")],
                                         cwd=elsewhere, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for i in range(2)]
        from distributed import Client

        with Client(self.address, timeout=60) as c:
            c.wait_for_workers(2, timeout=120)

    def close(self):
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def structure(release: Path) -> dict:
    manifest = json.loads((release / "manifest.json").read_text())
    files = sorted(str(p.relative_to(release)) for p in release.rglob("*") if p.is_file())
    return {"files": files, "stages": manifest["stages"], "outputs": sorted(manifest["outputs"]),
            "workload": manifest["workload"], "plan": manifest["privacy"]["ledger"]["total"]["allocated"]}


def test_a_release_on_an_external_cluster_has_the_structure_of_a_local_one(tmp_path, data_root, cluster, monkeypatch, own_local_cluster):
    from flows.cli import main

    local_dir, remote_dir = tmp_path / "local", tmp_path / "remote"
    local_dir.mkdir()
    remote_dir.mkdir()
    assert main(["run", str(small_config(local_dir, data_root))]) == 0
    monkeypatch.chdir(remote_dir)  # the client runs from yet another directory
    assert main(["run", str(small_config(remote_dir, data_root)), "--dask-address", cluster.address]) == 0
    local, remote = structure(local_dir / "releases" / "e2e"), structure(remote_dir / "releases" / "e2e")
    assert remote == local
    assert main(["audit", "verify", str(remote_dir / "releases" / "e2e")]) == 0


def test_a_lost_worker_does_not_stop_the_run_nor_charge_twice(tmp_path, data_root, cluster):
    from engine.privacy._budget import BudgetPlan
    from engine.privacy._ledger import PrivacyLedger
    from engine.privacy._measurements import MeasurementStore

    cfg = small_config(tmp_path, data_root)
    run = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(cfg), "--dask-address", cluster.address],
                           cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    nodes = tmp_path / "work" / "e2e" / "nodes"
    deadline = time.time() + 300
    while time.time() < deadline and run.poll() is None:
        if (nodes / "state_posterior").exists() and any((nodes / "state_posterior").glob("*.npz")):
            break
        time.sleep(0.2)
    assert run.poll() is None, run.stdout.read()
    cluster.workers[0].send_signal(signal.SIGKILL)  # mid-run: a worker vanishes with its tasks
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out[-3000:]
    work = tmp_path / "work" / "e2e"
    ledger_path = next(work.glob("**/ledger.jsonl"))
    plan = BudgetPlan.from_dict(json.loads(ledger_path.read_text().splitlines()[0])["plan"])
    charges = PrivacyLedger(ledger_path, plan).charges()
    keys = [c.key for c in charges]
    assert len(keys) == len(set(keys))  # one charge per measurement, however often a task ran
    assert sorted(keys) == sorted(MeasurementStore(work / "measurements").keys())
    assert sum((c.rho for c in charges), Fraction(0)) > 0
    manifest = json.loads((tmp_path / "releases" / "e2e" / "manifest.json").read_text())
    assert Fraction(manifest["privacy"]["ledger"]["total"]["spent"]) <= Fraction(manifest["privacy"]["ledger"]["total"]["allocated"])
