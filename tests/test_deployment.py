"""Deployment of the release flow: deploy/prefect.yaml on a local Prefect server and a process worker,
the Python helpers of flows/deployment.py, and the Dask cluster specs of deploy/dask/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows import deployment as dep
from flows.local_api import free_port, wait_for_api
from tests.conftest import start_prefect_server
from tests.test_release_flow import small_config

REPO = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).parent / "prefect")


# -- deploy/prefect.yaml and the helpers agree ------------------------------------------------------
def test_prefect_yaml_declares_the_annual_process_deployment():
    doc = yaml.safe_load(dep.PREFECT_FILE.read_text())
    (d,) = doc["deployments"]
    assert d["name"] == dep.DEPLOYMENT_NAME and d["entrypoint"] == dep.ENTRYPOINT
    assert d["work_pool"]["name"] == dep.WORK_POOL
    (sched,) = d["schedules"]
    assert (sched["cron"], sched["timezone"]) == (dep.ANNUAL_CRON, dep.TIMEZONE)
    assert d["parameters"] == dep.release_parameters()
    assert (REPO / d["parameters"]["config_path"]).exists()
    (pull,) = doc["pull"]
    assert "prefect.deployments.steps.set_working_directory" in pull
    assert not any("docker" in json.dumps(doc.get(k)) for k in ("build", "push", "pull"))


def test_served_deployment_has_the_annual_schedule():
    d = dep.release_deployment(config_path="deploy/releases/acs2018_default.yaml", dask_address="tcp://h:8786")
    (s,) = d.schedules
    assert s.schedule.cron == dep.ANNUAL_CRON and s.schedule.timezone == dep.TIMEZONE
    assert d.parameters == {"config_path": "deploy/releases/acs2018_default.yaml", "dask_address": "tcp://h:8786", "name": dep.RUN_NAME_TEMPLATE}
    assert d.concurrency_limit == 1  # one run at a time, as the work-pool deployments
    assert dep.release_deployment(cron=None).schedules in (None, [])


# -- Dask cluster specs ------------------------------------------------------------------------------
def test_dask_specs():
    local = dep.load_dask_spec(REPO / "deploy/dask/local.yaml")
    assert local.cluster == "local" and dep.dask_address(local) is None
    remote = dep.load_dask_spec("remote")
    assert dep.dask_address(remote) == "tcp://dask-scheduler.example.org:8786"
    gpu = dep.load_dask_spec("gpu")
    cmds = dep.dask_worker_commands(gpu)
    assert cmds[0] == "dask scheduler --host dask-scheduler.example.org --port 8786"
    gpu_lines = [c for c in cmds if "--resources" in c]
    assert gpu_lines == ["MALLOC_MMAP_THRESHOLD_=4194304 dask worker tcp://dask-scheduler.example.org:8786 --name gpu --nworkers 1 --nthreads 1 --resources GPU=1"]
    assert any("--name cpu" in c and "--resources" not in c for c in cmds)
    assert dep.dask_worker_commands(local) == []


def test_bad_dask_spec_is_refused(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("cluster: remote\n")
    with pytest.raises(ValueError, match="scheduler address"):
        dep.load_dask_spec(p)


# -- end to end: local Prefect server, prefect deploy, process worker ------------------------------
def _stop(proc: subprocess.Popen | None) -> None:
    """Stop a process started in its own session, with everything it started (flow run, Dask)."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


@pytest.mark.flow
def test_prefect_yaml_deployment_runs_on_a_process_worker(tmp_path, data_root, _session_dask_cluster):
    """The documented commands deploy the flow; a process worker runs it — on an existing Dask
    cluster (the test session's, passed as the run's ``dask_address``: the tasks are unpickled by
    a scheduler that never loaded the flow's file, which a file-path entrypoint broke), or on its
    own LocalCluster when the session has none (``DPRELEASE_TEST_SHARED_DASK=0``)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    t0 = time.monotonic()
    cfg = small_config(tmp_path, data_root, name="deployed")
    # the test session's Prefect server when there is one (tests/conftest.py), else one of its own
    shared = os.environ.get("DPRELEASE_TEST_PREFECT_SERVER")
    port = None if shared else free_port()
    api = shared or f"http://127.0.0.1:{port}/api"
    home = tmp_path / "prefect-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "DASK_SCHEDULER_ADDRESS"}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=api,
        DO_NOT_TRACK="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",
    )
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    server = worker = None

    def cli(*args, timeout=60):
        r = subprocess.run([PREFECT, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"prefect {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r.stdout

    try:
        if port is not None:
            server = start_prefect_server(port, env, server_log, cwd=tmp_path)
            why = wait_for_api(api, server, 60)
            assert why is None, f"prefect server {why}:\n{_tail(server_log)}"

        # the documented commands (docs/deployment.md), from the repository root
        cli("work-pool", "create", dep.WORK_POOL, "--type", "process")
        cli("--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--name", dep.DEPLOYMENT_NAME)

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            d = client.read_deployment_by_name(f"{dep.FLOW_NAME}/{dep.DEPLOYMENT_NAME}")
            assert d.work_pool_name == dep.WORK_POOL and d.entrypoint == dep.ENTRYPOINT
            assert [(s.schedule.cron, s.schedule.timezone) for s in d.schedules] == [(dep.ANNUAL_CRON, dep.TIMEZONE)]
            assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
            assert d.parameters["config_path"] == dep.DEFAULT_CONFIG
            assert client.read_work_pool(dep.WORK_POOL).type == "process"
            assert d.parameters["name"] == dep.RUN_NAME_TEMPLATE and d.global_concurrency_limit.limit == 1
            # fired twice with the deployment's release name: each run publishes a release of its own
            runs = [client.create_flow_run_from_deployment(d.id, parameters={"config_path": str(cfg), "dask_address": _session_dask_cluster})
                    for _ in range(2)]

        # a process worker polling once, twice (the deployment's concurrency limit holds the second
        # run until the first ends); each waits for the run it picked up to finish. The wait is a
        # hang guard, not a timing check: a run takes 40-100 s alone and longer beside the other
        # parallel test workers (make test), so the test as a whole gets up to 8 minutes.
        for _ in runs:
            with worker_log.open("a") as log:
                worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", dep.WORK_POOL, "--run-once"], cwd=tmp_path, env=env,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                worker.wait(timeout=max(60.0, 480 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the worker did not finish the run in time:\n{_tail(worker_log)}")

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            flow_runs = [client.read_flow_run(r.id) for r in runs]
        for fr in flow_runs:
            assert fr.state is not None and fr.state.is_completed(), f"flow run ended {fr.state}:\n{_tail(worker_log)}"
        names = sorted(p.name for p in (tmp_path / "releases").iterdir())
        date = flow_runs[0].expected_start_time.strftime("%Y-%m-%d")
        assert names == sorted(f"deployed-{date}-{str(fr.id)[:8]}" for fr in flow_runs)
        for name in names:
            assert json.loads((tmp_path / "releases" / name / "manifest.json").read_text())["release"] == name
    finally:
        _stop(worker)
        _stop(server)
