"""Shared test set-up: Prefect offline in a temporary home, real data location."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Prefect settings must be in place before prefect is imported anywhere. Under pytest-xdist each
# worker process gets its own Prefect home below the run's (its local storage, and its own SQLite
# database should it start a temporary server: two servers never share one database).
_prefect_home = os.environ.get("PREFECT_HOME") or tempfile.mkdtemp(prefix="dprelease-prefect-")
if os.environ.get("PYTEST_XDIST_WORKER"):
    _prefect_home = os.path.join(_prefect_home, os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(_prefect_home, exist_ok=True)
os.environ["PREFECT_HOME"] = _prefect_home
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402

from flows.local_api import free_port, wait_for_api  # noqa: E402

# One Prefect server for the whole test session (the suite's time on 2 cores). Without it every
# process that runs a flow — each pytest worker and each ``dprelease run`` subprocess a test starts —
# starts its own temporary server (most of its start is the server's imports and database
# migrations). The main pytest process starts ``prefect server start`` in the background
# before the workers are spawned, so they inherit ``PREFECT_API_URL``; a process waits for the
# server's health check once, before its first test marked ``flow`` (the tests that run flows).
# ``DPRELEASE_TEST_SHARED_PREFECT=0`` (or a ``PREFECT_API_URL`` already set) keeps the previous
# behaviour. ``flows.release``'s own temporary server is still exercised: the resume test's first
# run drops ``PREFECT_API_URL``.
_SHARED_SERVER_ENV = "DPRELEASE_TEST_PREFECT_SERVER"  # set to the API URL of the server this session started
# set to that server's Prefect home (its database's folder; an xdist worker's own home lies below it)
SHARED_SERVER_HOME_ENV = "DPRELEASE_TEST_PREFECT_SERVER_HOME"
_server: subprocess.Popen | None = None


def start_prefect_server(port: int, env: dict[str, str], log_path: str | Path, cwd: str | Path | None = None) -> subprocess.Popen:
    """``prefect server start`` on 127.0.0.1:``port`` in its own session, its output in ``log_path``."""
    prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
    with open(log_path, "w") as log:
        return subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], cwd=cwd, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def pytest_configure(config):
    global _server
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("PREFECT_API_URL") or os.environ.get("DPRELEASE_TEST_SHARED_PREFECT") == "0":
        return
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_UI_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    _server = start_prefect_server(port, env, os.path.join(_prefect_home, "shared-server.log"))
    os.environ["PREFECT_API_URL"] = api
    os.environ[_SHARED_SERVER_ENV] = api
    os.environ[SHARED_SERVER_HOME_ENV] = _prefect_home


def pytest_unconfigure(config):
    if _server is None or _server.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(_server.pid, sig)
            _server.wait(wait)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


@pytest.fixture(scope="session")
def _shared_prefect_server_is_up():
    """Block until the session's Prefect server answers (once per process, before its first test
    marked ``flow``: the other tests never call Prefect's API — checked by running them against a
    dead API address — so they start while the server does; no-op without a shared server)."""
    api = os.environ.get(_SHARED_SERVER_ENV)
    if not api or os.environ.get("PREFECT_API_URL") != api:
        yield
        return
    why = wait_for_api(api, _server, 180)
    if why is not None:
        pytest.fail(f"the session's Prefect server at {api} {why} (its log is in {_prefect_home})")
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    # the flows run in this process send no heartbeats, as on `dprelease run`'s temporary API
    # (flows.local_api): the session's server ends with it, and each flow run would wait up to a
    # second for Prefect's heartbeat thread at its end
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = Path(os.environ.get("DPRELEASE_DATA", PROJECT_ROOT.parent / "shared" / "data")).resolve()
ACS2018 = DATA_ROOT / "acs2018_1yr"
ACS2013_DE = DATA_ROOT / "acs2013_1yr_de"


@pytest.fixture(scope="session")
def _session_dask_cluster():
    """One Dask ``LocalCluster`` per test process for the end-to-end tests (marked ``flow``),
    the one a run would start (``flows.release.dask_scheduler``), whose address the runs read from ``DASK_SCHEDULER_ADDRESS`` (in-process
    ones through ``dask.config``, subprocesses through the environment). A run's own LocalCluster
    costs it the cluster's start and every worker's imports; the tests of the
    default path (``test_release_end_to_end``, the resume test's first run) drop the address and
    start their own. ``DPRELEASE_TEST_SHARED_DASK=0`` turns it off."""
    if os.environ.get("DPRELEASE_TEST_SHARED_DASK") == "0" or os.environ.get("DASK_SCHEDULER_ADDRESS"):
        yield None
        return
    import dask

    from flows.release import dask_scheduler

    with dask_scheduler(None) as address:  # the run's own LocalCluster, started once
        os.environ["DASK_SCHEDULER_ADDRESS"] = address
        try:
            with dask.config.set({"scheduler-address": address}):
                yield address
        finally:
            os.environ.pop("DASK_SCHEDULER_ADDRESS", None)


@pytest.fixture(autouse=True)
def _flow_tests_share_prefect_and_dask(request):
    if request.node.get_closest_marker("flow"):
        request.getfixturevalue("_shared_prefect_server_is_up")
        request.getfixturevalue("_session_dask_cluster")


@pytest.fixture
def own_local_cluster(monkeypatch):
    """For a test of the default path: the run starts its own LocalCluster."""
    import dask

    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with dask.config.set({"scheduler-address": None}):
        yield


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not ACS2018.exists():
        pytest.fail(f"the shared ACS data is missing at {DATA_ROOT} (set DPRELEASE_DATA)")
    return DATA_ROOT


@pytest.fixture(scope="session")
def domain_spec():
    from schemas.domain_spec import load_domain_spec

    return load_domain_spec()


@pytest.fixture(scope="session")
def vermont(data_root, domain_spec):
    """Vermont 2018 (the smallest state), encoded with the default household rules."""
    from schemas.ingestion import HouseholdRules, load_person_file

    return load_person_file(ACS2018 / "csv_pvt.zip", domain_spec, HouseholdRules())


def encode_inputs(cfg, directory: Path) -> dict[str, str]:
    """The config's first private and first public input, read and encoded as a run's ingest
    would, saved as ``private.npz`` / ``public.npz`` in ``directory``: {role: path}."""
    from tasks.ingest import load_input
    from tasks.run_context import save_npz_atomic

    out = {}
    for role, spec in (("private", cfg.private[0]), ("public", cfg.public[0])):
        data, _ = load_input(cfg, spec, role)
        out[role] = str(directory / f"{role}.npz")
        save_npz_atomic(directory / f"{role}.npz", data.to_npz)
    return out
