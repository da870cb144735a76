"""Shared test set-up: Prefect offline in a temporary home, real data location."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Prefect settings must be in place before prefect is imported anywhere. Under pytest-xdist each
# worker process gets its own Prefect home (its own SQLite database and ephemeral server) below
# the run's, so parallel end-to-end tests never share one database.
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

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = Path(os.environ.get("DPRELEASE_DATA", PROJECT_ROOT.parent / "shared" / "data")).resolve()
ACS2018 = DATA_ROOT / "acs2018_1yr"
ACS2013_DE = DATA_ROOT / "acs2013_1yr_de"


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
        data, _ = load_input(cfg, spec)
        out[role] = str(directory / f"{role}.npz")
        save_npz_atomic(directory / f"{role}.npz", data.to_npz)
    return out


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` as module ``name`` (the benchmarks folder is not a package;
    it goes on sys.path so that a benchmark's own imports of its siblings resolve)."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
